"""learner._columns builds a shard's Arrow columns from buffers: each must equal what ``pa.array`` builds from the
same Python values (the shards' bytes depend on it), for values hypothesis generates, nulls and non-ASCII text
included, and it must fall back to pyarrow (same result, same error) for values it does not take."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner._columns import TokenIdTooLarge, column
from learner._reconstruct import Packed

_text = st.text(max_size=12)  # any code point but surrogates: ASCII and not
_ints = st.integers(-(2**31), 2**31 - 1)
_floats = st.floats(allow_nan=False, width=32)


def _same(values: list, t: pa.DataType, expected: list | None = None) -> None:
    want = pa.array(values if expected is None else expected, type=t)
    got = column(values, t)
    got.validate(full=True)
    assert got.type == want.type and got.equals(want), (got, want)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.none() | _text, max_size=30))
def test_strings_with_nulls_and_any_text(values):
    _same(values, pa.string())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.none() | st.binary(max_size=10), max_size=30))
def test_binary(values):
    _same(values, pa.binary())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.none() | _ints, max_size=30),
       # ints in a float column as rewards come (0, 1): pyarrow refuses one a float32 cannot hold exactly
       st.lists(st.none() | _floats | st.integers(-(2**24), 2**24), max_size=30))
def test_numbers(ints, floats):
    _same(ints, pa.int64())
    _same(ints, pa.int32())
    _same(floats, pa.float64())
    _same(floats, pa.float32())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.none() | st.lists(st.none() | _text, max_size=5), max_size=20),
       st.lists(st.none() | st.fixed_dictionaries({"a": st.none() | _ints, "b": st.none() | _text}), max_size=20))
def test_lists_and_structs(lists, structs):
    _same(lists, pa.list_(pa.string()))
    _same(structs, pa.struct([("a", pa.int64()), ("b", pa.string())]))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.none() | st.lists(st.integers(0, 2**31 - 1), max_size=8), max_size=20))
def test_packed_token_arrays_are_the_lists_they_hold(lists):
    import array

    packed = [None if v is None else Packed(array.array("I", v).tobytes(), "I") for v in lists]
    _same(packed, pa.list_(pa.int32()), expected=lists)


def test_values_it_does_not_build_go_to_pyarrow_with_its_result_or_its_error():
    class Name(str):
        pass

    _same([Name("a"), "b", None], pa.string())
    with pytest.raises(pa.ArrowTypeError):  # a bool is not an int here: pyarrow decides
        column([True, 1, None], pa.int64())
    with pytest.raises(pa.ArrowInvalid):
        column([1, 2**40], pa.int32())
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        column(["a", 1], pa.string())
    with pytest.raises(TokenIdTooLarge):
        column([Packed(array_of([2**31]), "I")], pa.list_(pa.int32()))


def array_of(ids: list[int]) -> bytes:
    import array

    return array.array("I", ids).tobytes()
