"""Arrow columns from Python values, built from buffers.

``pa.array`` over Python objects costs about a microsecond a value and, on its first call in a process, imports
pandas (pyarrow asks whether the values are a pandas object; with pandas installed that import took 0.4-0.9 s here,
a fifth of a 100,000-call export). A shard's columns are few types: strings, numbers, lists of them, structs of
them, and :class:`learner._reconstruct.Packed` token arrays. :func:`column` builds those from buffers (offsets,
one values buffer, a validity bitmap) and gives anything else to ``pa.array``; the arrays are equal either way
(tests/test_export_batched.py pins the shards' bytes), so the Parquet files are the same bytes.
"""

from __future__ import annotations

import operator
import sys
from array import array
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._export_config import ExportError
from ._reconstruct import Packed

_NUMBERS = {pa.int8(): "b", pa.int32(): "i", pa.int64(): "q", pa.float32(): "f", pa.float64(): "d"}
_PACKED = {"I": (pa.int32(), pa.uint32()), "b": (pa.int8(),), "f": (pa.float32(),)}
_LITTLE = sys.byteorder == "little"


class TokenIdTooLarge(ValueError):
    """A token id of 2**31 or more for an int32 column (the message names the column's values, not its name)."""


def column(values: list, t: pa.DataType) -> pa.Array:
    """``pa.array(values, type=t)``, from buffers where ``t`` is a string, a number, a list or a struct of those."""
    if _LITTLE:
        if pa.types.is_string(t) or pa.types.is_binary(t):
            return _strings(values, t)
        if t in _NUMBERS:
            return _numbers(values, t)
        if pa.types.is_list(t):
            return _list(values, t)
        if pa.types.is_struct(t):
            return _struct(values, t)
    return pa.array(values, type=t)


def _nulls(values: list) -> int:
    """How many of ``values`` are None (by identity: a value's own ``__eq__`` is never asked)."""
    return sum(map(operator.is_, values, repeat(None)))


def _present(values: list) -> tuple[np.ndarray | None, int]:
    """Which of ``values`` are not None (a bool array; None when all are) and how many are None."""
    nulls = _nulls(values)
    if not nulls:
        return None, 0
    return np.fromiter((v is not None for v in values), dtype=bool, count=len(values)), nulls


def _bitmap(mask: np.ndarray | None) -> pa.Buffer | None:
    return None if mask is None else pa.py_buffer(np.packbits(mask, bitorder="little").tobytes())


def _validity(values: list) -> tuple[pa.Buffer | None, int]:
    """The validity bitmap of ``values`` (None when none is None) and how many are None."""
    mask, nulls = _present(values)
    return _bitmap(mask), nulls


def _strings(values: list, t: pa.DataType) -> pa.Array:
    """A string (or binary) column: one encode of the whole column where it is ASCII (then a character is a byte
    and the offsets are the strings' lengths), one encode per value otherwise."""
    kind = str if pa.types.is_string(t) else bytes
    mask, nulls = _present(values)
    present = [v for v in values if v is not None] if nulls else values
    if not set(map(type, present)) <= {kind}:  # a subclass, or not a string at all: pyarrow's own way
        return pa.array(values, type=t)
    if kind is str:
        joined = "".join(present)
        if joined.isascii():
            raw = joined.encode("ascii")
        else:
            present = [v.encode() for v in present]
            raw = b"".join(present)
    else:
        raw = b"".join(present)
    if len(raw) >= 2**31:
        return pa.array(values, type=t)
    lengths = np.fromiter(map(len, present), dtype=np.int64, count=len(present))
    if mask is not None:  # a null's length is 0
        spread = np.zeros(len(values), dtype=np.int64)
        spread[mask] = lengths
        lengths = spread
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:], dtype=np.int32)
    return pa.Array.from_buffers(t, len(values), [_bitmap(mask), pa.py_buffer(offsets), pa.py_buffer(raw)],
                                 null_count=nulls)


def _numbers(values: list, t: pa.DataType) -> pa.Array:
    code = _NUMBERS[t]
    kinds = {float, int} if code in "fd" else {int}  # exactly these: a bool or a numpy scalar goes to pyarrow
    if not set(map(type, values)) <= kinds | {type(None)}:
        return pa.array(values, type=t)
    validity, nulls = _validity(values)
    try:
        data = array(code, [0 if v is None else v for v in values] if nulls else values)
    except OverflowError:
        return pa.array(values, type=t)  # pyarrow's own error for a value out of range
    return pa.Array.from_buffers(t, len(values), [validity, pa.py_buffer(data)], null_count=nulls)


def _list(values: list, t: pa.DataType) -> pa.Array:
    vt = t.value_type
    if any(isinstance(v, Packed) for v in values):
        return _packed(values, t)
    if any(v is not None and not isinstance(v, list) for v in values):
        return pa.array(values, type=t)
    offsets = array("i", [0])
    flat: list = []
    for v in values:
        if v is not None:
            flat += v
        offsets.append(len(flat))
    validity, nulls = _validity(values)
    items = column(flat, vt)
    return pa.Array.from_buffers(t, len(values), [validity, pa.py_buffer(offsets)], null_count=nulls,
                                     children=[items])


def _packed(values: list, t: pa.DataType) -> pa.Array:
    """A list column from :class:`Packed` values (None: a null list) in one values buffer."""
    vt = t.value_type
    codes = {v.code for v in values if v is not None}
    if len(codes) != 1 or vt not in _PACKED[next(iter(codes))] or not all(v is None or isinstance(v, Packed)
                                                                          for v in values):
        return pa.array([v.tolist() if isinstance(v, Packed) else v for v in values], type=t)  # mixed: slow way
    raw = b"".join([v.raw for v in values if v is not None])
    items = pa.Array.from_buffers(vt, len(raw) * 8 // vt.bit_width, [None, pa.py_buffer(raw)])
    if vt == pa.int32() and raw and pc.max(items.view(pa.uint32())).as_py() >= 2**31:
        raise TokenIdTooLarge("a token id is 2**31 or more")
    width = vt.bit_width // 8
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(np.fromiter((0 if v is None else len(v.raw) // width for v in values), dtype=np.int64,
                          count=len(values)), out=offsets[1:], dtype=np.int32)
    validity, nulls = _validity(values)
    return pa.Array.from_buffers(t, len(values), [validity, pa.py_buffer(offsets)], null_count=nulls,
                                     children=[items])


def _struct(values: list, t: pa.StructType) -> pa.Array:
    if any(v is not None and not isinstance(v, dict) for v in values):
        return pa.array(values, type=t)
    names = {t.field(i).name for i in range(t.num_fields)}
    if any(v is not None and not v.keys() <= names for v in values):
        return pa.array(values, type=t)  # pyarrow's own handling of a key the type lacks
    children = [column([None if v is None else v.get(t.field(i).name) for v in values], t.field(i).type)
                for i in range(t.num_fields)]
    validity, nulls = _validity(values)
    return pa.Array.from_buffers(t, len(values), [validity], null_count=nulls, children=children)


def table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """``rows`` as a table of ``schema`` (``pa.Table.from_pylist(rows, schema=schema)``, column by column).
    :class:`TokenIdTooLarge` names the column."""
    columns = []
    for f in schema:
        try:
            columns.append(column([r.get(f.name) for r in rows], f.type))
        except TokenIdTooLarge as exc:
            raise TokenIdTooLarge(f"column {f.name}: {exc}") from None
    return pa.Table.from_arrays(columns, schema=schema)


def shard_table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """:func:`table` for a shard: a token id an int32 column cannot hold is an ``ExportError``."""
    try:
        return table(rows, schema)
    except TokenIdTooLarge as exc:
        raise ExportError(f"{exc}, which the format's int32 column cannot hold; this tokenizer's ids need an "
                          "int64 schema") from None
