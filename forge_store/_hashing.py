"""Canonical JSON and sha256 content addresses.

Canonical JSON: object keys sorted, no insignificant whitespace, UTF-8 with non-ASCII kept as is (orjson with
sorted keys). Two structurally equal JSON values always produce the same bytes, so their hashes are equal. NaN
and Infinity are not JSON and are refused; so are integers outside 64 bits.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import orjson


def canonical_json(value: Any) -> bytes:
    """The canonical byte form of a JSON value (ValueError for NaN/Infinity or non-JSON values)."""
    try:
        out = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError as exc:
        raise ValueError(f"not canonical JSON: {exc}") from None
    if b"null" in out and _has_non_finite(value):  # orjson writes NaN/Infinity as null; JSON has neither
        raise ValueError("NaN and Infinity are not JSON: replace them before storing")
    return out


def _has_non_finite(value: Any) -> bool:
    """Whether ``value`` holds a NaN or an infinity. A loop over a stack, strings passed first: a call's request
    hash is made from its messages' hashes (one string per message) and ``null`` tools, so every call of a long
    rollout walks here; the recursive form (a generator per container, three ``isinstance`` per string) took 18 us
    at 100 messages, this 5 us (1.8 and 1.2 us at one)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is str:
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return False


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def json_sha256(value: Any) -> str:
    """sha256 of the canonical JSON of ``value``: the content address of messages, tool schemas and requests."""
    return sha256_hex(canonical_json(value))
