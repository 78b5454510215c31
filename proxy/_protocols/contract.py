"""The contract every wire protocol keeps: ``WireProtocol``, and what it hands the service (``Translation``,
``Relay``) and the operator app (``SideRoute``).

A wire protocol is one client API. It declares where it is served and what it is called:

- ``PATHS``: its client paths (each also served under ``/r/{token}``), e.g. ``("/v1/messages",)``;
- ``MODEL_PATHS``: for an API that names the model in the path (Gemini's ``/v1beta/models/{model}:{method}``), the
  prefixes before ``{model}:{method}``; ``at(model, method, query)`` then gives the protocol that serves one such
  call (or None: no model call) and the API key its query carries;
- ``SURFACE``: the API surface recorded on each call, e.g. ``"messages"``;
- ``UPSTREAM_PATH``: the upstream path it posts to (``/v1/chat/completions`` when it translates, to stay
  token-exact);
- ``error_body(exc)``: its error shape, a ``ProxyError`` as that API's JSON error (OpenAI's or Anthropic's);
- ``side_routes()``: routes it serves beside its model calls (token counting, a refused websocket).

Per call ``ProxyService`` asks it to:

- ``validate(body)``: raise ``ProxyError`` (400) for a body that API would reject;
- ``translate(body, dialect, rollout_id) -> Translation``: the prompt to store (chat messages), the tools, the
  upstream request, and the protocol's own per-call context (``wants``), which it gets back below;
- ``parse(data) -> Completion``: the upstream's one-piece answer, protocol-neutral, for the record;
- ``answer(data, wants) -> dict``: what the client gets for that answer;
- ``relay(wants) -> Relay``: turns the upstream's stream into the client's, event by event;
- ``upstream_error(status, body, content_type) -> (body, content_type)``: an upstream HTTP error in the client's
  error shape;
- ``recall(body, rollout_id)``: None, or an awaitable the service awaits before ``translate`` (the Responses
  protocol reads a conversation another proxy replica answered from the store);
- ``ids_as_text(wants) -> bool``: True when ``answer`` never gives the client the prompt's token ids, so the
  service may hand them to ``parse`` as ``IdsText`` (cut from the answer as text, not parsed into ints).

A protocol subclasses ``WireProtocol`` (which gives the OpenAI error shape, upstream errors passed on as they came,
no side routes and the prompt's ids parsed) and is listed in ``proxy._protocols.registry``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from .._errors import ProxyError, UpstreamFailure
from .completion import Completion

if TYPE_CHECKING:
    from .._upstream import UpstreamAnswer


@dataclass
class Translation:
    """One request as the service needs it: what to store, what to send upstream, what the protocol keeps."""

    messages: list[dict]  # the prompt as chat messages (stored; images still inline: the store moves them)
    tools: list | None  # the tools as the upstream sees them
    upstream: dict  # the upstream request body
    wants: Any  # the protocol's per-call context, handed back to answer() and relay()
    params: dict  # everything else the client sent (model, sampling, unknown fields): nothing is dropped
    stream: bool
    notes: dict = field(default_factory=dict)  # what could not be forwarded, for the record's metadata


class Relay(Protocol):
    """One streamed answer, upstream SSE events in, client bytes out.

    ``done``: the upstream said the answer is complete; ``error``: (error class, detail) once the upstream reported
    an error. ``end()`` is sent only after the call is journaled (invariant 1): it holds the client's terminal event.
    """

    done: bool
    error: tuple[str, str] | None
    first_token: bool

    def feed(self, event: bytes) -> bytes: ...
    def failure(self, exc: UpstreamFailure) -> bytes: ...
    def result(self) -> Completion: ...
    def end(self) -> bytes: ...


# How a side route asks the engine (``ProxyService.side_post``): ``await send(path, payload, model)`` POSTs ``payload``
# to a replica that serves what a call naming ``model`` is sent for, that name (where the proxy chose it) in
# ``payload["model"]`` (issue 32: replicas may serve models with other tokenizers, and a count must use the right one).
SidePost = Callable[[str, dict, "str | None"], Awaitable["UpstreamAnswer"]]


@dataclass(frozen=True)
class SideRoute:
    """A route a protocol serves beside its model calls, through the operator app (off the hot path), also under
    ``/r/{token}``. ``post``: a JSON request the protocol answers (``await post(send, body, params) -> dict``;
    ``send``: a ``SidePost``; ``params``: the path's parameters, e.g. Gemini's ``{model}``), authorized like a call;
    ``refuse``: the error that GET requests and websocket handshakes on the path get."""

    path: str
    post: Callable[[SidePost, dict, dict], Awaitable[dict]] | None = None
    refuse: Callable[[], ProxyError] | None = None


@runtime_checkable
class WireProtocol(Protocol):
    """One client API (see the module docstring). Subclass it: the defaults below are OpenAI's."""

    PATHS: ClassVar[tuple[str, ...]]
    SURFACE: ClassVar[str]
    UPSTREAM_PATH: ClassVar[str]
    MODEL_PATHS: ClassVar[tuple[str, ...]] = ()

    def validate(self, body: dict) -> None: ...
    def translate(self, body: dict, dialect: str, rollout_id: str | None) -> Translation: ...
    def parse(self, data: dict) -> Completion: ...
    def answer(self, data: dict, wants: Any) -> dict: ...
    def relay(self, wants: Any) -> Relay: ...

    def ids_as_text(self, wants: Any) -> bool:
        return False

    def at(self, model: str, method: str, query: bytes) -> tuple[WireProtocol, str | None] | None:
        """For a protocol with ``MODEL_PATHS``: (the protocol serving a call to ``{prefix}{model}:{method}?{query}``,
        the API key in the query or None); None when ``method`` is no model call of this API."""
        return None

    def recall(self, body: dict, rollout_id: str | None) -> Awaitable[None] | None:
        """What to await before ``translate`` (state kept elsewhere: another proxy replica's Responses memory);
        None, the default, when there is nothing to fetch."""
        return None

    def upstream_error(self, status: int, body: bytes, content_type: str | None) -> tuple[bytes, str | None]:
        return body, content_type

    def error_body(self, exc: ProxyError) -> dict:
        return exc.openai_body()

    def side_routes(self) -> tuple[SideRoute, ...]:
        return ()
