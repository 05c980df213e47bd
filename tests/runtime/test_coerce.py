"""The conversions of a result value Arrow refuses for its declared type: Decimal into
double/float rounded once, UUID into its text, element by element inside lists and
structs; the per-row (one value) and columnar (an Arrow array) forms agree."""

from __future__ import annotations

import uuid
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncio_ops._runtime._coerce import coerced, coerced_array, decimals_as_floats

decimals = st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
    lambda d: abs(d.as_tuple().exponent) < 60 and len(d.as_tuple().digits) <= 38  # type: ignore[arg-type]
)


def _nearest_float32(d: Decimal) -> float:
    """The float32 nearest to ``d`` (ties to even), computed exactly with fractions."""
    exact = Fraction(d)
    guess = np.float32(float(d))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess,
                  np.nextafter(guess, np.float32(np.inf))]  # fmt: skip
    finite = [c for c in candidates if np.isfinite(c)]
    best = min(finite, key=lambda c: (abs(Fraction(float(c)) - exact),
                                       int(c.view(np.uint32)) & 1))  # fmt: skip
    return float(best)


@settings(max_examples=300, deadline=None)
@given(decimals)
def test_a_decimal_becomes_the_nearest_double_on_both_paths(d: Decimal) -> None:
    one = coerced(d, pa.float64())
    column = decimals_as_floats(pa.array([d]), pa.float64())[0].as_py()
    assert one == column == float(d)


@settings(max_examples=300, deadline=None)
@given(decimals.filter(lambda d: abs(d) < Decimal("3e38")))
def test_a_decimal_becomes_the_nearest_float_rounded_once(d: Decimal) -> None:
    one = coerced(d, pa.float32())
    column = decimals_as_floats(pa.array([d]), pa.float32())[0].as_py()
    assert one == column == _nearest_float32(d)


def test_a_uuid_becomes_its_text_and_nested_values_convert() -> None:
    u = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert coerced(u, pa.string()) == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert coerced([Decimal("0.1"), None], pa.list_(pa.float64())) == [0.1, None]
    struct = pa.struct([("price", pa.float64()), ("id", pa.string())])
    assert coerced({"price": Decimal("2.84"), "id": u}, struct) == {"price": 2.84, "id": str(u)}


def test_values_no_conversion_applies_to_are_left_to_fail() -> None:
    row = {"n": 1}
    assert coerced(row, pa.struct([("n", pa.int64())])) is row  # unchanged: same object
    assert coerced_array([1.7], pa.int64()) is None  # never truncated
    assert coerced_array(["2.84"], pa.float64()) is None  # a string is not a number
    assert coerced_array([Decimal("2.84"), "x"], pa.float64()) is None  # still unfit
