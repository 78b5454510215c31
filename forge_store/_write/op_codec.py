"""An operation <-> its journal bytes (msgpack).

An operation is a dict ``{"k": kind, "r": row, ...}`` (see ``db_apply``); a journal record's payload is exactly
``pack_op(op)``. Datetimes go in as msgpack timestamps and come back as timezone-aware datetimes. The format is the
journal's: changing it means old journals no longer replay.
"""

from __future__ import annotations

import msgpack

from .._errors import InvalidRecord


def pack_op(op: dict) -> bytes:
    """The journal's bytes for ``op``; InvalidRecord for what neither the journal nor a database can hold."""
    try:
        return msgpack.packb(op, datetime=True, use_bin_type=True)
    except UnicodeEncodeError as exc:  # a lone surrogate ("\\ud800"): a Python string may hold one, UTF-8 cannot
        bad, around = exc.object[exc.start:exc.end], exc.object[max(0, exc.start - 20):exc.start + 20]
        raise InvalidRecord(f"{op.get('k')} record holds text that is not valid Unicode ({bad!r} in {around!r}); "
                            "replace it, e.g. with text.encode('utf-8', 'replace').decode()") from None
    except TypeError as exc:  # a value JSON and the journal have no form for (a set, an object)
        raise InvalidRecord(f"{op.get('k')} record holds a value the store cannot keep ({exc}); "
                            "use JSON types") from None


def unpack_op(payload: bytes) -> dict:
    """The operation a journal record holds (the inverse of ``pack_op``)."""
    return msgpack.unpackb(payload, timestamp=3, raw=False, strict_map_key=False)
