"""Turn a ``CallRecord`` into a journal operation, encoding its prompt as deltas (invariant 3).

Per rollout the encoder keeps the previous prompt's stored copies and hashes (``PromptCache``: a call prepares and
hashes only its new messages) and, from the previous call it encoded, the prompt's message hashes and the prompt +
completion token ids: the delta base. A call stores only the messages and tokens that are not a prefix of those,
plus a reference to the base call, which was encoded, and so journaled, before it. The encoder also remembers which
message bodies it already journaled, so a body enters the journal once; the memory is bounded (least recently used
rollouts and hashes are forgotten, which only costs a fuller record).

A call's ``request_hash`` is made here, Merkle-style, from what the prompt's encoding hashes anyway: the message
hashes, the tools' hash and the parameters. Equal requests hash equal, at O(new content) plus the parameters.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import orjson

from .._errors import InvalidRecord
from .._hashing import canonical_json, json_sha256
from .._records import CallRecord
from .._schema import Call, Limits
from .._tokens import IdsText, common_prefix_items, common_prefix_text, ids_to_bytes, pack_ids
from .prompt_cache import PendingPrompt, Prepare, PromptCache, PutBlob

# The call's fields its writer sets that a column bounds (the rest are hashes, ids and counts the store makes)
_CALL_LIMITS = Limits(Call.__table__, ("id", "rollout_id", "api_surface", "finish_reason", "error_class", "retry_of",
                                       "policy_version_id", "seq", "upstream_status"))
FINISH_REASON_MAX = dict(_CALL_LIMITS.strings)["finish_reason"]  # characters: the proxy keeps a longer one elsewhere


@dataclass(slots=True)
class PromptPart:
    """``CallEncoder.encode_prompt``'s result for one record (``messages`` / ``tools``: the lists it was made from):
    the request side of its journal operation, which needs no answer."""

    messages: list
    tools: list | None
    hashes: list[str]
    tools_hash: str | None
    system_hash: str | None
    request_hash: str  # the call's canonical request hash (see the module docstring)
    base_call: str | None  # the rollout's call whose prompt this one extends (``base_len`` messages of it)
    base_len: int
    new_msgs: dict[str, tuple[str | None, str]]  # hash -> (role, canonical body): not journaled before
    new_tools: tuple[str, str] | None  # (hash, canonical body) of the tool schemas, if not journaled before
    written: bool = False  # ``new_msgs`` / ``new_tools`` are journaled already, ahead of the call (``journaled``)


@dataclass(slots=True)
class _Base:
    """The rollout's last encoded call: what the next call's prompt is a delta against."""

    call_id: str
    prompt_hashes: list[str]
    full_ids: bytes | None  # prompt + completion token ids, uint32 LE
    full_text: bytes | None = None  # the same as id text, when the prompt's ids came as text (IdsText)
    full_n: int = 0  # ids in full_text
    response: dict | None = None  # the call's answer message: journaled with it, hashed by the database side


@dataclass(slots=True)
class _Ids:
    """A call's token ids as the row needs them, checked before any state changes, and their delta."""

    prompt_raw: bytes | None  # uint32 LE, where the prompt's ids came as a list
    prompt_text: bytes | None  # the id text, where they came as IdsText (the writer packs it)
    completion: list | None
    done_raw: bytes  # the completion as uint32, where the prompt's ids are raw
    logprobs: list | None
    base_call: str | None = None
    prefix: int = 0  # ids shared with the base call's prompt + completion
    tail: bytes = b""  # the id text past the prefix
    n_text: int = 0  # ids in the prompt's text

    @classmethod
    def of(cls, rec: CallRecord) -> _Ids:
        text = rec.prompt_token_ids.text if isinstance(rec.prompt_token_ids, IdsText) else None
        completion = rec.completion_token_ids
        if completion is not None and not isinstance(completion, list):
            completion = list(completion)
        raw, done = None, b""
        if text is None and rec.prompt_token_ids is not None:
            raw = ids_to_bytes(rec.prompt_token_ids)
            done = ids_to_bytes(completion) if completion else b""
        logprobs = rec.completion_logprobs
        if logprobs is not None and completion is not None and len(logprobs) != len(completion):
            raise InvalidRecord(f"call {rec.id}: {len(logprobs)} logprobs for {len(completion)} completion tokens; "
                                "logprobs must be per completion token")
        if logprobs is not None and not isinstance(logprobs, list):
            logprobs = list(logprobs)
        return cls(raw, text, completion, done, logprobs)

    def delta(self, base: _Base | None) -> None:
        """The prefix shared with ``base``'s prompt + completion ids (set on self)."""
        cut = 0
        if base is not None:
            if self.prompt_raw is not None and base.full_ids:
                self.prefix = common_prefix_items(base.full_ids, self.prompt_raw)
            elif self.prompt_text is not None and base.full_text:
                self.prefix, cut = common_prefix_text(base.full_text, self.prompt_text, base.full_n)
            self.base_call = base.call_id if self.prefix else None
        if self.prompt_text is not None:  # ids in the prompt: the shared ones (known) plus those in the tail
            self.tail = self.prompt_text[cut:]
            self.n_text = self.prefix + (self.tail.count(b",") + 1 if self.tail else 0)

    def base_for_next(self, call_id: str, prompt_hashes: list[str], response: dict | None) -> _Base:
        full = full_text = None
        if self.prompt_raw is not None:
            full = self.prompt_raw + self.done_raw
        elif self.prompt_text is not None:
            full_text = self.prompt_text
            if self.completion:
                done = orjson.dumps(self.completion)[1:-1]
                full_text = full_text + b"," + done if full_text else done
        full_n = self.n_text + len(self.completion or ()) if self.prompt_text is not None else 0
        return _Base(call_id, prompt_hashes, full, full_text, full_n, response)

    def columns(self) -> dict:
        raw, text, completion = self.prompt_raw, self.prompt_text, self.completion
        return {
            "prompt_ids_base_call_id": self.base_call,
            "prompt_ids_prefix_len": self.prefix,
            "prompt_ids_tail": (pack_ids(raw[self.prefix * 4:], compress=False) if raw is not None
                                else b"T" + self.tail if text is not None else None),
            "n_prompt_tokens": len(raw) // 4 if raw is not None else self.n_text if text is not None else None,
            "completion_ids": completion,  # a list: packed by the database side
            "completion_logprobs": self.logprobs,  # likewise
            "n_completion_tokens": len(completion) if completion is not None else None,
        }


def _common_prefix(a: list[str], b: list[str]) -> int:
    if len(a) <= len(b) and b[:len(a)] == a:  # the usual case, one C compare: the prompt extends the base's
        return len(a)
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _check(rec: CallRecord) -> None:
    """Refuse what the store cannot keep, before any state changes. The API surface is the caller's word (the proxy
    names its wire protocols): any non-empty name its column holds."""
    if not isinstance(rec.api_surface, str) or not rec.api_surface:
        raise InvalidRecord(f"call {str(rec.id)[:64]}: api_surface {rec.api_surface!r} is not a name; pass the API "
                            "the call was made through, e.g. 'chat.completions'")
    if rec.started_at.tzinfo is None:
        raise InvalidRecord(f"call {rec.id}: started_at {rec.started_at!r} is naive; pass an aware UTC datetime")
    _CALL_LIMITS.check(f"call {str(rec.id)[:64]}:", rec.__getattribute__)


class CallEncoder:
    def __init__(self, max_rollouts: int = 4096, max_hashes: int = 200_000):
        self._lock = threading.Lock()
        self.prompts = PromptCache(max_rollouts)
        self._bases: OrderedDict[str, _Base] = OrderedDict()
        self._journaled: OrderedDict[str, None] = OrderedDict()
        self._recent_calls: OrderedDict[str, None] = OrderedDict()
        self.max_rollouts, self.max_hashes = max_rollouts, max_hashes

    def forget(self, rollout_id: str) -> None:
        self.prompts.forget(rollout_id)
        with self._lock:
            self._bases.pop(rollout_id, None)

    def prompt(self, rollout_id: str | None, messages: list, tools: list | None = None, *,
               put_blob: PutBlob | None = None, prepare: Prepare | None = None) -> PendingPrompt:
        """``messages`` compared with the rollout's previous prompt (see ``PromptCache.begin``)."""
        return self.prompts.begin(rollout_id, messages, tools, put_blob=put_blob, prepare=prepare)

    def encode_prompt(self, rec: CallRecord, prompt: PendingPrompt | None = None) -> PromptPart:
        """The request side of ``encode``: the prompt's hashes, its delta against the rollout's previous encoded
        call, which bodies are new to the journal, and the request hash. It needs no answer: a caller waiting on the
        answer (the proxy) does it meanwhile, may journal the new bodies ahead of the call (``ahead``) and hands the
        result to ``encode`` as ``prompt``. ``prompt``: from ``self.prompt`` for ``rec``'s messages, prepared;
        ``rec.messages`` must be its stored copies (without it, ``rec.messages`` are stored as they are)."""
        if prompt is None or prompt.messages is not rec.messages or prompt.tools is not rec.tools:
            prompt = self.prompts.begin(rec.rollout_id, rec.messages, rec.tools)
            prompt.prepare()
        hashes = prompt.hashes
        with self._lock:
            base = self._bases.get(rec.rollout_id) if rec.rollout_id else None
            base_len = _common_prefix(base.prompt_hashes, hashes) if base is not None else 0
            new_msgs = self._new_bodies(prompt, base_len, base.response if base is not None else None)
            tools_hash = prompt.tools_hash
            new_tools = None
            if tools_hash is not None and tools_hash not in self._journaled:
                new_tools = (tools_hash, canonical_json(rec.tools).decode())
        # The base is a call encoded before this one, so journaled before it (the encoder and the journal keep
        # one order); a call of the same rollout that lands meanwhile does not change that.
        request_hash = json_sha256({"messages": hashes, "tools": tools_hash, "params": rec.params})
        return PromptPart(rec.messages, rec.tools, hashes, tools_hash, prompt.system_hash, request_hash,
                          base.call_id if base_len else None, base_len, new_msgs, new_tools)

    def _new_bodies(self, prompt: PendingPrompt, start: int, answered: dict | None) -> dict:
        """hash -> (role, body) of the prompt's messages from ``start`` on that the journal does not hold yet."""
        new: dict[str, tuple[str | None, str]] = {}
        hashes, messages = prompt.hashes, prompt.messages
        for i in range(start, len(hashes)):
            h = hashes[i]
            if h in self._journaled or h in new:
                continue
            m, body = messages[i], prompt.body(i)
            if answered is not None and m == answered and canonical_json(answered).decode() == body:
                self._remember(self._journaled, h, self.max_hashes)  # the previous answer, now in the history
                continue
            new[h] = (m.get("role"), body)
        return new

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
            self._remember_bodies(prompt)

    def encode(self, rec: CallRecord, prompt: PromptPart | None = None) -> dict | None:
        """The journal operation for ``rec``; None if this encoder already encoded a call with that id.

        The answer message goes into the operation as it is: its canonical body and hash are made by the database
        side (``forge_store._write.db_apply``), off the caller's path, and so are the packed completion ids and
        logprobs."""
        _check(rec)
        if prompt is None or prompt.messages is not rec.messages or prompt.tools is not rec.tools:
            prompt = self.encode_prompt(rec)
        ids = _Ids.of(rec)
        with self._lock:
            if rec.id in self._recent_calls:
                return None
            self._remember(self._recent_calls, rec.id, self.max_hashes)
            ids.delta(self._bases.get(rec.rollout_id) if rec.rollout_id else None)
            with_call = not prompt.written  # the bodies go with the call
            if with_call:
                self._remember_bodies(prompt)
            if rec.rollout_id:
                self._bases[rec.rollout_id] = ids.base_for_next(rec.id, prompt.hashes, rec.response_message)
                self._bases.move_to_end(rec.rollout_id)
                while len(self._bases) > self.max_rollouts:
                    self._bases.popitem(last=False)
        op = {"k": "call", "r": _row(rec, prompt, ids)}
        if rec.response_message is not None:
            op["resp"] = rec.response_message
        if with_call and prompt.new_msgs:
            op["msgs"] = prompt.new_msgs
        if with_call and prompt.new_tools:
            op["tools"] = prompt.new_tools
        return op

    def _remember_bodies(self, prompt: PromptPart) -> None:
        for h in prompt.new_msgs:
            self._remember(self._journaled, h, self.max_hashes)
        if prompt.new_tools is not None:
            self._remember(self._journaled, prompt.new_tools[0], self.max_hashes)

    @staticmethod
    def _remember(lru: OrderedDict, key: str, limit: int) -> None:
        lru[key] = None
        lru.move_to_end(key)
        if len(lru) > limit:
            lru.popitem(last=False)

    def reset(self) -> None:
        """Forget what the journal holds (after a failed journal write, whose operation may hold the only copy of a
        base or a body). The prepared prompts stay: they are the same whatever the journal holds."""
        with self._lock:
            self._bases.clear()
            self._journaled.clear()
            self._recent_calls.clear()


def _row(rec: CallRecord, prompt: PromptPart, ids: _Ids) -> dict:
    """The call's row as the journal carries it."""
    return {
        "id": rec.id,
        "rollout_id": rec.rollout_id,
        "seq": rec.seq if rec.seq is not None else int(rec.started_at.timestamp() * 1e9),
        "api_surface": rec.api_surface,
        "model": rec.model or rec.params.get("model"),
        "streamed": rec.streamed,
        "request_hash": prompt.request_hash,
        "system_prompt_hash": prompt.system_hash,
        "tool_schema_hash": prompt.tools_hash,
        "request_params": rec.params,
        "prompt_base_call_id": prompt.base_call,
        "prompt_base_len": prompt.base_len,
        "prompt_tail": prompt.hashes[prompt.base_len:],
        "n_prompt_messages": len(prompt.hashes),
        "response": rec.response,
        "finish_reason": rec.finish_reason,
        **ids.columns(),
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
