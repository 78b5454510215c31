"""Turn a ``CallRecord`` into a journal operation, encoding its prompt as deltas (invariant 3).

The encoder remembers, per rollout, the previous call's prompt message hashes and its prompt + completion token
ids. A new call stores only the messages and tokens that are not a prefix of those, plus a reference to the base
call. It also remembers which messages it already journaled, so a message body enters the journal once; the
memory is bounded (least recently used rollouts and hashes are forgotten, which only costs a fuller record).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import orjson

from .._errors import InvalidRecord
from .._hashing import canonical_json, json_sha256, sha256_hex
from .._records import API_SURFACES, CallRecord
from .._schema import Call, Limits
from .._tokens import IdsText, common_prefix_items, common_prefix_text, ids_to_bytes, pack_ids

# The call's fields its writer sets that a column bounds (the rest are hashes, ids and counts the store makes)
_CALL_LIMITS = Limits(Call.__table__, ("id", "rollout_id", "request_hash", "finish_reason", "error_class", "retry_of",
                                       "policy_version_id", "seq", "upstream_status"))


@dataclass(slots=True)
class PromptPart:
    """``CallEncoder.encode_prompt``'s result for one record (``messages`` / ``tools``: the lists it was made from):
    the request side of its journal operation, which needs no answer."""

    messages: list
    tools: list | None
    hashes: list[str]
    tools_hash: str | None
    system_hash: str | None
    base_call: str | None  # the rollout's call whose prompt this one extends (``base_len`` messages of it)
    base_len: int
    new_msgs: dict[str, tuple[str | None, str]]  # hash -> (role, canonical body): not journaled before
    new_tools: tuple[str, str] | None  # (hash, canonical body) of the tool schemas, if not journaled before
    written: bool = False  # ``new_msgs`` / ``new_tools`` are journaled already, ahead of the call (``journaled``)


@dataclass
class _RolloutState:
    call_id: str
    messages: list[dict]
    prompt_hashes: list[str]
    full_ids: bytes | None  # prompt + completion token ids, uint32 LE
    full_text: bytes | None = None  # the same as id text, when the prompt's ids came as text (IdsText)
    full_n: int = 0  # ids in full_text
    response: dict | None = None  # the call's answer message: journaled with it, hashed by the database side


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def system_prompt_hash(messages: list[dict]) -> str | None:
    for m in messages:
        if m.get("role") in ("system", "developer"):
            return json_sha256(m.get("content"))
    return None


class CallEncoder:
    def __init__(self, max_rollouts: int = 4096, max_hashes: int = 200_000):
        self._lock = threading.Lock()
        self._rollouts: OrderedDict[str, _RolloutState] = OrderedDict()
        self._journaled: OrderedDict[str, None] = OrderedDict()
        self._recent_calls: OrderedDict[str, None] = OrderedDict()
        self.max_rollouts, self.max_hashes = max_rollouts, max_hashes

    def forget(self, rollout_id: str) -> None:
        with self._lock:
            self._rollouts.pop(rollout_id, None)

    def encode_prompt(self, rec: CallRecord) -> PromptPart:
        """The request side of ``encode``: message and tool bodies and hashes, the prompt's delta against the
        rollout's previous call, and which bodies are new to the journal. It needs no answer: a caller waiting on
        the answer (the proxy) does it meanwhile, may journal the new bodies ahead of the call (``ahead``) and hands
        the result to ``encode`` as ``prompt``."""
        # Messages equal to the previous call's (Python ==, a C-speed deep compare) reuse its hashes, so a call
        # costs O(new content). Values Python calls equal but JSON spells differently (1, 1.0, true) inside an
        # otherwise identical earlier message keep the earlier spelling: harmless for chat content.
        with self._lock:
            state = self._rollouts.get(rec.rollout_id) if rec.rollout_id else None
        same = 0
        if state is not None:
            for old, new in zip(state.messages, rec.messages):
                if old != new:
                    break
                same += 1
        bodies = [canonical_json(m).decode() for m in rec.messages[same:]]
        hashes = (state.prompt_hashes[:same] if state else []) + [sha256_hex(b.encode()) for b in bodies]
        tools_body = canonical_json(rec.tools).decode() if rec.tools else None
        tools_hash = sha256_hex(tools_body.encode()) if tools_body else None
        base_len = _common_prefix(state.prompt_hashes, hashes) if state is not None else 0
        # The base is a call encoded before this one, so journaled before it (the encoder and the journal keep
        # one order); a call of the same rollout that lands meanwhile does not change that.
        base_call = state.call_id if base_len else None
        answered = state.response if state is not None else None  # journaled with the previous call
        new_msgs: dict[str, tuple[str | None, str]] = {}
        with self._lock:
            for i in range(base_len, len(hashes)):  # base_len >= same: the first ``same`` hashes are the previous call's
                h = hashes[i]
                if h in self._journaled or h in new_msgs:
                    continue
                m, body = rec.messages[i], bodies[i - same]
                if answered is not None and m == answered and canonical_json(answered).decode() == body:
                    self._remember(self._journaled, h, self.max_hashes)  # the previous answer, now in the history
                    continue
                new_msgs[h] = (m.get("role"), body)
            new_tools = (tools_hash, tools_body) if tools_hash and tools_hash not in self._journaled else None
        return PromptPart(rec.messages, rec.tools, hashes, tools_hash, system_prompt_hash(rec.messages), base_call,
                          base_len, new_msgs, new_tools)

    def ahead(self, prompt: PromptPart) -> dict | None:
        """The journal operation that stores ``prompt``'s new message and tool bodies ahead of its call (None if it
        has none); once the caller has journaled it (and said so: ``journaled``), the call's operation and later
        calls refer to those bodies instead of repeating them. The proxy journals it while the upstream works, so
        the call's own operation, written between the answer's arrival and its last byte, carries only the answer's
        side."""
        if not prompt.new_msgs and prompt.new_tools is None:
            return None
        op: dict = {"k": "msgs", "msgs": prompt.new_msgs}
        if prompt.new_tools is not None:
            op["tools"] = prompt.new_tools
        return op

    def journaled(self, prompt: PromptPart) -> None:
        """``ahead(prompt)``'s operation is in the journal: its bodies need not be repeated."""
        prompt.written = True
        with self._lock:
            for h in prompt.new_msgs:
                self._remember(self._journaled, h, self.max_hashes)
            if prompt.new_tools is not None:
                self._remember(self._journaled, prompt.new_tools[0], self.max_hashes)

    def encode(self, rec: CallRecord, prompt: PromptPart | None = None) -> dict | None:
        """The journal operation for ``rec``; None if this encoder already encoded a call with that id.

        The answer message goes into the operation as it is: its canonical body and hash are made by the database
        side (``forge_store._write.db_apply``), off the caller's path, and so are the packed completion ids and logprobs."""
        if rec.api_surface not in API_SURFACES:
            raise InvalidRecord(f"api_surface {rec.api_surface!r} unknown: use one of {', '.join(API_SURFACES)}")
        if rec.started_at.tzinfo is None:
            raise InvalidRecord(f"call {rec.id}: started_at {rec.started_at!r} is naive; pass an aware UTC datetime")
        _CALL_LIMITS.check(f"call {str(rec.id)[:64]}:", rec.__getattribute__)  # before any state changes
        if prompt is None or prompt.messages is not rec.messages or prompt.tools is not rec.tools:
            prompt = self.encode_prompt(rec)
        hashes, tools_hash = prompt.hashes, prompt.tools_hash
        prompt_raw = prompt_text = None
        if isinstance(rec.prompt_token_ids, IdsText):  # kept as text: the writer packs it (see IdsText)
            prompt_text = rec.prompt_token_ids.text
        completion = rec.completion_token_ids
        if completion is not None and not isinstance(completion, list):
            completion = list(completion)
        done_raw = b""  # the completion as uint32, where the prompt's ids are (checked here, before any state changes)
        if prompt_text is None and rec.prompt_token_ids is not None:
            prompt_raw = ids_to_bytes(rec.prompt_token_ids)
            done_raw = ids_to_bytes(completion) if completion else b""
        logprobs = rec.completion_logprobs
        if logprobs is not None and completion is not None and len(logprobs) != len(completion):
            raise InvalidRecord(f"call {rec.id}: {len(logprobs)} logprobs for {len(completion)} completion tokens; "
                                "logprobs must be per completion token")
        if logprobs is not None and not isinstance(logprobs, list):
            logprobs = list(logprobs)
        # Without a hash from the caller, hash the request Merkle-style (message hashes, tools hash, params):
        # equal requests still hash equal, at O(new content) cost.
        request_hash = rec.request_hash or json_sha256({"messages": hashes, "tools": tools_hash, "params": rec.params})

        with self._lock:
            if rec.id in self._recent_calls:
                return None
            self._remember(self._recent_calls, rec.id, self.max_hashes)
            state = self._rollouts.get(rec.rollout_id) if rec.rollout_id else None
            ids_base, ids_prefix, cut = None, 0, 0
            if state is not None:
                if prompt_raw is not None and state.full_ids:
                    ids_prefix = common_prefix_items(state.full_ids, prompt_raw)
                elif prompt_text is not None and state.full_text:
                    ids_prefix, cut = common_prefix_text(state.full_text, prompt_text, state.full_n)
                ids_base = state.call_id if ids_prefix else None
            if prompt_text is not None:  # ids in the prompt: the shared ones (known) plus those in the tail
                tail = prompt_text[cut:]
                n_text = ids_prefix + (tail.count(b",") + 1 if tail else 0)
            msgs = tools = None
            if not prompt.written:  # the bodies go with the call
                msgs, tools = prompt.new_msgs, prompt.new_tools
                for h in msgs:
                    self._remember(self._journaled, h, self.max_hashes)
                if tools is not None:
                    self._remember(self._journaled, tools[0], self.max_hashes)
            if rec.rollout_id:
                full = full_text = None
                if prompt_raw is not None:
                    full = prompt_raw + done_raw
                elif prompt_text is not None:
                    full_text = prompt_text
                    if completion:
                        done = orjson.dumps(completion)[1:-1]
                        full_text = full_text + b"," + done if full_text else done
                full_n = n_text + len(completion or ()) if prompt_text is not None else 0
                self._rollouts[rec.rollout_id] = _RolloutState(rec.id, list(rec.messages), hashes, full, full_text,
                                                               full_n, rec.response_message)
                self._rollouts.move_to_end(rec.rollout_id)
                while len(self._rollouts) > self.max_rollouts:
                    self._rollouts.popitem(last=False)

        row = {
            "id": rec.id,
            "rollout_id": rec.rollout_id,
            "seq": rec.seq if rec.seq is not None else int(rec.started_at.timestamp() * 1e9),
            "api_surface": rec.api_surface,
            "model": rec.model or rec.params.get("model"),
            "streamed": rec.streamed,
            "request_hash": request_hash,
            "system_prompt_hash": prompt.system_hash,
            "tool_schema_hash": tools_hash,
            "request_params": rec.params,
            "prompt_base_call_id": prompt.base_call,
            "prompt_base_len": prompt.base_len,
            "prompt_tail": hashes[prompt.base_len:],
            "n_prompt_messages": len(hashes),
            "response": rec.response,
            "finish_reason": rec.finish_reason,
            "prompt_ids_base_call_id": ids_base,
            "prompt_ids_prefix_len": ids_prefix,
            "prompt_ids_tail": (pack_ids(prompt_raw[ids_prefix * 4 :], compress=False) if prompt_raw is not None
                                else b"T" + tail if prompt_text is not None else None),
            "n_prompt_tokens": (len(prompt_raw) // 4 if prompt_raw is not None
                                else n_text if prompt_text is not None else None),
            "completion_ids": completion,  # a list: packed by the database side
            "completion_logprobs": logprobs,  # likewise
            "n_completion_tokens": len(completion) if completion is not None else None,
            "usage": rec.usage,
            "started_at": rec.started_at,
            "ended_at": rec.ended_at,
            "ttft_ms": rec.ttft_ms,
            "latency_ms": rec.latency_ms,
            "upstream_status": rec.upstream_status,
            "error_class": rec.error_class,
            "error_detail": rec.error_detail,
            "retry_of": rec.retry_of,
            "policy_version_id": rec.policy_version_id,
            "token_exact": bool(rec.token_exact),
            "image_hashes": rec.image_hashes,
            "metadata": rec.metadata,
        }
        op = {"k": "call", "r": row}
        if rec.response_message is not None:
            op["resp"] = rec.response_message
        if msgs:
            op["msgs"] = msgs
        if tools:
            op["tools"] = tools
        return op

    @staticmethod
    def _remember(lru: OrderedDict, key: str, limit: int) -> None:
        lru[key] = None
        lru.move_to_end(key)
        if len(lru) > limit:
            lru.popitem(last=False)

    def reset(self) -> None:
        """Forget everything (after a failed journal write, whose operation may hold the only copy of a base)."""
        with self._lock:
            self._rollouts.clear()
            self._journaled.clear()
            self._recent_calls.clear()
