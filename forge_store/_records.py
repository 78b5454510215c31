"""Record types that cross the store's edge: what callers write and what reads return.

Plain dataclasses (the proxy builds one ``CallRecord`` per model call on its hot path). Outcomes, exclusion reasons
and reward sources are closed sets checked on write: an unknown one is an error, not a new category. A call's API
surface is open: its client names it (the proxy, one name per wire protocol it speaks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._tokens import IdsText

# DESIGN.md outcome taxonomy; "cancelled" is a run stopped by the user (Ctrl-C), neither graded nor retried.
OUTCOMES = ("success", "failure", "policy_timeout", "harness_error", "infra_error", "cancelled")

EXCLUSION_REASONS = (
    "infra_error",
    "stale_policy",
    "no_reward",
    "incomplete_group",
    "not_token_exact",
    "truncated",
    "filtered",
    "missing_data",
    "evaluation",  # an evaluation rollout (run purpose "eval"): measured, never trained on
    "teacher",  # a teacher's demonstration (run purpose "teacher"): SFT data, never in a GRPO shard
    "store_damaged",  # the store cannot give the call back (the database refused it, or its delta lost its base)
    "logprob_mismatch",  # the call's logprobs are not one per completion token
    "redacted",  # a call's text was redacted: its token ids still carry the secret (invariant 9)
    "erased",  # the rollout was erased (openforge erase, retention): its tombstone says by whom and why
    "harness_self_call",  # a call the harness made for itself (a title, a routing check): not its work on the task
)

REWARD_SOURCES = ("verifier", "judge", "human", "api")


@dataclass
class CallRecord:
    """One model call as a protocol adapter saw it, normalised to chat messages.

    ``messages`` is the prompt as a list of chat messages (a system prompt given as a separate field is the first
    message with role "system"); ``tools`` the declared tools; ``params`` everything else the harness sent (model,
    sampling parameters, unknown fields), so nothing is dropped. Images should already be replaced by blob
    references (``put_blob``) and listed in ``image_hashes`` (a ``Store.begin_call`` draft does that). ``api_surface``: the API
    the call came through (any name; the proxy's are "chat.completions", "completions", "responses", "messages").
    The store makes the call's request hash from messages + tools + params (``StoredCall.request_hash``).
    """

    id: str
    api_surface: str
    messages: list[dict]
    started_at: datetime
    rollout_id: str | None = None
    seq: int | None = None
    tools: list | None = None
    params: dict = field(default_factory=dict)
    streamed: bool = False
    model: str | None = None
    response: dict | None = None
    response_message: dict | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | IdsText | None = None  # IdsText: as the engine's JSON text (the proxy)
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    usage: dict | None = None
    ended_at: datetime | None = None
    ttft_ms: float | None = None
    latency_ms: float | None = None
    upstream_status: int | None = None
    error_class: str | None = None
    error_detail: str | None = None
    retry_of: str | None = None
    policy_version_id: str | None = None
    token_exact: bool = False
    image_hashes: list[str] | None = None
    metadata: dict | None = None


@dataclass(frozen=True)
class RolloutInfo:
    id: str
    group_id: str | None
    run_id: str | None
    task_id: str | None
    harness_id: str | None
    policy_version_id: str | None
    backend: str | None
    image_ref: str | None
    image_digest: str | None
    pod_name: str | None
    node_name: str | None
    attempt: int
    retry_of: str | None
    status: str
    outcome: str | None
    outcome_detail: str | None
    metadata: dict | None
    started_at: datetime
    ended_at: datetime | None
    ingest_seq: int
    finished_seq: int | None
    task_version_id: str | None = None


@dataclass(frozen=True)
class StoredCall:
    """A call read back with its deltas resolved: full prompt messages and full prompt token ids."""

    id: str
    rollout_id: str | None
    seq: int
    api_surface: str
    model: str | None
    streamed: bool
    request_hash: str
    system_prompt_hash: str | None
    tool_schema_hash: str | None
    params: dict
    messages: list[dict]
    message_hashes: list[str]
    tools: list | None
    response: dict | None
    response_message: dict | None
    response_message_hash: str | None
    finish_reason: str | None
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    completion_logprobs: list[float] | None
    usage: dict | None
    started_at: datetime
    ended_at: datetime | None
    ttft_ms: float | None
    latency_ms: float | None
    upstream_status: int | None
    error_class: str | None
    error_detail: str | None
    retry_of: str | None
    policy_version_id: str | None
    token_exact: bool
    image_hashes: list[str] | None
    metadata: dict | None
    ingest_seq: int


@dataclass(frozen=True)
class RewardInfo:
    id: str
    rollout_id: str
    value: float
    source: str
    verifier_version: str | None
    evidence_blob: str | None
    detail: dict | None
    created_at: datetime
    ingest_seq: int


@dataclass(frozen=True)
class EventInfo:
    id: str
    rollout_id: str | None
    kind: str
    source: str
    time: datetime
    detail: dict | None
    ingest_seq: int


@dataclass(frozen=True)
class Trajectory:
    """Everything recorded for one rollout, in order."""

    rollout: RolloutInfo
    calls: list[StoredCall]
    rewards: list[RewardInfo]
    events: list[EventInfo]


@dataclass(frozen=True)
class RolloutFilter:
    """Which rollouts ``iter_rollouts`` yields; every field given must match (None = any)."""

    run_id: str | None = None
    group_id: str | None = None
    task_id: str | None = None
    policy_version_id: str | None = None
    outcome: str | None = None
    finished: bool | None = None
