"""The proxy's call path: authorize, parse, prepare the stored prompt, hold to the rollout's budget, forward,
capture, journal, answer.

Routes stay thin (``proxy._asgi_app``, ``proxy._operator_api``); this class does the work and gets its parts through
the constructor. The one rule that shapes it: a call is journaled before the last byte of its answer reaches the
client, so a client that got a complete answer can rely on the store having it (invariant 1). Non-streaming answers
are sent after the journal write; streams hold back only their terminating event (``[DONE]``,
``response.completed``, ``message_stop``: see ``proxy._protocols.contract.Relay``).

With several engine replicas (``proxy._upstream.pool``) a call goes to the one its rollout is bound to; a connection
failure before any byte of the answer reached the client (the request could not be sent, the answer's head never
came, or a whole answer broke off before the proxy had it) is recorded as a failed call and the call is sent again
to another replica, recorded as a retry of it (``_routed``); once bytes of a stream reached the client, a break is
that stream's failure event, as with one engine.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from datetime import datetime, timezone

import orjson

from forge_store import FINISH_REASON_MAX, CallRecord, InvalidRecord, PendingPrompt, PromptPart, Store

from ._budgets import BUDGET_EXCEEDED
from ._errors import ProxyError, UpstreamFailure
from ._exchange import JSON, CallHeaders, Last, Receive, Reply, StreamReply, parse_json, read_body
from ._metrics import Metrics
from ._protocols.completion import Completion, loads_answer
from ._protocols.contract import Translation, WireProtocol
from ._redaction import Redactor
from ._rollouts import Binding, RolloutRegistry
from ._upstream import Pending, UpstreamPool

log = logging.getLogger("proxy")


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

# The CPU to the upstream, once a lone call is on its way (see ``ProxyService.call``); a no-op where there is none.
_sched_yield = getattr(os, "sched_yield", lambda: None)


class ProxyService:
    def __init__(self, store: Store, upstream: UpstreamPool, rollouts: RolloutRegistry, *, redactor: Redactor,
                 metrics: Metrics, dialect: str = "vllm", max_body_bytes: int = 32 << 20,
                 replica_id: str | None = None):
        self.store, self.upstream, self.rollouts = store, upstream, rollouts
        self.replica = {"replica": replica_id} if replica_id else {}  # in every call's metadata: who recorded it
        self.redactor, self.metrics, self.dialect, self.max_body = redactor, metrics, dialect, max_body_bytes
        self._redact_copy = redactor.apply if redactor.rules else None  # the stored prompt's ``prepare`` hook
        self._last_tools: tuple[list, list, frozenset[str]] | None = None  # (as sent, as stored, rules that fired)
        self._background: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the one loop this service runs in, once known

    async def call(self, headers: CallHeaders, receive: Receive, protocol: WireProtocol, token: str | None,
                   raw: bytes | None = None) -> Reply | StreamReply:
        """Serve one model call through ``protocol``. ``token``: from the path (``/r/{token}/...``), else the
        headers'. ``raw``: the request body if the server has read it (and held it to the body limit), else
        ``receive`` gives it.

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
        started = datetime.now(timezone.utc)
        binding = await self.rollouts.authorize(token or headers.token)
        if raw is None:
            raw = await read_body(receive, headers.content_length, self.max_body)
        body = parse_json(raw)
        protocol.validate(body)
        if (recall := protocol.recall(body, binding.rollout_id)) is not None:  # what another replica holds
            await recall
        tr = protocol.translate(body, self.dialect, binding.rollout_id)
        seq = binding.next_seq()
        prompt = self.store.prompt(binding.rollout_id, tr.messages, tr.tools, prepare=self._redact_copy)
        tool_hits: set[str] = set()  # redaction rules that fired on the tool schemas (the messages': prompt.marks)
        if prompt.holds_images:
            # images go to the blob store off the loop, and an undecodable one is the client's 400: before upstream
            await asyncio.to_thread(self._prepare, prompt, tool_hits)
        if binding.budget is not None and (over := binding.budget.admit(binding.rollout_id)) is not None:
            rec, part = self._record_for(protocol, binding, body, tr, prompt, seq, started,
                                         self.rollouts.policy_version, tool_hits)
            await self._record_error(rec, t0, part, over, BUDGET_EXCEEDED)  # refused, never sent upstream
            raise over
        version = await self.rollouts.enter()
        relay_owns_exit = False
        try:
            data, rep = orjson.dumps(tr.upstream), self.upstream.pick(binding.rollout_id)
            retry, tried = None, ()
            while True:  # once, or again on another replica after a connection failure (see ``_routed``)
                try:
                    pending, failure = await rep.client.send("POST", protocol.UPSTREAM_PATH, data), None
                    if self.rollouts.in_flight == 1:
                        _sched_yield()
                except UpstreamFailure as exc:
                    pending, failure = None, exc
                try:
                    rec, part = self._record_for(protocol, binding, body, tr, prompt, seq, started, version,
                                                 tool_hits)
                except BaseException:
                    if pending is not None:
                        pending.cancel()
                    raise
                if self.upstream.routing:
                    self._routed(rec, rep.url, retry)
                try:
                    if failure is not None:
                        await self._record_failure(rec, t0, part, failure)
                        raise failure
                    if not rec.streamed:
                        return await self._unary(protocol, pending, tr.wants, rec, part, t0)
                    reply = await self._stream(protocol, pending, tr.wants, rec, part, t0)
                    relay_owns_exit = isinstance(reply, StreamReply)
                    return reply
                except UpstreamFailure as exc:
                    tried = (*tried, rep)
                    nxt = self.upstream.failed(rep, exc, binding.rollout_id, tried)
                    if nxt is None:
                        raise
                    retry, rep = (rec.id, rep.url), nxt
                    seq, started = binding.next_seq(), datetime.now(timezone.utc)
        finally:
            if not relay_owns_exit:
                self.rollouts.leave()

    @staticmethod
    def _routed(rec: CallRecord, url: str, retry: tuple[str, str] | None) -> None:
        """With several replicas, a call records which one answered it (``upstream``). A failover: a connection
        failure before any byte of the answer reached the client was recorded as a failed call; this attempt on
        another replica is a retry of it (``retry_of``, as the data model records a repeated call), naming the
        replica that failed (``failover_from``)."""
        rec.metadata = {**(rec.metadata or {}), "upstream": url}
        if retry is not None:
            rec.retry_of, rec.metadata["failover_from"] = retry

    def _record_for(self, protocol: WireProtocol, binding: Binding, body: dict, tr: Translation,
                    prompt: PendingPrompt, seq: int, started: datetime, version: str | None,
                    hits: set[str]) -> tuple[CallRecord, PromptPart]:
        """The call's record, request side, and its prompt encoded (the new bodies journaled; the request hash).
        ``version``: the policy version current when the call was admitted (``RolloutRegistry.enter``); ``hits``:
        redaction rules that fired so far (on the tool schemas of a prompt prepared in a thread), added to."""
        self._prepare(prompt, hits)
        # now, while the upstream works; the answer's parts in _redact
        params, model = self.redactor.apply(tr.params, hits), self.redactor.apply(body.get("model"), hits)
        notes = self.redactor.apply(tr.notes, hits) if tr.notes else None
        metadata = self._metadata(prompt.marks | hits)
        if notes or self.replica:
            metadata = {**(metadata or {}), **(notes or {}), **self.replica}
        rec = CallRecord(
            id=_call_ids.next(), rollout_id=binding.rollout_id, seq=seq, api_surface=protocol.SURFACE,
            messages=prompt.messages, tools=prompt.tools, params=params, streamed=tr.stream, model=model,
            started_at=started, policy_version_id=version,
            image_hashes=prompt.image_hashes or None, metadata=metadata,
        )
        try:
            part = self.store.encode_prompt(rec, prompt)  # journals the prompt's new bodies
        except Exception as exc:
            raise self._unrecordable(rec, exc) from exc
        rec.retry_of = binding.retry_of(part.request_hash, rec.id)
        return rec, part

    def _prepare(self, prompt: PendingPrompt, hits: set[str]) -> None:
        """The stored copy of the prompt (images to the blob store, redaction of the messages and of the tool
        schemas), once; 400 for an undecodable image. Rules that fired on the tools go into ``hits`` (the
        messages' into ``prompt.marks``)."""
        if prompt.messages is not None:
            return
        if prompt.tools and self._redact_copy is not None:
            prompt.tools = self._redacted_tools(prompt.tools, hits)  # before prepare(): it hashes the stored tools
        try:
            prompt.prepare()
        except InvalidRecord as exc:
            raise ProxyError(400, str(exc), code="invalid_image") from None

    def _redacted_tools(self, tools: list, hits: set[str]) -> list:
        """The tool schemas as stored. A harness sends the same schemas with every call (Claude Code's are ~74 KB):
        the last ones and their stored copy are kept, so a call whose schemas equal them costs a compare."""
        last = self._last_tools
        if last is not None and (tools is last[0] or tools == last[0]):
            hits.update(last[2])
            return last[1]
        found: set[str] = set()
        stored = self.redactor.apply(tools, found)
        self._last_tools = (tools, stored, frozenset(found))
        hits.update(found)
        return stored

    @staticmethod
    def _metadata(redactions: set[str]) -> dict | None:
        """The call's metadata starts from what the proxy found, never from request headers (none is stored):
        ``redacted``, the redaction rules that fired on any stored text of the call (``_redact`` adds the answer's)."""
        return {"redacted": sorted(redactions)} if redactions else None

    # ---- one answer -----------------------------------------------------------------------------------------
    async def _unary(self, protocol: WireProtocol, pending: Pending, wants, rec: CallRecord, part: PromptPart,
                     t0: float) -> Reply:
        ans = await self._recording_failure(pending.answer(), rec, t0, part)
        rec.upstream_status = ans.status
        if ans.status != 200:
            return await self._upstream_error(protocol, rec, t0, part, ans.status, ans.body, ans.content_type)
        try:
            data = loads_answer(ans.body, protocol.ids_as_text(wants))
        except orjson.JSONDecodeError:
            exc = UpstreamFailure(502, f"upstream answered 200 with a body that is not JSON: {ans.body[:200]!r}",
                                  "upstream_protocol")
            await self._record_failure(rec, t0, part, exc)
            raise exc from None
        try:
            self._fill(rec, protocol.parse(data))
            body = orjson.dumps(protocol.answer(data, wants))
        except UpstreamFailure as exc:  # JSON, but not an answer the protocol can read: recorded, then the 502
            await self._record_failure(rec, t0, part, exc)
            raise
        await self._record(rec, t0, part)
        reply = Reply(200, body, call_id=rec.id)
        self._soon(self.metrics.overhead.observe, time.perf_counter() - t0 - ans.waited_s)
        return reply

    async def _upstream_error(self, protocol: WireProtocol, rec: CallRecord, t0: float, part: PromptPart,
                              status: int, body: bytes, content_type: str | None) -> Reply:
        """The upstream's own HTTP error: recorded, and passed on in the shape of the client's API."""
        rec.error_class, rec.error_detail = f"upstream_http_{status}", body[:2000].decode(errors="replace")
        await self._record(rec, t0, part)
        body, media_type = protocol.upstream_error(status, body, content_type)
        return Reply(status, body, media_type or JSON, rec.id)

    # ---- a stream ---------------------------------------------------------------------------------------------
    async def _stream(self, protocol: WireProtocol, pending: Pending, wants, rec: CallRecord, part: PromptPart,
                      t0: float) -> Reply | StreamReply:
        stream = await self._recording_failure(pending.stream(), rec, t0, part)
        rec.upstream_status = stream.status
        if stream.status != 200:
            body = await stream.read_all()
            return await self._upstream_error(protocol, rec, t0, part, stream.status, body, stream.content_type)

        begun = [False]

        def abandon() -> None:  # the relay never ran (the client's connection failed first): its exits, here
            if not begun[0]:
                begun[0] = True
                stream.close()
                self.rollouts.leave()

        return StreamReply(self._relay(stream, protocol.relay(wants), rec, t0, part, begun), abandon=abandon,
                           call_id=rec.id)

    async def _relay(self, stream, relay, rec: CallRecord, t0: float, part: PromptPart, begun: list[bool]):
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
            self.rollouts.leave()
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
        if rec.completion_logprobs is None and comp.logprobs is not None and comp.completion_token_ids is not None:
            # not one logprob per token: not stored (the store refuses them), said here so the export can exclude it
            rec.metadata = {**(rec.metadata or {}), "logprob_mismatch": {
                "logprobs": len(comp.logprobs), "completion_tokens": len(comp.completion_token_ids)}}
        rec.token_exact = comp.token_exact and rec.error_class is None

    async def _recording_failure(self, awaitable, rec: CallRecord, t0: float, part: PromptPart):
        """``await awaitable``; an UpstreamFailure is recorded on ``rec`` before it goes on to the client."""
        try:
            return await awaitable
        except UpstreamFailure as exc:
            await self._record_failure(rec, t0, part, exc)
            raise

    async def _record_failure(self, rec: CallRecord, t0: float, part: PromptPart, exc: UpstreamFailure) -> None:
        await self._record_error(rec, t0, part, exc, exc.error_class)

    async def _record_error(self, rec: CallRecord, t0: float, part: PromptPart, exc: ProxyError,
                            error_class: str) -> None:
        """``rec`` recorded as failed with ``exc``, which the edge then answers naming the call (``CALL_ID_HEADER``)."""
        rec.error_class, rec.error_detail = error_class, exc.message
        await self._record(rec, t0, part)
        exc.call_id = rec.id

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

    async def _record(self, rec: CallRecord, t0: float, part: PromptPart) -> None:
        self.rollouts.charge(rec.rollout_id, rec.usage)
        self._redact(rec)
        rec.ended_at = datetime.now(timezone.utc)
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
        system call. A service runs in one loop (its rollout registry and upstream pool are bound to it, as asyncio
        objects are); a closed one (a test's previous ``asyncio.run``) is replaced."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        loop.call_soon(fn, *args)
