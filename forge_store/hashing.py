"""Canonical JSON and sha256 content addresses.

Canonical JSON: keys sorted, no insignificant whitespace, UTF-8, non-ASCII kept as is, and no NaN/Infinity
(they are not JSON). Two structurally equal JSON values always produce the same bytes, so their hashes are equal.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """The canonical byte form of a JSON value (raises ValueError for NaN/Infinity or non-JSON types)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def json_sha256(value: Any) -> str:
    """sha256 of the canonical JSON of ``value``: the content address of messages, tool schemas and requests."""
    return sha256_hex(canonical_json(value))
