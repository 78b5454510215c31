"""Token-exact trajectory reconstruction: a rollout's calls -> training segments (DESIGN "Reconstruction").

Sort the calls by ``seq``. A usable call whose engine prompt ids start with the current segment's
(prompt + response) ids extends it: the new prompt tokens (tool output, user turns, chat-template glue) go in with
mask 0, the completion with mask 1 and its logprobs. Otherwise it starts a new segment (compaction, edited history,
sub-agents, templates that strip earlier reasoning, retries that re-send an earlier prompt).

Which calls are usable (and why the others are not) is decided here and becomes exclusions upstream:

* ``infra_error``: the call carries an ``error_class`` or an upstream status >= 400 (nothing the policy produced).
* ``not_token_exact``: ``token_exact`` is false or the engine ids are missing (hosted teachers; SFT only, invariant 2).
* ``truncated``: ``finish_reason == "length"`` (configurable). A skipped truncated completion is never trained
  on; if the next call's prompt still contains it, it rides along as mask-0 context of the extended segment.
* ``logprob_mismatch``: the call's logprobs are not one per completion token (the counts are in the detail), or
  its metadata's ``logprob_mismatch`` says the recorder dropped such logprobs. Its completion is not trained on
  (PPO's ratio needs the sampling logprob of each token), rather than trained without logprobs.

A skipped call does not break the chain: the next call is compared with the segment built so far.
Positions without a sampled token (mask 0) carry logprob 0.0; a segment with any call lacking logprobs has
``response_logprobs = None`` rather than invented numbers. Multimodal calls need nothing special: image
placeholder tokens are engine prompt ids like any other; the segment lists the image blob hashes for lineage.
"""

from __future__ import annotations

import operator
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from forge_store import StoredCall, TokenCall


@dataclass
class Segment:
    """One training sample: the first call's prompt, then everything after it as the response."""

    call_ids: list[str]
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = field(default_factory=list)
    num_turns: int = 0
    tool_schema_hashes: list[str] = field(default_factory=list)
    policy_version_ids: list[str] = field(default_factory=list)
    image_hashes: list[str] = field(default_factory=list)

    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def _note(self, call: StoredCall) -> None:
        self.call_ids.append(call.id)
        self.num_turns += 1
        schema, policy = call.tool_schema_hash, call.policy_version_id
        if schema and schema not in self.tool_schema_hashes:
            self.tool_schema_hashes.append(schema)
        if policy and policy not in self.policy_version_ids:
            self.policy_version_ids.append(policy)
        for h in call.image_hashes or ():
            if h not in self.image_hashes:
                self.image_hashes.append(h)


@dataclass(frozen=True)
class CallExclusion:
    call_id: str
    reason: str
    detail: dict


@dataclass
class Reconstruction:
    segments: list[Segment]
    excluded: list[CallExclusion]
    n_calls: int
    merged: int  # calls that extended a segment instead of starting one

    @property
    def merge_rate(self) -> float:
        return self.merged / self.n_calls if self.n_calls else 0.0


def call_problem(call: StoredCall, *, keep_truncated: bool = False) -> CallExclusion | None:
    """Why ``call`` cannot be a token-level training call, or None when it can."""
    return _problem(call, call.prompt_token_ids, call.completion_token_ids, call.completion_logprobs, 1,
                    keep_truncated)


def _problem(call: StoredCall | TokenCall, prompt, completion, logprobs, width: int,
             keep_truncated: bool) -> CallExclusion | None:
    """The rules of :func:`call_problem` over a call's prompt ids, completion ids and logprobs, each a list or raw
    bytes of ``width`` bytes an item (so a :class:`TokenCall` is judged without unpacking its arrays)."""
    if call.error_class or (call.upstream_status is not None and call.upstream_status >= 400):
        return CallExclusion(call.id, "infra_error", {"error_class": call.error_class,
                                                      "upstream_status": call.upstream_status})
    if not call.token_exact or prompt is None or completion is None:
        return CallExclusion(call.id, "not_token_exact", {"token_exact": call.token_exact,
                                                          "has_ids": prompt is not None})
    if call.finish_reason == "length" and not keep_truncated:
        return CallExclusion(call.id, "truncated", {"finish_reason": "length"})
    dropped = (call.metadata or {}).get("logprob_mismatch")
    if logprobs is not None and len(logprobs) != len(completion):
        return CallExclusion(call.id, "logprob_mismatch", {"logprobs": len(logprobs) // width,
                                                           "completion_tokens": len(completion) // width})
    if dropped:
        return CallExclusion(call.id, "logprob_mismatch", dict(dropped) if isinstance(dropped, dict)
                             else {"recorded": dropped})
    return None


def _starts_with(ids: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(ids) >= len(prefix) and list(ids[: len(prefix)]) == list(prefix)


def reconstruct_rollout(calls: Iterable[StoredCall], *, keep_truncated: bool = False) -> Reconstruction:
    """Segments of one rollout plus the calls that were left out and why."""
    ordered = sorted(calls, key=lambda c: (c.seq, c.id))
    segments: list[Segment] = []
    excluded: list[CallExclusion] = []
    merged = 0
    current: Segment | None = None
    current_full: list[int] = []
    for call in ordered:
        problem = call_problem(call, keep_truncated=keep_truncated)
        if problem is not None:
            excluded.append(problem)
            continue
        prompt, completion = call.prompt_token_ids, call.completion_token_ids
        logprobs = call.completion_logprobs
        if current is not None and _starts_with(prompt, current_full):
            merged += 1
            new_prompt = prompt[len(current_full):]
            current.response_ids += new_prompt
            current.response_mask += [0] * len(new_prompt)
            if current.response_logprobs is not None:
                current.response_logprobs += [0.0] * len(new_prompt)
        else:
            current = Segment(call_ids=[], prompt_ids=list(prompt))
            segments.append(current)
        current.response_ids += completion
        current.response_mask += [1] * len(completion)
        if current.response_logprobs is not None:
            current.response_logprobs = None if logprobs is None else current.response_logprobs + list(logprobs)
        current._note(call)
        current_full = list(prompt) + list(completion)
    return Reconstruction(segments, excluded, len(ordered), merged)


class Packed:
    """A token-level array as raw little-endian bytes: ids (``"I"``, uint32), a mask (``"b"``, int8) or logprobs
    (``"f"``, float32). What the batched export carries from the store to Parquet without making Python numbers;
    it compares equal to the list it holds."""

    __slots__ = ("raw", "code")
    SIZES = {"I": 4, "b": 1, "f": 4}

    def __init__(self, raw: bytes, code: str):
        self.raw, self.code = raw, code

    def __len__(self) -> int:
        return len(self.raw) // self.SIZES[self.code]

    def tolist(self) -> list:
        arr = array(self.code)
        arr.frombytes(self.raw)
        if sys.byteorder == "big" and arr.itemsize > 1:
            arr.byteswap()
        return arr.tolist()

    def __iter__(self):
        return iter(self.tolist())

    def __eq__(self, other) -> bool:
        if isinstance(other, Packed):
            return self.code == other.code and self.raw == other.raw
        return isinstance(other, list) and self.tolist() == other

    __hash__ = None

    def __repr__(self) -> str:
        return f"Packed({self.code!r}, {len(self)} items)"


@dataclass
class TokenSegment:
    """A :class:`Segment` whose arrays are :class:`Packed` (built by :func:`reconstruct_tokens`)."""

    call_ids: list[str]
    prompt_ids: Packed
    response_ids: Packed
    response_mask: Packed
    response_logprobs: Packed | None
    num_turns: int
    tool_schema_hashes: list[str]
    policy_version_ids: list[str]
    image_hashes: list[str]

    def full_ids(self) -> Packed:
        return Packed(self.prompt_ids.raw + self.response_ids.raw, "I")


class _Building:
    """A segment while :func:`reconstruct_tokens` extends it: byte pieces, joined once at the end."""

    def __init__(self, prompt: bytes):
        self.prompt, self.ids, self.mask = prompt, [], []
        self.logprobs: list[bytes] | None = []
        self.call_ids: list[str] = []
        self.num_turns = 0
        self.tool_schema_hashes: list[str] = []
        self.policy_version_ids: list[str] = []
        self.image_hashes: list[str] = []

    _note = Segment._note

    def done(self) -> TokenSegment:
        return TokenSegment(self.call_ids, Packed(self.prompt, "I"), Packed(b"".join(self.ids), "I"),
                            Packed(b"".join(self.mask), "b"),
                            None if self.logprobs is None else Packed(b"".join(self.logprobs), "f"), self.num_turns,
                            self.tool_schema_hashes, self.policy_version_ids, self.image_hashes)


def token_call_problem(call: TokenCall, *, keep_truncated: bool = False) -> CallExclusion | None:
    """:func:`call_problem` of a :class:`TokenCall` (same rules, same details), read off its byte arrays."""
    return _problem(call, call.full, call.completion, call.logprobs, 4, keep_truncated)


_ORDER = operator.attrgetter("seq", "id")


def reconstruct_tokens(calls: Iterable[TokenCall], *, keep_truncated: bool = False) -> Reconstruction:
    """:func:`reconstruct_rollout` over :class:`TokenCall` byte arrays (``Store.token_calls``): the same segments,
    as :class:`TokenSegment`. "Extends" is one ``bytes.startswith`` (a memcmp); no token becomes a Python int."""
    ordered = sorted(calls, key=_ORDER)
    segments: list[TokenSegment] = []
    excluded: list[CallExclusion] = []
    merged = 0
    current: _Building | None = None
    current_full = b""
    for call in ordered:
        problem = token_call_problem(call, keep_truncated=keep_truncated)
        if problem is not None:
            excluded.append(problem)
            continue
        full, end, completion = call.full, call.n_prompt * 4, call.completion
        if current is not None and len(current_full) <= end and full.startswith(current_full):
            merged += 1
            new = full[len(current_full):end]
            n = len(new) // 4
            current.ids.append(new)
            current.mask.append(bytes(n))
            if current.logprobs is not None:
                current.logprobs.append(bytes(4 * n))  # float32 0.0
        else:
            if current is not None:
                segments.append(current.done())
            current = _Building(full[:end])
        current.ids.append(completion)
        current.mask.append(b"\x01" * (len(completion) // 4))
        if current.logprobs is not None:
            if call.logprobs is None:
                current.logprobs = None
            else:
                current.logprobs.append(call.logprobs)
        current._note(call)
        # the prompt and the completion: ``full`` itself unless its stored prompt length disagrees with it
        current_full = full if len(full) == end + len(completion) else full[:end] + completion
    if current is not None:
        segments.append(current.done())
    return Reconstruction(segments, excluded, len(ordered), merged)


def reconstruct(calls: Iterable[StoredCall], *, keep_truncated: bool = False) -> list[Segment]:
    """DESIGN's ``reconstruct(calls) -> segments``; see :func:`reconstruct_rollout` for the left-out calls."""
    return reconstruct_rollout(calls, keep_truncated=keep_truncated).segments
