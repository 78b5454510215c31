"""What the scripted upstream answers: a list of steps, consumed in order or matched per request.

A step is one of `Text`, `ToolCalls`, `HTTPError` or `Delay` (which waits, then answers with the
step it wraps). Steps load from plain dicts, so a script can be a JSON or YAML file:

    - {text: "Hello!"}
    - {match: "weather", tool_calls: [{name: get_weather, arguments: {city: Paris}}]}
    - {error: {status: 429, message: "slow down"}}
    - {delay: 2.0, chunk_delay: 0.05, then: {text: "late"}}

Selection per request: first the earliest step whose `match` substring occurs in the request's
last user message (or completion prompt); otherwise the earliest step without `match`. A step
answers `times` requests (default 1; null = forever). When nothing is left the upstream gives its
default answer (an echo of the last user message).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Delay", "HTTPError", "Script", "Step", "Text", "ToolCall", "ToolCalls", "load_script", "step_from_dict"]


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None  # default: a fresh `chatcmpl-tool-...` id, as vLLM makes

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            json.loads(self.arguments)  # a malformed script fails here, not in the client
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Text:
    """An assistant message. `disconnect_after`: a stream drops its connection after that many token
    chunks (non-streaming requests ignore it)."""

    text: str
    match: str | None = None
    times: int | None = 1
    disconnect_after: int | None = None


@dataclass
class ToolCalls:
    """Tool calls (finish_reason "tool_calls"), optionally after some content text."""

    calls: list[ToolCall]
    content: str | None = None
    match: str | None = None
    times: int | None = 1


@dataclass
class HTTPError:
    """An OpenAI-shaped error. With `after_chunks`, a stream sends that many chunks, then an error event."""

    status: int
    message: str = "scripted error"
    type: str | None = None  # default: derived from the status, as vLLM does
    after_chunks: int | None = None
    match: str | None = None
    times: int | None = 1

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type or _ERROR_TYPES.get(self.status, "InternalServerError"),
                "param": None,
                "code": self.status,
            }
        }


@dataclass
class Delay:
    """Wait `seconds` before the first token (and `chunk_delay` between chunks), then answer `then`."""

    seconds: float
    chunk_delay: float = 0.0
    then: Text | ToolCalls | HTTPError | None = None  # None: the default answer
    match: str | None = None
    times: int | None = 1


Step = Text | ToolCalls | HTTPError | Delay

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    408: "RequestTimeoutError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def _tool_call(d: Mapping[str, Any]) -> ToolCall:
    fn = d.get("function", d)  # accept OpenAI's {"function": {...}} shape too
    return ToolCall(name=fn["name"], arguments=fn.get("arguments", {}), id=d.get("id"))


def step_from_dict(d: Mapping[str, Any] | Step) -> Step:
    """One step from its dict form (see the module docstring); steps pass through unchanged."""
    if isinstance(d, (Text, ToolCalls, HTTPError, Delay)):
        return d
    common = {k: d[k] for k in ("match", "times") if k in d}
    if "text" in d:
        return Text(text=d["text"], disconnect_after=d.get("disconnect_after"), **common)
    if "tool_calls" in d:
        return ToolCalls(calls=[_tool_call(c) for c in d["tool_calls"]], content=d.get("content"), **common)
    if "error" in d:
        e = d["error"]
        return HTTPError(
            status=int(e["status"]),
            message=e.get("message", "scripted error"),
            type=e.get("type"),
            after_chunks=e.get("after_chunks"),
            **common,
        )
    if "delay" in d:
        then = d.get("then")
        inner = step_from_dict(then) if then is not None else None
        if isinstance(inner, Delay):
            raise ValueError("a delay step's `then` cannot be another delay; add the seconds together instead.")
        return Delay(seconds=float(d["delay"]), chunk_delay=float(d.get("chunk_delay", 0.0)), then=inner, **common)
    raise ValueError(
        f"script step {dict(d)!r} has none of the keys text, tool_calls, error, delay; "
        "write e.g. {'text': 'Hello'} or {'error': {'status': 503}}."
    )


def load_script(path: str | Path) -> list[Step]:
    """Steps from a JSON file (a list, or {"steps": [...]}) or, with PyYAML installed, a YAML file."""
    path = Path(path)
    raw = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ImportError(f"{path} is YAML; install PyYAML or write the script as JSON.") from None
        data = yaml.safe_load(raw)
    else:
        data = json.loads(raw)
    if isinstance(data, dict):
        data = data.get("steps", [])
    return [step_from_dict(d) for d in data]


class Script:
    """Thread-safe queue of steps with per-request matching."""

    def __init__(self, steps: Iterable[Mapping[str, Any] | Step] = ()) -> None:
        self._lock = threading.Lock()
        self._steps: list[list[Any]] = []  # [step, remaining uses or None]
        self.extend(steps)

    def extend(self, steps: Iterable[Mapping[str, Any] | Step]) -> None:
        parsed = [step_from_dict(s) for s in steps]
        with self._lock:
            self._steps.extend([s, s.times] for s in parsed)

    def replace(self, steps: Iterable[Mapping[str, Any] | Step]) -> None:
        parsed = [step_from_dict(s) for s in steps]
        with self._lock:
            self._steps = [[s, s.times] for s in parsed]

    def remaining(self) -> list[Step]:
        with self._lock:
            return [s for s, n in self._steps if n is None or n > 0]

    def next_step(self, request_text: str) -> Step | None:
        """The step for a request whose last user text is `request_text`, or None (default answer)."""
        with self._lock:
            chosen = None
            for entry in self._steps:
                step, left = entry
                if left is not None and left <= 0:
                    continue
                if step.match is not None and step.match in request_text:
                    chosen = entry
                    break
                if step.match is None and chosen is None:
                    chosen = entry
            if chosen is None:
                return None
            if chosen[1] is not None:
                chosen[1] -= 1
            return chosen[0]
