"""The wire protocols the proxy speaks, one line each, and the routes built from them.

``PROTOCOLS`` maps each API surface (the name recorded on its calls) to its protocol class per mode: "translate"
(to upstream chat completions, token-exact) and, where the upstream may speak the API itself, "native" (passed
through, recorded, not token-exact). ``protocols(modes)`` makes one ``Protocols``: the proxy's model-call routes
(``ProxyApp`` answers them by one dict lookup), the side routes the operator app serves, and the error shape of
every path. Nothing here runs per call but ``route`` (a dict lookup, two for ``/r/{token}/...``).

Model-in-path routes (issue 32): Gemini's API names the model in the path (``/v1beta/models/{model}:generateContent``)
and its key may come in the query (``?key=``), so no exact path finds its calls. What that took: a protocol may
declare ``MODEL_PATHS`` (prefixes) and ``at(model, method, query)`` (``proxy._protocols.contract``); ``route`` takes
the query string beside the path (both servers pass it: ``proxy._asgi_app``, ``proxy._http.connection``) and, only
after the exact lookup missed, tries those prefixes in order, splitting the rest at its last ``:`` (a model name may
hold ``/``, as ``org/model`` does); the protocol ``at`` returns serves that one call. The exact paths cost what they
did; ``speaking`` (the error shape of a path) knows the prefixes too, so a 404 or 401 under them is Google-shaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .._errors import ProxyError
from .anthropic_messages import Messages, NativeMessages
from .contract import SideRoute, WireProtocol
from .gemini import Gemini
from .openai_chat import ChatCompletions
from .openai_completions import Completions
from .openai_responses import NativeResponses, Responses

PROTOCOLS: dict[str, dict[str, type[WireProtocol]]] = {
    ChatCompletions.SURFACE: {"translate": ChatCompletions},
    Completions.SURFACE: {"translate": Completions},
    Responses.SURFACE: {"translate": Responses, "native": NativeResponses},
    Messages.SURFACE: {"translate": Messages, "native": NativeMessages},
    Gemini.SURFACE: {"translate": Gemini},
}
SURFACES = tuple(PROTOCOLS)  # the API surfaces the proxy records calls under


class Protocols:
    """The protocols one proxy serves, by client path (each also under ``/r/{token}``)."""

    def __init__(self, served: Iterable[WireProtocol], modes: Mapping[str, str] | None = None):
        self.served = tuple(served)
        self.modes = dict(modes or {})  # surface -> mode, for the surfaces that have a choice
        self.calls: dict[str, WireProtocol] = {}
        self.prefixes: list[tuple[str, WireProtocol]] = []  # MODEL_PATHS: {prefix}{model}:{method}
        for protocol in self.served:
            if not isinstance(protocol, WireProtocol):
                raise TypeError(f"{type(protocol).__name__} does not keep the WireProtocol contract "
                                "(proxy._protocols.contract): subclass WireProtocol")
            for path in protocol.PATHS:
                if path in self.calls:
                    raise ValueError(f"path {path} is claimed by {type(self.calls[path]).__name__} and "
                                     f"{type(protocol).__name__}: give each protocol its own paths")
                self.calls[path] = protocol
            for prefix in protocol.MODEL_PATHS:
                if any(prefix.startswith(p) or p.startswith(prefix) for p, _ in self.prefixes):
                    raise ValueError(f"model paths under {prefix} overlap another protocol's: give each its own")
                self.prefixes.append((prefix, protocol))
        self.side: tuple[tuple[SideRoute, WireProtocol], ...] = tuple(
            (route, protocol) for protocol in self.served for route in protocol.side_routes())
        self._by_path = {**self.calls, **{route.path: protocol for route, protocol in self.side}}

    def route(self, path: str, query: bytes = b"") -> tuple[WireProtocol, str, str | None] | None:
        """(protocol, API path, token from the path or query) for a model call to ``path``; None for any other
        route. ``query``: the request's query string (read only under ``MODEL_PATHS``)."""
        protocol = self.calls.get(path)
        if protocol is not None:
            return protocol, path, None
        token = None
        if path.startswith("/r/"):
            token, _, rest = path[3:].partition("/")
            if not token:
                return None
            path = "/" + rest
            protocol = self.calls.get(path)
            if protocol is not None:
                return protocol, path, token
        for prefix, protocol in self.prefixes:
            if path.startswith(prefix):
                model, colon, method = path[len(prefix):].rpartition(":")
                bound = protocol.at(model, method, query) if colon else None
                return None if bound is None else (bound[0], path, token or bound[1])
        return None

    def speaking(self, path: str) -> WireProtocol | None:
        """The protocol whose API ``path`` belongs to (a model call or a side route), if any."""
        protocol = self._by_path.get(path)
        if protocol is None and path.startswith("/r/"):
            path = "/" + path[3:].partition("/")[2]
            protocol = self._by_path.get(path)
        if protocol is None:
            protocol = next((p for prefix, p in self.prefixes if path.startswith(prefix)  # {model}:{method}
                             and ":" in path[len(prefix):]), None)
        return protocol

    def error_body(self, exc: ProxyError, path: str) -> dict:
        """``exc`` in the error shape of the API ``path`` speaks (OpenAI's where no protocol claims it)."""
        protocol = self.speaking(path)
        return exc.openai_body() if protocol is None else protocol.error_body(exc)


def protocols(modes: Mapping[str, str] | None = None) -> Protocols:
    """Every surface's protocol, in the mode ``modes`` names for it ("translate" where it names none)."""
    modes = dict(modes or {})
    unknown = [s for s in modes if s not in PROTOCOLS]
    if unknown:
        raise ValueError(f"no wire protocol is called {unknown[0]!r}: the proxy speaks {', '.join(SURFACES)}")
    served, chosen = [], {}
    for surface, by_mode in PROTOCOLS.items():
        mode = modes.get(surface, "translate")
        if mode not in by_mode:
            raise ValueError(f"{surface} mode {mode!r} unknown: use one of {', '.join(by_mode)}")
        served.append(by_mode[mode]())
        if len(by_mode) > 1:
            chosen[surface] = mode
    return Protocols(served, chosen)
