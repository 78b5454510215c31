"""Compact binary token arrays and prompt deltas (invariant 3).

Token ids are packed as little-endian uint32, logprobs as little-endian float32, each behind a one-byte tag so
the format can grow: ``b"I"`` raw uint32, ``b"Z"`` zlib-compressed uint32 (used when it saves a quarter or more),
``b"f"`` raw float32. A prompt is stored as (prefix length taken from a base sequence, tail), where the base is
the previous call's prompt + completion ids: an agent's prompt usually extends the previous turn verbatim, so a
50-turn rollout stores each token once.
"""

from __future__ import annotations

import sys
import zlib
from array import array

import orjson

from ._errors import InvalidRecord

_BIG_ENDIAN = sys.byteorder == "big"


def _u32(ids) -> array:
    if isinstance(ids, array) and ids.typecode == "I":
        return ids
    try:
        return array("I", ids)
    except OverflowError as exc:
        raise InvalidRecord(f"token id out of range in {list(ids)[:8]}...: ids must be 0 <= id < 2**32") from exc


def ids_to_bytes(ids) -> bytes:
    """Raw little-endian uint32 bytes (the form deltas are computed on)."""
    arr = _u32(ids)
    if _BIG_ENDIAN:
        arr = array("I", arr)
        arr.byteswap()
    return arr.tobytes()


def bytes_to_ids(raw: bytes) -> list[int]:
    arr = array("I")
    arr.frombytes(raw)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tolist()


def pack_ids(ids, *, compress: bool = True) -> bytes:
    """Tagged uint32 ids; ``compress=False`` leaves them raw for :func:`compress_packed` to do later (the proxy's
    event loop journals raw arrays and the store's writer compresses them on the way into the database)."""
    raw = ids if isinstance(ids, (bytes, bytearray, memoryview)) else ids_to_bytes(ids)
    packed = b"I" + raw
    return compress_packed(packed) if compress else packed


class IdsText:
    """Token ids as the text an engine's JSON carried them in (``b"1,2,3"``: decimal, comma-separated).

    The proxy cuts a prompt's ids out of an answer as text instead of parsing them into Python ints (for 2,000
    ids that was most of the answer's parse, and the ints' conversion to uint32 came on top), finds the prefix it
    shares with the previous call on the text, and journals the tail as text (tag ``b"T"``); the store's writer
    checks and packs it to uint32 on the way into the database (:func:`compress_packed`). ``len()`` is the number
    of ids, counted when first asked (the encoder counts only the tail it stores)."""

    __slots__ = ("text", "_n")

    def __init__(self, text: bytes):
        self.text, self._n = bytes(text), None

    @classmethod
    def parse(cls, text: bytes) -> IdsText | None:
        """``text`` as ids, or None (the caller parses the JSON the slow way) where it holds anything but digits
        and commas: a sign, a fraction, a space, a string, a nested list. Inside an answer that is JSON, digits
        and commas are a flat list of non-negative integers; that each is below 2**32 is checked by the writer
        (an id past it, which no tokenizer has, costs its call a dead letter)."""
        if text.translate(None, b"0123456789,") or text[:1] == b"," or text[-1:] == b",":
            return None
        return cls(text)

    @property
    def n(self) -> int:
        if self._n is None:
            self._n = self.text.count(b",") + 1 if self.text else 0
        return self._n

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return bool(self.text)

    def tolist(self) -> list[int]:
        return bytes_to_ids(text_to_raw(self.text))

    def __iter__(self):
        return iter(self.tolist())

    def __eq__(self, other) -> bool:
        if isinstance(other, IdsText):
            return self.text == other.text
        return isinstance(other, list) and self.tolist() == other

    __hash__ = None

    def __repr__(self) -> str:
        return f"IdsText({self.n} ids)"


def text_to_raw(text: bytes) -> bytes:
    """uint32 LE bytes of id text (``IdsText.text``); InvalidRecord for anything but decimal ids below 2**32."""
    if text.translate(None, b"0123456789,"):
        raise InvalidRecord(f"token id text {text[:60]!r}... holds something other than decimal ids; the upstream "
                            "sent prompt_token_ids that are not a list of non-negative integers")
    try:
        return ids_to_bytes(orjson.loads(b"[" + text + b"]") if text else [])
    except ValueError as exc:
        raise InvalidRecord(f"token id text {text[:60]!r}... is not comma-separated decimal ids ({exc})") from None


def common_prefix_text(a: bytes, b: bytes, n_a: int | None = None) -> tuple[int, int]:
    """Ids that the id texts ``a`` and ``b`` begin with alike, and the byte offset where ``b``'s next id starts.

    Equal text means equal ids (the converse need not hold: a differently spelled id only shortens the prefix).
    With ``n_a`` (ids in ``a``), what ``a`` has past the prefix is counted instead when that is shorter: an agent's
    prompt extends the previous one, so the count costs O(new text), not O(prompt)."""
    k = common_prefix_items(a, b, 1)
    if k and (k == len(b) or b[k] == 44) and (k == len(a) or a[k] == 44):  # 44: "," (the id ending at k is whole)
        cut = k + 1 if k < len(b) else k
    else:
        cut = b.rfind(b",", 0, k) + 1  # 0 when no id is whole
    if not cut:
        return 0, 0
    if n_a is not None and len(a) - cut < cut:
        rest = a[cut + 1:] if a[cut:cut + 1] == b"," else a[cut:]  # a's ids past the prefix
        return n_a - (rest.count(b",") + 1 if rest else 0), cut
    return b.count(b",", 0, cut) + (b[cut - 1] != 44), cut


def compress_packed(blob: bytes | None) -> bytes | None:
    """``blob`` (from :func:`pack_ids`, or ``b"T"`` + id text) packed as uint32 and zlib-compressed where that saves
    a quarter or more."""
    if blob is not None and blob[:1] == b"T":
        blob = b"I" + text_to_raw(bytes(blob[1:]))
    if blob is None or blob[:1] != b"I" or len(blob) < 257:
        return blob
    packed = zlib.compress(memoryview(blob)[1:], 1)
    return b"Z" + packed if len(packed) <= (len(blob) - 1) * 3 // 4 else blob


def unpack_ids_raw(blob: bytes) -> bytes:
    tag, body = blob[:1], blob[1:]
    if tag == b"I":
        return body
    if tag == b"Z":
        return zlib.decompress(body)
    raise InvalidRecord(f"token array tag {tag!r} unknown: expected b'I' or b'Z' (written by a newer OpenForge?)")


def unpack_ids(blob: bytes | None) -> list[int] | None:
    return None if blob is None else bytes_to_ids(unpack_ids_raw(blob))


def pack_logprobs(values) -> bytes:
    arr = array("f", values)
    if _BIG_ENDIAN:
        arr.byteswap()
    return b"f" + arr.tobytes()


def unpack_logprobs(blob: bytes | None) -> list[float] | None:
    if blob is None:
        return None
    if blob[:1] != b"f":
        raise InvalidRecord(f"logprob array tag {blob[:1]!r} unknown: expected b'f'")
    arr = array("f")
    arr.frombytes(blob[1:])
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tolist()


def common_prefix_items(a: bytes, b: bytes, itemsize: int = 4) -> int:
    """Number of leading ``itemsize``-byte items that ``a`` and ``b`` share.

    The usual case, one extending the other (an agent's prompt extends the previous call's), is one memcmp with no
    copy (``startswith``). Otherwise the slice holding the first difference is found by comparing slices (a memcmp
    each: comparing memoryviews unpacks item by item, 20x slower) of growing size from the start, and the byte
    within it from the XOR of the two slices read as big-endian integers (its bit length says how many bytes from
    the slice's end the first difference is): O(shared prefix) bytes copied and a handful of C calls."""
    a, b = bytes(a), bytes(b)  # no copy for bytes
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    if long_.startswith(short):
        return len(short) // itemsize
    lo, step = 0, 256
    while True:  # a difference lies before len(short): the loop ends
        hi = min(len(short), lo + step)
        if a[lo:hi] != b[lo:hi]:
            break
        lo, step = hi, step * 4
    x = int.from_bytes(a[lo:hi], "big") ^ int.from_bytes(b[lo:hi], "big")  # invariant: a[:lo] == b[:lo]
    return (hi - (x.bit_length() + 7) // 8) // itemsize
