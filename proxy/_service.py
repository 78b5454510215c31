"""The proxy's call path: authorize, parse, prepare the stored prompt, forward, capture, journal, answer.

Routes stay thin (``proxy/_operator_api.py``); this class does the work and gets its parts through the constructor. The
one rule that shapes it: a call is journaled before the last byte of its answer reaches the client, so a client
that got a complete answer can rely on the store having it (invariant 1). Non-streaming answers are sent after
the journal write; streams hold back only their terminating event (``[DONE]``, ``response.completed``,
``message_stop``: see ``proxy._protocols.contract.Relay``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import orjson

from forge_store import CallRecord, InvalidRecord, Store
from forge_store._hashing import sha256_hex
from forge_store._schema import Call, string_limits, utcnow

from ._errors import ProxyError, UpstreamFailure
from ._metrics import Metrics
from ._protocols.contract import as_adapter
from ._record import Completion, PreparedPrompt, has_inline_data, loads_answer
from ._redaction import Redactor
from ._registry import Binding, Registry
from ._upstream import Pending, Upstream

log = logging.getLogger("proxy")
JSON = "application/json"
Receive = Callable[[], Awaitable[dict]]


class _CallIds:
    """Call ids: 32 hex digits like ``uuid4().hex``, from a random 64-bit prefix per process and a counter: one
    ``getrandom`` per process (and per fork) instead of a system call and a ``UUID`` object per call."""

    def __init__(self):
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix, self._count = os.urandom(8).hex(), itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._count):016x}"


_call_ids = _CallIds()

FINISH_REASON_MAX = string_limits(Call.__table__)["finish_reason"]

# The CPU to the upstream, once a lone call is on its way (see ``ProxyService.call``); a no-op where there is none.
_sched_yield = getattr(os, "sched_yield", lambda: None)


class ClientGone(Exception):
    """The client disconnected before its request body arrived: there is no one to answer."""


@dataclass(slots=True)
class CallHeaders:
    """The request headers a call needs (ASGI gives a list of lower-cased byte pairs; one pass picks these)."""

    token: str | None = None  # Authorization: Bearer ..., else x-api-key
    content_length: str | None = None
    user_agent: str | None = None

    @classmethod
    def from_asgi(cls, raw: list[tuple[bytes, bytes]]) -> CallHeaders:
        h, api_key = cls(), None
        for name, value in raw:
            if name == b"authorization":
                if value[:7].lower() == b"bearer ":
                    h.token = value[7:].strip().decode("latin-1") or None
            elif name == b"x-api-key":
                api_key = value.decode("latin-1") or None
            elif name == b"content-length":
                h.content_length = value.decode("latin-1")
            elif name == b"user-agent":
                h.user_agent = value.decode("latin-1")
        h.token = h.token or api_key
        return h


@dataclass(slots=True)
class Reply:
    """A whole answer."""

    status: int
    body: bytes
    content_type: str = JSON


class Last(bytes):
    """A stream's final piece (the server may send it together with the end of the transfer)."""


@dataclass(slots=True)
class StreamReply:
    """An SSE answer: ``chunks`` yields the client's bytes; closing it early records what was sent so far."""

    chunks: AsyncIterator[bytes]
    status: int = 200
    content_type: str = "text/event-stream; charset=utf-8"
    abandon: Callable[[], None] | None = None  # frees what ``chunks`` holds if it is dropped before its first step


def too_large(limit: int, declared: int | None = None) -> ProxyError:
    size = f"request body of {declared:,} bytes is" if declared is not None else "request body is"
    return ProxyError(413, f"{size} over the proxy's limit of {limit:,} bytes; raise OPENFORGE_PROXY_MAX_BODY_BYTES "
                           "if this is intended", code="body_too_large")


async def read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """The request body from ASGI ``receive``; 413 past ``limit`` bytes (declared or counted)."""
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(limit, int(declared))
    body, more = b"", True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk, more = message.get("body", b""), message.get("more_body", False)
        if len(body) + len(chunk) > limit:
            raise too_large(limit)
        body = body + chunk if body else chunk
    return body


def parse_json(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProxyError(400, f"request body is not valid JSON ({exc}); send a JSON object",
                         code="invalid_json") from None
    if not isinstance(body, dict):
        raise ProxyError(400, f"request body is JSON {type(body).__name__}, not an object; send a JSON object",
                         code="invalid_json")
    return body


class ProxyService:
    def __init__(self, store: Store, upstream: Upstream, registry: Registry, *, redactor: Redactor,
                 metrics: Metrics, dialect: str = "vllm", max_body_bytes: int = 32 << 20):
        self.store, self.upstream, self.registry = store, upstream, registry
        self.redactor, self.metrics, self.dialect, self.max_body = redactor, metrics, dialect, max_body_bytes
        self._background: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the one loop this service runs in, once known

    async def call(self, headers: CallHeaders, receive: Receive, adapter, token: str | None,
                   raw: bytes | None = None) -> Reply | StreamReply:
        """Serve one model call through ``adapter`` (see ``proxy._protocols.contract`` for the protocol it speaks). ``token``:
        from the path (``/r/{token}/...``), else the headers'. ``raw``: the request body if the server has read it
        (and held it to the body limit), else ``receive`` gives it.

        The request goes upstream as soon as it is translated; what only the stored copy needs (redaction, hashes,
        the record's request side) is done while the upstream works, off the call's critical path.

        Off it only if the upstream really works meanwhile: where the inference server shares the proxy's CPUs (the
        kernel tends to wake a process on the CPU of the one that woke it), that work, ~0.2 ms for an 8 KB prompt,
        would hold the server's start on this request back by as much. So a call with no other in flight yields
        the CPU once its request is written. With others in flight the proxy's own queue comes first. Measured on
        the 2-core machine with ``bench/proxy_overhead.py``'s load, two proxies interleaved against one upstream: at
        one client this took 0.26 ms off the added p50; a yield on every call cut the 64-client throughput ratio
        from 0.61 to 0.55, hence the condition."""
        t0 = time.perf_counter()
        started = utcnow()
        adapter = as_adapter(adapter)
        binding = await self.registry.authorize(token or headers.token)
        if raw is None:
            raw = await read_body(receive, headers.content_length, self.max_body)
        body = parse_json(raw)
        adapter.validate(body)
        tr = adapter.translate(body, self.dialect, binding.rollout_id)
        seq = binding.next_seq()
        prompt, known = None, binding.prompts.unchanged(tr.messages)
        if has_inline_data(tr.messages, known[0]):
            # images go to the blob store off the loop, and an undecodable one is the client's 400: before upstream
            prompt = await asyncio.to_thread(self._prepare, binding, tr.messages, known)
        await self.registry.enter()
        relay_owns_exit = False
        try:
            try:
                pending, failure = await self.upstream.send("POST", adapter.PATH, orjson.dumps(tr.upstream)), None
                if self.registry.in_flight == 1:
                    _sched_yield()
            except UpstreamFailure as exc:
                pending, failure = None, exc
            try:
                prompt = prompt or self._prepare(binding, tr.messages, known)
                rec = self._record_for(headers, adapter, binding, body, tr, prompt, seq, started)
                try:
                    part = self.store.encode_prompt(rec)  # journals the prompt's new bodies
                except Exception as exc:
                    raise self._unrecordable(rec, exc) from exc
            except BaseException:
                if pending is not None:
                    pending.cancel()
                raise
            if failure is not None:
                await self._record_failure(rec, t0, failure)
                raise failure
            if not rec.streamed:
                return await self._unary(adapter, pending, tr.wants, rec, part, t0)
            reply = await self._stream(adapter, pending, tr.wants, rec, part, t0)
            relay_owns_exit = isinstance(reply, StreamReply)
            return reply
        finally:
            if not relay_owns_exit:
                self.registry.leave()

    def _record_for(self, headers: CallHeaders, adapter, binding: Binding, body: dict, tr, prompt: PreparedPrompt,
                    seq: int, started) -> CallRecord:
        request_hash = sha256_hex(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
        call_id = _call_ids.next()
        hits: set[str] = set()
        params = self.redactor.apply(tr.params, hits)  # now, while the upstream works; the answer's parts in _redact
        metadata = self._metadata(headers, prompt.redactions | hits)
        if tr.notes:
            metadata = {**(metadata or {}), **tr.notes}
        return CallRecord(
            id=call_id, rollout_id=binding.rollout_id, seq=seq, api_surface=adapter.SURFACE,
            messages=prompt.messages, tools=tr.tools, params=params, streamed=tr.stream,
            request_hash=request_hash, model=body.get("model"), started_at=started,
            retry_of=binding.retry_of(request_hash, call_id), policy_version_id=self.registry.policy_version,
            image_hashes=prompt.image_hashes or None,
            metadata=metadata,
        )

    def _prepare(self, binding: Binding, messages: list, known: tuple[int, int]) -> PreparedPrompt:
        """The stored copy of the prompt (images to the blob store, redaction); 400 for an undecodable image."""
        try:
            return binding.prompts.prepare(messages, self.store.put_blob, self.redactor, known)
        except InvalidRecord as exc:
            raise ProxyError(400, str(exc), code="invalid_image") from None

    @staticmethod
    def _metadata(headers: CallHeaders, redactions: set[str]) -> dict | None:
        meta = {}
        if headers.user_agent:
            meta["user_agent"] = headers.user_agent
        if redactions:
            meta["redacted"] = sorted(redactions)
        return meta or None

    # ---- one answer -----------------------------------------------------------------------------------------
    async def _unary(self, adapter, pending: Pending, wants, rec: CallRecord, part, t0: float) -> Reply:
        ans = await self._recording_failure(pending.answer(), rec, t0)
        rec.upstream_status = ans.status
        if ans.status != 200:
            return await self._upstream_error(adapter, rec, t0, part, ans.status, ans.body, ans.content_type)
        try:
            ids_as_text = getattr(adapter, "ids_as_text", None)
            data = loads_answer(ans.body, ids_as_text is not None and ids_as_text(wants))
        except orjson.JSONDecodeError:
            exc = UpstreamFailure(502, f"upstream answered 200 with a body that is not JSON: {ans.body[:200]!r}",
                                  "upstream_protocol")
            await self._record_failure(rec, t0, exc)
            raise exc from None
        self._fill(rec, adapter.parse(data))
        await self._record(rec, t0, part)
        reply = Reply(200, orjson.dumps(adapter.answer(data, wants)))
        self._soon(self.metrics.overhead.observe, time.perf_counter() - t0 - ans.waited_s)
        return reply

    async def _upstream_error(self, adapter, rec: CallRecord, t0: float, part, status: int, body: bytes,
                              content_type: str | None) -> Reply:
        """The upstream's own HTTP error: recorded, and passed on in the shape of the client's API."""
        rec.error_class, rec.error_detail = f"upstream_http_{status}", body[:2000].decode(errors="replace")
        await self._record(rec, t0, part)
        body, media_type = adapter.upstream_error(status, body, content_type)
        return Reply(status, body, media_type or JSON)

    # ---- a stream ---------------------------------------------------------------------------------------------
    async def _stream(self, adapter, pending: Pending, wants, rec: CallRecord, part, t0: float) -> Reply | StreamReply:
        stream = await self._recording_failure(pending.stream(), rec, t0)
        rec.upstream_status = stream.status
        if stream.status != 200:
            body = await stream.read_all()
            return await self._upstream_error(adapter, rec, t0, part, stream.status, body, stream.content_type)

        begun = [False]

        def abandon() -> None:  # the relay never ran (the client's connection failed first): its exits, here
            if not begun[0]:
                begun[0] = True
                stream.close()
                self.registry.leave()

        return StreamReply(self._relay(stream, adapter.relay(wants), rec, t0, part, begun), abandon=abandon)

    async def _relay(self, stream, relay, rec: CallRecord, t0: float, part, begun: list[bool]):
        begun[0] = True
        recorded = False
        out: list[bytes] = []  # what the events that arrived together make for the client: one send, not one each
        try:
            try:
                async for events in stream.batches():
                    for event in events:
                        piece = relay.feed(event)
                        if relay.error and rec.error_class is None:
                            rec.error_class, rec.error_detail = relay.error
                        if rec.ttft_ms is None and relay.first_token:
                            rec.ttft_ms = (time.perf_counter() - t0) * 1000
                        if piece:
                            out.append(piece)
                        if relay.done:
                            break
                    if relay.done:  # what came with the upstream's end leaves with ours (below): one write, not two
                        break
                    if out:
                        yield b"".join(out)
                        out.clear()
            except UpstreamFailure as exc:
                rec.error_class, rec.error_detail = exc.error_class, exc.message
                out.append(relay.failure(exc))
            except orjson.JSONDecodeError as exc:  # the upstream broke its own protocol: say so, keep what came
                failure = UpstreamFailure(502, f"upstream sent a stream event that is not JSON ({exc})",
                                          "upstream_protocol")
                rec.error_class, rec.error_detail = failure.error_class, failure.message
                out.append(relay.failure(failure))
            if not relay.done and rec.error_class is None:
                rec.error_class = "upstream_stream_truncated"
            self._fill(rec, relay.result())
            recorded = True
            await self._record(rec, t0, part)  # before the terminal event: a client with a whole answer finds it stored
            if end := relay.end():
                out.append(end)
            yield Last(b"".join(out))
        finally:
            stream.close(complete=relay.done)  # stopped at the upstream's end: its connection stays reusable
            self.registry.leave()
            if not recorded:  # the client went away mid-stream: keep what it was sent
                rec.error_class = rec.error_class or "client_disconnected"
                self._fill(rec, relay.result())
                task = asyncio.get_running_loop().create_task(self._record(rec, t0, part))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    # ---- recording ---------------------------------------------------------------------------------------------
    @staticmethod
    def _fill(rec: CallRecord, comp: Completion) -> None:
        rec.response, rec.response_message = comp.response(), comp.message()
        rec.finish_reason, rec.usage = comp.finish_reason, comp.usage
        if rec.finish_reason is not None and (not isinstance(rec.finish_reason, str)
                                              or len(rec.finish_reason) > FINISH_REASON_MAX):
            # an engine's own word, past what the store's column holds: kept whole in the metadata
            rec.metadata = {**(rec.metadata or {}), "finish_reason": rec.finish_reason}
            rec.finish_reason = str(rec.finish_reason)[:FINISH_REASON_MAX]
        rec.prompt_token_ids, rec.completion_token_ids = comp.prompt_token_ids, comp.completion_token_ids
        rec.completion_logprobs = comp.checked_logprobs()
        rec.token_exact = comp.token_exact and rec.error_class is None

    async def _recording_failure(self, awaitable, rec: CallRecord, t0: float):
        """``await awaitable``; an UpstreamFailure is recorded on ``rec`` before it goes on to the client."""
        try:
            return await awaitable
        except UpstreamFailure as exc:
            await self._record_failure(rec, t0, exc)
            raise

    async def _record_failure(self, rec: CallRecord, t0: float, exc: UpstreamFailure) -> None:
        rec.error_class, rec.error_detail = exc.error_class, exc.message
        await self._record(rec, t0)

    def _unrecordable(self, rec: CallRecord, exc: Exception) -> ProxyError:
        log.error("could not journal call %s", rec.id, exc_info=exc)
        self.metrics.record_failures.inc()
        return ProxyError(503, f"the proxy could not record this call ({exc.__class__.__name__}); the answer is "
                               "withheld so that nothing goes unrecorded; retry", type="server_error",
                          code="record_failed")

    def _redact(self, rec: CallRecord) -> None:
        """Redaction covers everything stored besides the prompt and the parameters (done before the answer came):
        the answer and errors."""
        hits: set[str] = set()
        rec.response = self.redactor.apply(rec.response, hits)
        rec.response_message = self.redactor.apply(rec.response_message, hits)
        rec.error_detail = self.redactor.apply(rec.error_detail, hits)
        if hits:
            rec.metadata = {**(rec.metadata or {})}
            rec.metadata["redacted"] = sorted(set(rec.metadata.get("redacted", [])) | hits)

    async def _record(self, rec: CallRecord, t0: float, part=None) -> None:
        self._redact(rec)
        rec.ended_at = utcnow()
        rec.latency_ms = (time.perf_counter() - t0) * 1000
        t1 = time.perf_counter()
        try:
            await self.store.record_call_async(rec, part)
        except Exception as exc:
            raise self._unrecordable(rec, exc) from exc
        self._soon(self.metrics.observe_call, rec, time.perf_counter() - t1)

    def _soon(self, fn, *args) -> None:
        """``fn(*args)`` once the answer has gone out (the call's loop step writes it; this runs in the next).

        The loop is kept, not looked up per call: in Python 3.11 ``asyncio.get_running_loop()`` is a ``getpid()``
        system call. A service runs in one loop (its registry and upstream pool are bound to it, as asyncio objects
        are); a closed one (a test's previous ``asyncio.run``) is replaced."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        loop.call_soon(fn, *args)
