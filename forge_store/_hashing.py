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
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_non_finite(v) for v in value)
    return False


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def json_sha256(value: Any) -> str:
    """sha256 of the canonical JSON of ``value``: the content address of messages, tool schemas and requests."""
    return sha256_hex(canonical_json(value))
