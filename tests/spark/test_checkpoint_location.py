"""Where checkpoints may live: storage every executor reaches.

A plain path names a directory of whichever machine reads it. Under a master whose
executors run elsewhere it is refused on the driver (each executor would write its
own disk, and the next micro-batch or retry would find no state); an explicit
``file://`` URI is the user's word that the path is a mount every executor has. The
real standalone cluster of ``tests/cluster`` runs both cases.
"""

from __future__ import annotations

import os

import pytest

from asyncio_ops.spark._checkpoint_location import unshared_location


@pytest.mark.parametrize("master", ["local", "local[2]", "local[2, 4]", "local[*]",
                                    "local-cluster[2,1,1024]", None])  # fmt: skip
def test_a_plain_path_is_fine_on_one_machine(master: str | None) -> None:
    assert unshared_location("/tmp/ckpt", master) is None


@pytest.mark.parametrize("master", ["spark://10.0.0.1:7077", "yarn", "k8s://https://api:6443"])
def test_a_plain_path_is_refused_where_executors_run_elsewhere(master: str) -> None:
    problem = unshared_location("relative/ckpt", master)
    assert problem is not None
    assert "'relative/ckpt' is a local path" in problem and repr(master) in problem
    assert f"file://{os.path.abspath('relative/ckpt')}" in problem


@pytest.mark.parametrize(
    "location", ["file:///mnt/shared/ckpt", "s3://bucket/ckpt", "hdfs://nn:8020/ckpt"]
)
def test_a_uri_is_the_users_word_that_every_executor_reaches_it(location: str) -> None:
    assert unshared_location(location, "spark://10.0.0.1:7077") is None
