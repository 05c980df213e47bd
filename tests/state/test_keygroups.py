"""Key groups: process independence, canonical decoding, Flink's range formulas."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncio_ops.state import (
    CorruptStateError,
    KeyGroupRange,
    assign_to_key_group,
    canonical_bytes,
    compute_key_group_range_for_operator_index,
    compute_operator_index_for_key_group,
    decode_canonical,
)
from asyncio_ops.state._keycodec import encoded_key_group

_SCRIPT = """
import datetime as dt, json, sys
from decimal import Decimal
from asyncio_ops.state import assign_to_key_group
keys = ["alice", "bob", "", "ü", 0, -1, 2**63, 1.5, None, b"raw", (1, "a", (None,)),
        dt.date(2024, 1, 2), dt.datetime(2024, 1, 2, 3, 4, 5), Decimal("0.1")]
keys += [f"user-{i}" for i in range(500)] + [(i, str(i)) for i in range(200)]
print(json.dumps([assign_to_key_group(k, 128) for k in keys] + [hash("alice")]))
"""


def test_key_groups_agree_across_processes_with_different_hash_seeds() -> None:
    runs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, check=True
        )
        runs.append(json.loads(out.stdout))
    *groups_1, hash_1 = runs[0]
    *groups_2, hash_2 = runs[1]
    assert hash_1 != hash_2  # the seeds really differ: Python's hash() would disagree
    assert groups_1 == groups_2
    assert len(set(groups_1)) > 64  # and keys spread over the groups


keys = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False),
        st.text(),
        st.binary(),
        st.dates(),
        st.datetimes(),
        # an aware datetime in a DST gap or fold never equals another zone's datetime in
        # Python (PEP 495), not even its own instant in UTC, which is what it encodes as
        st.datetimes(timezones=st.timezones()).filter(lambda d: d == d.astimezone(dt.UTC)),
        st.decimals(allow_nan=False, allow_infinity=False),
    ),
    lambda inner: st.lists(inner, max_size=4).map(tuple),
    max_leaves=8,
)


@given(keys)
def test_decode_inverts_canonical_bytes(key: Any) -> None:
    enc = canonical_bytes(key)
    back = decode_canonical(enc)
    assert back == key
    assert canonical_bytes(back) == enc


@given(keys, st.sampled_from([1, 7, 128, 32768]))
def test_encoded_key_group_equals_assign_to_key_group(key: Any, maxp: int) -> None:
    assert encoded_key_group(canonical_bytes(key), maxp) == assign_to_key_group(key, maxp)


def test_equal_keys_share_a_group() -> None:
    utc = dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC)
    cet = utc.astimezone(dt.timezone(dt.timedelta(hours=1)))
    assert utc == cet
    assert canonical_bytes(utc) == canonical_bytes(cet)
    for a, b in [(1, True), (1, 1.0), (1, Decimal(1)), (0.5, Decimal("0.5"))]:
        assert a == b and canonical_bytes(a) == canonical_bytes(b)


def test_decode_rejects_garbage() -> None:
    for bad in (b"", b"z", b"i\x00", b"n\x00", b"t\x02\x00\x00\x00"):
        with pytest.raises(CorruptStateError):
            decode_canonical(bad)


@pytest.mark.parametrize("maxp", [1, 7, 128, 1000])
@pytest.mark.parametrize("p", [1, 2, 3, 7])
def test_ranges_partition_the_key_groups(maxp: int, p: int) -> None:
    if p > maxp:
        return
    ranges = [compute_key_group_range_for_operator_index(maxp, p, i) for i in range(p)]
    assert [kg for r in ranges for kg in r] == list(range(maxp))
    for i, r in enumerate(ranges):
        assert all(compute_operator_index_for_key_group(maxp, p, kg) == i for kg in r)
    assert isinstance(ranges[0], KeyGroupRange)
