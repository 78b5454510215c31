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

from .errors import InvalidRecord
from .hashing import canonical_json, json_sha256, sha256_hex
from .records import API_SURFACES, CallRecord
from .tokens import IdsText, common_prefix_items, common_prefix_text, ids_to_bytes, pack_ids, pack_logprobs


@dataclass(slots=True)
class PromptPart:
    """``CallEncoder.encode_prompt``'s result for one record (``messages`` / ``tools``: the lists it was made from)."""

    messages: list
    tools: list | None
    bodies: list[str | None]
    hashes: list[str]
    tools_body: str | None
    tools_hash: str | None
    system_hash: str | None = None


@dataclass
class _RolloutState:
    call_id: str
    messages: list[dict]
    prompt_hashes: list[str]
    full_ids: bytes | None  # prompt + completion token ids, uint32 LE
    full_text: bytes | None = None  # the same as id text, when the prompt's ids came as text (IdsText)
    full_n: int = 0  # ids in full_text


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
        """The request side of ``encode`` (message and tool bodies and hashes), which needs no answer: a caller
        waiting on the answer (the proxy) does it meanwhile and hands the result to ``encode`` as ``prompt``."""
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
        bodies = [None] * same + [canonical_json(m).decode() for m in rec.messages[same:]]
        hashes = (state.prompt_hashes[:same] if state else []) + [sha256_hex(b.encode()) for b in bodies[same:]]
        tools_body = canonical_json(rec.tools).decode() if rec.tools else None
        tools_hash = sha256_hex(tools_body.encode()) if tools_body else None
        return PromptPart(rec.messages, rec.tools, bodies, hashes, tools_body, tools_hash,
                          system_prompt_hash(rec.messages))

    def encode(self, rec: CallRecord, prompt: PromptPart | None = None) -> dict | None:
        """The journal operation for ``rec``; None if this encoder already encoded a call with that id."""
        if rec.api_surface not in API_SURFACES:
            raise InvalidRecord(f"api_surface {rec.api_surface!r} unknown: use one of {', '.join(API_SURFACES)}")
        if rec.started_at.tzinfo is None:
            raise InvalidRecord(f"call {rec.id}: started_at {rec.started_at!r} is naive; pass an aware UTC datetime")
        if prompt is None or prompt.messages is not rec.messages or prompt.tools is not rec.tools:
            prompt = self.encode_prompt(rec)
        bodies, hashes, tools_body, tools_hash = prompt.bodies, prompt.hashes, prompt.tools_body, prompt.tools_hash
        with self._lock:
            state = self._rollouts.get(rec.rollout_id) if rec.rollout_id else None
        prompt_raw = prompt_text = None
        if isinstance(rec.prompt_token_ids, IdsText):  # kept as text: the writer packs it (see IdsText)
            prompt_text = rec.prompt_token_ids.text
        elif rec.prompt_token_ids is not None:
            prompt_raw = ids_to_bytes(rec.prompt_token_ids)
        response_body = canonical_json(rec.response_message).decode() if rec.response_message is not None else None
        response_message_hash = sha256_hex(response_body.encode()) if response_body is not None else None
        # Without a hash from the caller, hash the request Merkle-style (message hashes, tools hash, params):
        # equal requests still hash equal, at O(new content) cost.
        request_hash = rec.request_hash or json_sha256({"messages": hashes, "tools": tools_hash, "params": rec.params})
        if rec.completion_logprobs is not None and rec.completion_token_ids is not None and len(
            rec.completion_logprobs
        ) != len(rec.completion_token_ids):
            raise InvalidRecord(
                f"call {rec.id}: {len(rec.completion_logprobs)} logprobs for {len(rec.completion_token_ids)} completion "
                "tokens; logprobs must be per completion token"
            )

        with self._lock:
            if rec.id in self._recent_calls:
                return None
            self._remember(self._recent_calls, rec.id, self.max_hashes)
            if rec.rollout_id and self._rollouts.get(rec.rollout_id) is not state:
                state = self._rollouts.get(rec.rollout_id)  # another call of this rollout got in between
            base_call, base_len, ids_base, ids_prefix, cut = None, 0, None, 0, 0
            if state is not None:
                base_len = _common_prefix(state.prompt_hashes, hashes)
                base_call = state.call_id if base_len else None
                if prompt_raw is not None and state.full_ids:
                    ids_prefix = common_prefix_items(state.full_ids, prompt_raw)
                elif prompt_text is not None and state.full_text:
                    ids_prefix, cut = common_prefix_text(state.full_text, prompt_text, state.full_n)
                ids_base = state.call_id if ids_prefix else None
            if prompt_text is not None:  # ids in the prompt: the shared ones (known) plus those in the tail
                tail = prompt_text[cut:]
                n_text = ids_prefix + (tail.count(b",") + 1 if tail else 0)
            new_msgs = {}
            for h, body, m in zip(hashes[base_len:], bodies[base_len:], rec.messages[base_len:]):
                if h not in self._journaled:
                    new_msgs[h] = (m.get("role"), body if body is not None else canonical_json(m).decode())
                self._remember(self._journaled, h, self.max_hashes)
            if rec.rollout_id:
                full = full_text = None
                if prompt_raw is not None:
                    full = prompt_raw + (ids_to_bytes(rec.completion_token_ids) if rec.completion_token_ids else b"")
                elif prompt_text is not None:
                    full_text = prompt_text
                    if rec.completion_token_ids:
                        done = orjson.dumps(list(rec.completion_token_ids))[1:-1]
                        full_text = full_text + b"," + done if full_text else done
                full_n = n_text + len(rec.completion_token_ids or ()) if prompt_text is not None else 0
                self._rollouts[rec.rollout_id] = _RolloutState(rec.id, list(rec.messages), hashes, full, full_text,
                                                               full_n)
                self._rollouts.move_to_end(rec.rollout_id)
                while len(self._rollouts) > self.max_rollouts:
                    self._rollouts.popitem(last=False)
            if response_message_hash and response_message_hash not in self._journaled:
                new_msgs[response_message_hash] = (rec.response_message.get("role"), response_body)
                self._remember(self._journaled, response_message_hash, self.max_hashes)
            tools = None
            if tools_hash and tools_hash not in self._journaled:
                tools = (tools_hash, tools_body)
            if tools_hash:
                self._remember(self._journaled, tools_hash, self.max_hashes)

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
            "prompt_base_call_id": base_call,
            "prompt_base_len": base_len,
            "prompt_tail": hashes[base_len:],
            "n_prompt_messages": len(hashes),
            "response": rec.response,
            "response_message_hash": response_message_hash,
            "finish_reason": rec.finish_reason,
            "prompt_ids_base_call_id": ids_base,
            "prompt_ids_prefix_len": ids_prefix,
            "prompt_ids_tail": (pack_ids(prompt_raw[ids_prefix * 4 :], compress=False) if prompt_raw is not None
                                else b"T" + tail if prompt_text is not None else None),
            "n_prompt_tokens": (len(prompt_raw) // 4 if prompt_raw is not None
                                else n_text if prompt_text is not None else None),
            "completion_ids": (pack_ids(rec.completion_token_ids, compress=False)
                               if rec.completion_token_ids is not None else None),
            "completion_logprobs": pack_logprobs(rec.completion_logprobs) if rec.completion_logprobs is not None else None,
            "n_completion_tokens": len(rec.completion_token_ids) if rec.completion_token_ids is not None else None,
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
        op = {"k": "call", "r": row, "msgs": new_msgs}
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
