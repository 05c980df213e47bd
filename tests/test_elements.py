from __future__ import annotations

import dataclasses
import pickle

import pytest

from asyncio_ops import Record, Watermark


def test_records_and_watermarks_compare_by_value_and_hash() -> None:
    assert Record(1, 5.0) == Record(1, 5.0)
    assert Record(1) != Record(1, 0.0)
    assert len({Record("a", 1), Record("a", 1), Watermark(3), Watermark(3)}) == 2
    assert Record(1).timestamp is None


def test_elements_are_frozen_and_picklable() -> None:
    r = Record({"id": 1}, 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.value = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Watermark(1).timestamp = 2  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(r)) == r
    assert pickle.loads(pickle.dumps(Watermark(9))) == Watermark(9)


def test_with_value_keeps_the_timestamp() -> None:
    assert Record(1, 42).with_value("x") == Record("x", 42)
