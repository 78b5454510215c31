"""The limits every connection of the proxy's HTTP server is held to (``HttpLimits``, from ``ProxySettings``), and
the refusal a client gets when the server already holds as many connections as it may.

Every sandbox reaches the proxy, so a client may be slow, idle, flooding or broken on purpose. What each limit
bounds, and where ``connection`` enforces it:

- ``head_timeout_s``: a request's line and headers must be whole this long after its first byte (a fresh
  connection's first request: after the connect). A deadline, not an idle timer: a trickle does not extend it.
  Past it: 408, then the connection closes.
- ``body_timeout_s``: the body must be whole this long after the head. Same rule, same answer.
- ``idle_timeout_s``: a kept-alive connection with nothing to answer and no request begun closes after this long.
- ``max_head_bytes``: counted as the head arrives (the parser holds a header being received in memory): 431 as
  soon as it is passed, not after the end of the headers.
- ``max_pipelined``: requests read and waiting behind the one being answered (their bodies held to the body
  limit in all); past it, reading stops (the transport is paused) until they are answered, so memory stays bounded
  whatever a client sends without reading.
- ``write_timeout_s``: a client whose socket stays full this long (it does not read its answer) is cut. The
  server writes nothing more while the socket is full, so output held per connection is one answer plus the
  transport's high-water mark.
- ``max_connections``: past it a new connection gets a short 503 with a JSON error and ``Retry-After``, then
  closes. Never more than half the process's descriptor limit: the other half is for the upstream connections,
  the store and the journal.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from .._errors import ProxyError
from .._settings import ProxySettings
from .status import status_line

log = logging.getLogger("proxy")

RETRY_AFTER_S = 1
WRITE_HIGH_WATER = 64 << 10  # bytes the transport buffers before the writer waits (asyncio's default)
BETWEEN, HEAD, BODY = 0, 1, 2  # where a connection's parser is: between requests, in a request's head, in its body
_LINGER_S = 2.0  # a refused client may still be sending: what it sends is discarded this long, then the close
_MAX_LINGERING = 64  # connections refused over the cap lingering at once; past it they close at once


@dataclass(frozen=True)
class HttpLimits:
    """What a connection may hold and for how long (see the module docstring); defaults are the settings'."""

    head_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    write_timeout_s: float
    max_head_bytes: int
    max_pipelined: int
    max_connections: int

    @classmethod
    def from_settings(cls, settings: ProxySettings | None = None) -> HttpLimits:
        s = settings if settings is not None else ProxySettings()
        return cls(head_timeout_s=s.head_timeout_s, body_timeout_s=s.body_timeout_s,
                   idle_timeout_s=s.idle_timeout_s, write_timeout_s=s.write_timeout_s,
                   max_head_bytes=s.max_head_bytes, max_pipelined=s.max_pipelined,
                   max_connections=s.max_connections)

    def connection_cap(self) -> int:
        """``max_connections``, lowered to half the descriptor limit (said once in the log) where that is less."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or self.max_connections <= soft // 2:
            return self.max_connections
        log.warning("OPENFORGE_PROXY_MAX_CONNECTIONS=%d is over half this process's descriptor limit (%d): the proxy "
                    "accepts at most %d connections; raise the limit (ulimit -n) to accept more",
                    self.max_connections, soft, soft // 2)
        return soft // 2


def head_too_large(size: int, limit: int) -> ProxyError:
    return ProxyError(431, f"request line and headers of {size:,} bytes or more are over the proxy's limit of "
                           f"{limit:,}; send fewer or shorter headers (or raise OPENFORGE_PROXY_MAX_HEAD_BYTES)",
                      code="headers_too_large")


def too_slow(part: str, limit_s: float) -> ProxyError:
    setting = "HEAD" if part == "head" else "BODY"
    return ProxyError(408, f"the request's {part} did not arrive whole within {limit_s:g} s of its start; send it "
                           f"at once (or raise OPENFORGE_PROXY_{setting}_TIMEOUT_S)", code="request_timeout")


def too_many_connections(cap: int) -> ProxyError:
    return ProxyError(503, f"the proxy holds {cap:,} connections, its limit; retry in {RETRY_AFTER_S} s, close idle "
                           "connections, or raise OPENFORGE_PROXY_MAX_CONNECTIONS",
                      type="server_error", code="too_many_connections")


def refusal(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    """A whole answer that closes the connection and asks the client to come back later."""
    return b"%scontent-type: %s\r\ncontent-length: %d\r\nretry-after: %d\r\nconnection: close\r\n\r\n%s" % (
        status_line(status), content_type.encode(), len(body), RETRY_AFTER_S, body)


class Limited:
    """The part of ``connection.ClientConnection`` that holds it to its limits: the read deadline, the pause of reading
    while pipelined requests wait, the write deadline, the refusals that close a connection."""

    def _linger_close(self) -> None:
        """Close once the client has had what was written: half-close now, and discard what it still sends for
        ``_LINGER_S`` (closing with its bytes unread would reset the connection, and the answer could be lost)."""
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self.transport.close)

    def _refuse_connection(self) -> None:
        """Over the connection cap: a short 503 (a JSON error, ``Retry-After``), then the close."""
        self.stop_reading = self.refused = True
        self.server.lingering += 1
        reply = self.app.error_reply(too_many_connections(self.server.max_connections), "/")
        self.transport.write(refusal(reply.status, reply.body, reply.content_type))
        if self.server.lingering > _MAX_LINGERING:  # a flood of them: descriptors matter more than a lost answer
            self.transport.close()
        else:
            self._linger_close()

    def _set_deadline(self) -> None:
        """The read deadline for where the parser is, set anew only when that changed: bytes alone extend nothing."""
        if self.stop_reading or self.paused or self.gone:
            self.timed = None
            self._arm(None)
            return
        key = (self.begun, self.phase)
        if key == self.timed:
            return
        self.timed, limits = key, self.limits
        if self.phase == HEAD:
            if self.deadline_kind != "first":  # a fresh connection's first head stays due from the connect
                self._arm(limits.head_timeout_s, "head")
        elif self.phase == BODY:
            self._arm(limits.body_timeout_s, "body")
        elif self.worker is None and not self.queue:
            self._arm(limits.idle_timeout_s, "idle")
        else:
            self._arm(None)  # answering: the client waits for us

    def _arm(self, seconds: float | None, kind: str | None = None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = None if seconds is None else self.loop.call_later(seconds, self._expired, kind)
        self.deadline_kind = kind

    def _expired(self, kind: str) -> None:
        self.deadline = self.deadline_kind = None
        if self.gone or self.stop_reading:
            return
        if kind == "idle" or self.phase == BETWEEN:  # no request begun: nothing to answer
            self.transport.close()
            return
        head = self.phase == HEAD
        self._refuse_current(too_slow("head" if head else "body", self.limits.head_timeout_s if head
                                      else self.limits.body_timeout_s))

    def _resume(self) -> None:
        """The answers caught up: parse what was read ahead, then read again (unless that filled the queue anew)."""
        self.resume_due = False
        if self.gone or self.stop_reading:
            return
        self.paused = False
        backlog, self.backlog = self.backlog, b""
        if backlog:
            self.data_received(backlog)
        else:
            self._set_deadline()
        if not (self.paused or self.stop_reading):
            self.transport.resume_reading()

    def _write_expired(self) -> None:
        self.write_timer = None
        log.info("a client read nothing of its answer for %g s: disconnected (OPENFORGE_PROXY_WRITE_TIMEOUT_S)",
                 self.limits.write_timeout_s)
        self.transport.abort()
