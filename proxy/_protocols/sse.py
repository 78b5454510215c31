"""Server-sent events as the upstream sends them and as the Responses and Messages APIs name them."""

from __future__ import annotations

import orjson


def sse_data(event: bytes) -> bytes | None:
    """The data payload of one SSE event (joined if it spans lines); None for comments and other fields."""
    if event.startswith(b"data:") and b"\n" not in event:
        return event[5:].strip()
    lines = [ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def sse_event(name: str, data: dict) -> bytes:
    """One named SSE event, as the Responses and Messages APIs send them."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
