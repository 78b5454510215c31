"""The proxy's call path: authorize, parse, prepare the stored prompt, hold to the rollout's budget, forward,
capture, journal, answer.

Routes stay thin (``proxy._asgi_app``, ``proxy._operator_api``); this class does the work and gets its parts through
the constructor. The one rule that shapes it: a call is journaled before the last byte of its answer reaches the
client, so a client that got a complete answer can rely on the store having it (invariant 1). Non-streaming answers
are sent after the journal write; streams hold back only their terminating event (``[DONE]``,
``response.completed``, ``message_stop``: see ``proxy._protocols.contract.Relay``).

One call, as ``ProxyService.call`` reads: authorize, translate, draft (``Store.begin_call``: the store's unit of
work for one call), send (``proxy._failover.Failover``: again on another replica after a connection failure, the
failed attempt recorded and the retry recorded as a retry of it, ``_routed``), parse, finish (``draft.finish``),
reply.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from datetime import datetime, timezone

import orjson

from forge_store import FINISH_REASON_MAX, CallDraft, CallRecord, InvalidRecord, Store

from ._budgets import BUDGET_EXCEEDED
from ._call_ids import call_ids
from ._errors import ProxyError, UpstreamFailure
from ._exchange import JSON, CallHeaders, Last, Receive, Reply, StreamReply, parse_json, read_body
from ._failover import Failover
from ._metrics import Metrics
from ._protocols.completion import Completion, loads_answer
from ._protocols.contract import Translation, WireProtocol
from ._redaction import Redactor
from ._rollouts import Binding, RolloutRegistry
from ._self_calls import KEY as SELF_CALL
from ._self_calls import self_call
from ._upstream import Pending, Replica, UpstreamAnswer, UpstreamPool

log = logging.getLogger("proxy")


# The CPU to the upstream, once a lone call is on its way (see ``ProxyService.call``); a no-op where there is none.
_sched_yield = getattr(os, "sched_yield", lambda: None)


class _Call:
    """One call's state on its way through the service: what the client sent, its translation, and the current
    attempt's draft, sequence number and start time (a failover's retry gets new ones)."""

    __slots__ = ("protocol", "binding", "body", "tr", "t0", "draft", "seq", "started", "version", "route")

    def __init__(self, protocol: WireProtocol, binding: Binding, body: dict, tr: Translation, t0: float,
                 draft: CallDraft, started: datetime):
        self.protocol, self.binding, self.body, self.tr, self.t0 = protocol, binding, body, tr, t0
        self.draft, self.seq, self.started = draft, binding.next_seq(), started
        self.version: str | None = None  # the policy version current when the call was admitted
        self.route: tuple[str | None, bool] = (None, False)  # the model it is sent for, and whether the proxy chose it

    @property
    def rec(self) -> CallRecord:
        return self.draft.record


class ProxyService:
    def __init__(self, store: Store, upstream: UpstreamPool, rollouts: RolloutRegistry, *, redactor: Redactor,
                 metrics: Metrics, dialect: str = "vllm", max_body_bytes: int = 32 << 20,
                 replica_id: str | None = None):
        self.store, self.upstream, self.rollouts = store, upstream, rollouts
        self.replica = {"replica": replica_id} if replica_id else {}  # in every call's metadata: who recorded it
        self.redactor, self.metrics, self.dialect, self.max_body = redactor, metrics, dialect, max_body_bytes
        self._redact_copy = redactor.apply if redactor.rules else None  # the stored prompt's redaction
        self._background: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the one loop this service runs in, once known

    async def call(self, headers: CallHeaders, receive: Receive, protocol: WireProtocol, token: str | None,
                   raw: bytes | None = None) -> Reply | StreamReply:
        """Serve one model call through ``protocol``. ``token``: from the path (``/r/{token}/...``), else the
        headers'. ``raw``: the request body if the server has read it (and held it to the body limit), else
        ``receive`` gives it.

        The request goes upstream as soon as it is translated; what only the stored copy needs (redaction, hashes,
        the record's request side: ``draft.start``) is done while the upstream works, off the call's critical path
        (see ``_attempt``). A stream's relay leaves the rollout registry when it ends; any other answer leaves here."""
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
        if (kind := self_call(headers, tr.messages)) is not None:  # the harness's own utility call, marked
            tr.notes[SELF_CALL] = kind
        draft = self.store.begin_call(binding.rollout_id, tr.messages, tr.tools, redact=self._redact_copy)
        call = _Call(protocol, binding, body, tr, t0, draft, started)
        if draft.holds_images:
            # images go to the blob store off the loop, and an undecodable one is the client's 400: before upstream
            await asyncio.to_thread(self._prepare, draft)
        if binding.budget is not None and (over := binding.budget.admit(binding.rollout_id)) is not None:
            self._pin(call, self.rollouts.policy_version)
            self._start(call)
            await self._record_error(call, over, BUDGET_EXCEEDED)  # refused, never sent upstream
            raise over
        self._pin(call, await self.rollouts.enter())
        try:
            reply = await Failover(self.upstream, binding.rollout_id, *call.route).run(
                lambda replica, retry: self._attempt(call, replica, retry))
        except BaseException:
            self.rollouts.leave()
            raise
        if not isinstance(reply, StreamReply):
            self.rollouts.leave()
        return reply

    async def _attempt(self, call: _Call, replica: Replica, retry: tuple[str, str] | None) -> Reply | StreamReply:
        """Send the call to ``replica``, record its request side while the upstream works, then its answer (or
        failure: recorded, then raised for ``Failover``). ``retry``: (the failed call's id, its replica's URL).

        Off the critical path only if the upstream really works meanwhile: where the inference server shares the
        proxy's CPUs (the kernel tends to wake a process on the CPU of the one that woke it), that work, ~0.2 ms for
        an 8 KB prompt, would hold the server's start on this request back by as much. So a call with no other in
        flight yields the CPU once its request is written. With others in flight the proxy's own queue comes first.
        Measured on the 2-core machine with ``bench/proxy_overhead.py``'s load, two proxies interleaved against one
        upstream: at one client this took 0.26 ms off the added p50; a yield on every call cut the 64-client
        throughput ratio from 0.61 to 0.55, hence the condition."""
        if retry is not None:  # a new call: the same prompt, its own record
            call.draft, call.seq, call.started = call.draft.retry(), call.binding.next_seq(), datetime.now(timezone.utc)
        try:
            pending, failure = await replica.client.send("POST", call.protocol.UPSTREAM_PATH,
                                                         orjson.dumps(call.tr.upstream)), None
            if self.rollouts.in_flight == 1:
                _sched_yield()
        except UpstreamFailure as exc:
            pending, failure = None, exc
        try:
            rec = self._start(call)
        except BaseException:
            if pending is not None:
                pending.cancel()
            raise
        if self.upstream.routing:
            self._routed(rec, replica.url, retry)
        if failure is not None:
            await self._record_failure(call, failure)
            raise failure
        if not rec.streamed:
            return await self._unary(call, pending)
        return await self._stream(call, pending)

    def _pin(self, call: _Call, active: str | None) -> None:
        """The version the call is recorded under and the model that answers it: the active version's model,
        whatever name the request asked for, unless that name is one the operator keeps (``proxy._models``)."""
        asked = call.tr.upstream.get("model")
        call.version, served, chosen = self.rollouts.models.choose(asked, active)
        call.route = (served, chosen)
        if served != asked:   # recorded: the model that answered, and (metadata) the one asked for
            call.tr.upstream["model"], call.tr.notes["model_requested"] = served, asked

    async def side_post(self, path: str, payload: dict, model: str | None) -> UpstreamAnswer:
        """POST ``payload`` (a token count) for ``model`` as the client named it, where a call naming it goes
        (``_pin``'s choice; ``UpstreamPool.request``: a replica that serves it, 503 ``model_not_served`` for a chosen
        model none serves); a name the proxy chose is what the engine reads in ``payload["model"]``, as in a call."""
        _, served, chosen = self.rollouts.models.choose(model, self.rollouts.policy_version)
        if chosen:
            payload["model"] = served
        return await self.upstream.request("POST", path, orjson.dumps(payload), served, chosen)

    @staticmethod
    def _routed(rec: CallRecord, url: str, retry: tuple[str, str] | None) -> None:
        """With several replicas, a call records which one answered it (``upstream``). A failover: a connection
        failure before any byte of the answer reached the client was recorded as a failed call; this attempt on
        another replica is a retry of it (``retry_of``, as the data model records a repeated call), naming the
        replica that failed (``failover_from``)."""
        rec.metadata = {**(rec.metadata or {}), "upstream": url}
        if retry is not None:
            rec.retry_of, rec.metadata["failover_from"] = retry

    def _start(self, call: _Call) -> CallRecord:
        """The call's record, request side, from its draft: the prompt's stored copy (redacted), the parameters
        redacted, the new bodies journaled, the request hash (``draft.start``)."""
        draft, tr = call.draft, call.tr
        self._prepare(draft)
        hits = set(draft.marks)  # redaction rules that fired on the prompt's messages and tools, and below
        params, model = self.redactor.apply(tr.params, hits), self.redactor.apply(tr.upstream.get("model"), hits)
        notes = self.redactor.apply(tr.notes, hits) if tr.notes else None
        metadata = self._metadata(hits)
        if notes or self.replica:
            metadata = {**(metadata or {}), **(notes or {}), **self.replica}
        call_id = call_ids.next()
        try:
            rec = draft.start(id=call_id, seq=call.seq, api_surface=call.protocol.SURFACE, params=params,
                              streamed=tr.stream, model=model, started_at=call.started,
                              policy_version_id=call.version, metadata=metadata)
        except Exception as exc:
            raise self._unrecordable(call_id, exc) from exc
        rec.retry_of = call.binding.retry_of(draft.request_hash, rec.id)
        return rec

    @staticmethod
    def _prepare(draft: CallDraft) -> None:
        """The stored copy of the prompt (images to the blob store, redaction of the messages and of the tool
        schemas), once; 400 for an undecodable image."""
        try:
            draft.prepare()
        except InvalidRecord as exc:
            raise ProxyError(400, str(exc), code="invalid_image") from None

    @staticmethod
    def _metadata(redactions: set[str]) -> dict | None:
        """The call's metadata starts from what the proxy found, never from request headers (none is stored):
        ``redacted``, the redaction rules that fired on any stored text of the call (``_redact`` adds the answer's)."""
        return {"redacted": sorted(redactions)} if redactions else None

    # ---- one answer -----------------------------------------------------------------------------------------
    async def _unary(self, call: _Call, pending: Pending) -> Reply:
        protocol, rec, wants = call.protocol, call.rec, call.tr.wants
        ans = await self._recording_failure(pending.answer(), call)
        rec.upstream_status = ans.status
        if ans.status != 200:
            return await self._upstream_error(call, ans.status, ans.body, ans.content_type)
        try:
            data = loads_answer(ans.body, protocol.ids_as_text(wants))
        except orjson.JSONDecodeError:
            exc = UpstreamFailure(502, f"upstream answered 200 with a body that is not JSON: {ans.body[:200]!r}",
                                  "upstream_protocol")
            await self._record_failure(call, exc)
            raise exc from None
        try:
            self._fill(rec, protocol.parse(data))
            body = orjson.dumps(protocol.answer(data, wants))
        except UpstreamFailure as exc:  # JSON, but not an answer the protocol can read: recorded, then the 502
            await self._record_failure(call, exc)
            raise
        await self._record(call)
        reply = Reply(200, body, call_id=rec.id)
        self._soon(self.metrics.overhead.observe, time.perf_counter() - call.t0 - ans.waited_s)
        return reply

    async def _upstream_error(self, call: _Call, status: int, body: bytes, content_type: str | None) -> Reply:
        """The upstream's own HTTP error: recorded, and passed on in the shape of the client's API."""
        rec = call.rec
        rec.error_class, rec.error_detail = f"upstream_http_{status}", body[:2000].decode(errors="replace")
        await self._record(call)
        body, media_type = call.protocol.upstream_error(status, body, content_type)
        return Reply(status, body, media_type or JSON, rec.id)

    # ---- a stream ---------------------------------------------------------------------------------------------
    async def _stream(self, call: _Call, pending: Pending) -> Reply | StreamReply:
        stream = await self._recording_failure(pending.stream(), call)
        call.rec.upstream_status = stream.status
        if stream.status != 200:
            body = await stream.read_all()
            return await self._upstream_error(call, stream.status, body, stream.content_type)

        begun = [False]

        def abandon() -> None:  # the relay never ran (the client's connection failed first): its exits, here
            if not begun[0]:
                begun[0] = True
                stream.close()
                self.rollouts.leave()

        return StreamReply(self._relay(stream, call.protocol.relay(call.tr.wants), call, begun), abandon=abandon,
                           call_id=call.rec.id)

    async def _relay(self, stream, relay, call: _Call, begun: list[bool]):
        begun[0] = True
        recorded = False
        rec, t0 = call.rec, call.t0
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
            await self._record(call)  # before the terminal event: a client with a whole answer finds it stored
            if end := relay.end():
                out.append(end)
            yield Last(b"".join(out))
        finally:
            stream.close(complete=relay.done)  # stopped at the upstream's end: its connection stays reusable
            self.rollouts.leave()
            if not recorded:  # the client went away mid-stream: keep what it was sent
                rec.error_class = rec.error_class or "client_disconnected"
                self._fill(rec, relay.result())
                task = asyncio.get_running_loop().create_task(self._record(call))
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

    async def _recording_failure(self, awaitable, call: _Call):
        """``await awaitable``; an UpstreamFailure is recorded on the call before it goes on to the client."""
        try:
            return await awaitable
        except UpstreamFailure as exc:
            await self._record_failure(call, exc)
            raise

    async def _record_failure(self, call: _Call, exc: UpstreamFailure) -> None:
        await self._record_error(call, exc, exc.error_class)

    async def _record_error(self, call: _Call, exc: ProxyError, error_class: str) -> None:
        """The call recorded as failed with ``exc``, which the edge then answers naming the call
        (``CALL_ID_HEADER``), and which a failover's retry names as what it retries."""
        rec = call.rec
        rec.error_class, rec.error_detail = error_class, exc.message
        await self._record(call)
        exc.call_id = rec.id

    def _unrecordable(self, call_id: str, exc: Exception) -> ProxyError:
        log.error("could not journal call %s", call_id, exc_info=exc)
        self.metrics.record_failures.inc()
        return ProxyError(503, f"the proxy could not record this call ({exc.__class__.__name__}); the answer is "
                               "withheld so that nothing goes unrecorded; retry", type="server_error",
                          code="record_failed")

    def _redact(self, rec: CallRecord) -> None:
        """Redaction covers everything stored besides the prompt and the parameters (done before the answer came):
        the answer and errors."""
        hits: set[str] = set()
        memo: dict = {}   # the answer's text is in both the response and its message: scanned once
        rec.response = self.redactor.apply(rec.response, hits, memo)
        rec.response_message = self.redactor.apply(rec.response_message, hits, memo)
        rec.error_detail = self.redactor.apply(rec.error_detail, hits, memo)
        if hits:
            rec.metadata = {**(rec.metadata or {})}
            rec.metadata["redacted"] = sorted(set(rec.metadata.get("redacted", [])) | hits)

    async def _record(self, call: _Call) -> None:
        """The call's draft finished: charged to the rollout's budget, its answer side redacted, durable."""
        rec = call.rec
        self.rollouts.charge(rec.rollout_id, rec.usage)
        self._redact(rec)
        rec.ended_at = datetime.now(timezone.utc)
        rec.latency_ms = (time.perf_counter() - call.t0) * 1000
        t1 = time.perf_counter()
        try:
            await call.draft.finish()
        except Exception as exc:
            raise self._unrecordable(rec.id, exc) from exc
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
