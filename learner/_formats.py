"""Exporters: how a planned group becomes rows of each trainer's format. Registered under short names.

* ``verl``: ``trajectories-*.parquet`` (veRL AgentLoopOutput fields + ``advantage`` + lineage; key
  ``{uid}_{session}_{index}`` = group, rollout, segment) and ``rl_prompts-*.parquet`` (one row per group:
  data_source, prompt, reward_model, extra_info, agent_name; rows for veRL's ``openforge`` agent loop, see
  :func:`rl_prompt_row`). Screenshots ride as veRL's multimodal loops take them: a trajectory row's
  ``multi_modal_data.images`` (the segment's prompt's images in order; veRL's ``process_image`` opens each
  ``{"bytes", "path"}``), an RL prompt row's ``images`` with an ``<image>`` in the prompt text where each was.
* ``trl``: ``samples-*.parquet`` with rollout_func's prompt_ids, completion_ids, logprobs, env_mask.
* ``sft``: ``conversations-*.parquet`` in TRL's conversational format (``messages`` as a list of message structs,
  ``tools`` as JSON schemas), which ``SFTTrainer`` trains on unchanged; accepts calls that are not token-exact.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Protocol

import pyarrow as pa

from ._plan import GroupPlan, Planner, RolloutPlan, rollout_purpose
from ._sft import MESSAGE

_ints = pa.list_(pa.int32())
_strs = pa.list_(pa.string())
LINEAGE_FIELDS = [
    pa.field("group_id", pa.string()), pa.field("rollout_id", pa.string()), pa.field("task_id", pa.string()),
    pa.field("call_ids", _strs), pa.field("harness_id", pa.string()), pa.field("image_digest", pa.string()),
    pa.field("policy_version_id", pa.string()), pa.field("tool_schema_hashes", _strs),
    pa.field("reward_id", pa.string()), pa.field("reward_source", pa.string()),
    pa.field("verifier_version", pa.string()), pa.field("image_hashes", _strs),
]


# A screenshot as HF datasets' Image feature stores it and veRL's ``process_image`` reads it ({"bytes": ...}); ``path``
# names the blob (sha256:<hex>), so a row's images trace back to the store.
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
IMAGE_PLACEHOLDER = "<image>"  # where an image goes in an RL prompt's text (veRL's RLHFDataset splits on it)
_IMAGE_PART_TYPES = ("image_url", "input_image", "image")
_BLOB_REF = re.compile(r"openforge-blob:sha256:([0-9a-f]{64})")


def _images(planner: Planner, hashes) -> list[dict] | None:
    """The screenshots named by ``hashes`` (in order, repeats kept: one per image in the prompt), or None."""
    return [{"bytes": planner.store.get_blob(h), "path": f"sha256:{h}"} for h in hashes or ()] or None


def _prompt_text(content) -> tuple[str, list[str]]:
    """An RL prompt message's text and the blob hashes of its images: a content list with image parts becomes its
    text with ``<image>`` where each image was; other lists stay JSON."""
    if isinstance(content, str):
        return content, []
    parts = content if isinstance(content, list) else []
    if not any(isinstance(p, dict) and p.get("type") in _IMAGE_PART_TYPES for p in parts):
        return json.dumps(content, sort_keys=True), []
    text, hashes = [], []
    for p in parts:
        if isinstance(p, dict) and p.get("type") in _IMAGE_PART_TYPES:
            text.append(IMAGE_PLACEHOLDER)
            hashes += _BLOB_REF.findall(json.dumps(p))[:1]
        elif isinstance(p, dict):
            text.append(str(p.get("text", "")))
    return "".join(text), hashes


def key_part(value: str) -> str:
    """An id usable inside a veRL key: unchanged unless it holds ``_``, then ``h`` + 24 hex of its sha256."""
    return value if "_" not in value else "h" + hashlib.sha256(value.encode()).hexdigest()[:24]


def _lineage(rp: RolloutPlan, call_ids: list[str], schemas: list[str], images: list[str]) -> dict:
    i, r = rp.info, rp.reward
    return dict(group_id=i.group_id, rollout_id=i.id, task_id=i.task_id, call_ids=call_ids, harness_id=i.harness_id,
                image_digest=i.image_digest, policy_version_id=i.policy_version_id, tool_schema_hashes=schemas,
                reward_id=r.id if r else None, reward_source=r.source if r else None,
                verifier_version=r.verifier_version if r else None, image_hashes=images)


def _segments(plan: GroupPlan, gamma: float):
    for rp in plan.rollouts:
        for idx, (seg, rew, adv) in enumerate(zip(rp.recon.segments, rp.segment_rewards(gamma),
                                                  rp.segment_advantages(gamma))):
            yield rp, idx, seg, rew, adv


RL_AGENT_NAME = "openforge"  # the veRL agent loop that runs these rows (openforge/verl_loop.py)


def rl_prompt_row(prompt: list[dict], *, index: int, group_id: str, task_id: str | None, task_source: str | None,
                  harness: str | None, verifier_hash: str | None) -> dict:
    """One row of veRL's RL parquet for the ``openforge`` agent loop, runnable by veRL's stock V1 trainer.

    ``agent_name`` names the loop (registered in veRL as ``openforge``), not the harness: the harness rides in
    ``extra_info.harness`` and the loop runs it. The reward is the task's verifier's, which the loop returns with
    every output (``reward_score``), so veRL never calls a reward function on these rows; ``data_source`` is
    ``openforge`` and ``reward_model.ground_truth`` empty so that one never mistakes the row for a dataset with a
    rule-based answer (veRL's ``default_compute_score`` refuses the unknown source instead of inventing a reward).
    The task's own source and the verifier's hash are in ``extra_info``."""
    return dict(data_source=RL_AGENT_NAME, prompt=prompt,
                reward_model={"style": "openforge-verifier", "ground_truth": ""},
                extra_info={"index": index, "uid": key_part(group_id), "group_id": group_id, "task_id": task_id,
                            "task_source": task_source, "harness": harness, "verifier_hash": verifier_hash},
                agent_name=RL_AGENT_NAME)


class Exporter(Protocol):
    name: str
    schemas: dict[str, pa.Schema]  # file prefix -> Arrow schema

    def rows(self, plan: GroupPlan, planner: Planner) -> dict[str, list[dict]]: ...


class VerlExporter:
    name = "verl"
    schemas = {
        "rl_prompts": pa.schema([
            pa.field("data_source", pa.string()),
            pa.field("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            pa.field("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            pa.field("extra_info", pa.struct([
                ("index", pa.int64()), ("uid", pa.string()), ("group_id", pa.string()), ("task_id", pa.string()),
                ("task_source", pa.string()), ("harness", pa.string()), ("verifier_hash", pa.string())])),
            pa.field("agent_name", pa.string()),
            pa.field("images", pa.list_(IMAGE)),  # the prompt's screenshots, one per <image>; null without
        ]),
        "trajectories": pa.schema([
            pa.field("key", pa.string()), pa.field("uid", pa.string()), pa.field("session", pa.string()),
            pa.field("index", pa.int32()), pa.field("prompt_ids", _ints), pa.field("response_ids", _ints),
            pa.field("response_mask", pa.list_(pa.int8())), pa.field("response_logprobs", pa.list_(pa.float32())),
            pa.field("reward_score", pa.float64()), pa.field("advantage", pa.float64()),
            pa.field("num_turns", pa.int32()), *LINEAGE_FIELDS,
            # AgentLoopOutput.multi_modal_data as veRL's multimodal agent loops fill it: {"images": [...]}, the
            # screenshots of the segment's prompt in prompt order; null for a text-only segment
            pa.field("multi_modal_data", pa.struct([("images", pa.list_(IMAGE))])),
        ]),
    }

    # rl_prompts' extra_info.index counts the export's prompt rows: export workers number each run's from 0 and
    # the exporting process moves them on (learner._export_workers.renumber)
    running_index = {"rl_prompts": ("extra_info", "index")}

    def __init__(self) -> None:
        self.n_prompts = 0

    def rows(self, plan: GroupPlan, planner: Planner) -> dict[str, list[dict]]:
        traj = []
        for rp, idx, seg, rew, adv in _segments(plan, planner.cfg.gamma):
            uid, session = key_part(plan.key), key_part(rp.info.id)
            traj.append(dict(key=f"{uid}_{session}_{idx}", uid=uid, session=session, index=idx,
                             prompt_ids=seg.prompt_ids, response_ids=seg.response_ids,
                             response_mask=seg.response_mask, response_logprobs=seg.response_logprobs,
                             reward_score=rew, advantage=adv, num_turns=seg.num_turns,
                             multi_modal_data=self._multi_modal(planner, rp, seg),
                             **_lineage(rp, seg.call_ids, seg.tool_schema_hashes, seg.image_hashes)))
        if not traj:
            return {"trajectories": []}
        first = next(rp for rp in plan.rollouts if rp.calls)
        task = planner.tasks.get(first.info.task_id or "", {})
        harness = planner.harnesses.get(first.info.harness_id or "", {})
        texts = [(str(m.get("role")), *_prompt_text(m.get("content"))) for m in first.calls[0].messages]
        prompt = [{"role": role, "content": text} for role, text, _ in texts]
        self.n_prompts += 1
        return {"trajectories": traj, "rl_prompts": [{**rl_prompt_row(
            prompt, index=self.n_prompts - 1, group_id=plan.key, task_id=first.info.task_id,
            task_source=task.get("source") or task.get("domain"), harness=harness.get("name"),
            verifier_hash=task.get("verifier_hash")), "images": _images(planner, [h for *_, hs in texts for h in hs])}]}

    @staticmethod
    def _multi_modal(planner: Planner, rp: RolloutPlan, seg) -> dict | None:
        """The segment's last prompt holds every screenshot of the segment (each call extends the previous one)."""
        if not seg.image_hashes:  # no call of the segment had a screenshot (its hashes are theirs, deduplicated)
            return None
        last = next((c for c in rp.calls if c.id == seg.call_ids[-1]), None) if seg.call_ids else None
        images = _images(planner, last.image_hashes if last is not None else None)
        return {"images": images} if images else None


class TrlExporter:
    name = "trl"
    schemas = {"samples": pa.schema([
        pa.field("prompt_ids", _ints), pa.field("completion_ids", _ints), pa.field("logprobs", pa.list_(pa.float32())),
        pa.field("env_mask", pa.list_(pa.int8())), pa.field("reward", pa.float64()), pa.field("advantage", pa.float64()),
        pa.field("segment_index", pa.int32()), *LINEAGE_FIELDS,
    ])}

    def rows(self, plan: GroupPlan, planner: Planner) -> dict[str, list[dict]]:
        return {"samples": [dict(prompt_ids=seg.prompt_ids, completion_ids=seg.response_ids,
                                 logprobs=seg.response_logprobs, env_mask=seg.response_mask, reward=rew,
                                 advantage=adv, segment_index=idx,
                                 **_lineage(rp, seg.call_ids, seg.tool_schema_hashes, seg.image_hashes))
                            for rp, idx, seg, rew, adv in _segments(plan, planner.cfg.gamma)]}


class SftExporter:
    """Whole conversations in TRL's conversational format (``messages`` + ``tools``); see :mod:`learner._sft`."""

    name = "sft"
    schemas = {"conversations": pa.schema([
        pa.field("messages", pa.list_(MESSAGE)), pa.field("tools", pa.list_(pa.json_())),
        pa.field("reward", pa.float64()), pa.field("token_exact", pa.bool_()), pa.field("segment_index", pa.int32()),
        pa.field("purpose", pa.string()), *LINEAGE_FIELDS,
    ])}

    def rows(self, plan: GroupPlan, planner: Planner) -> dict[str, list[dict]]:
        out = []
        for rp in plan.rollouts:
            for idx, conv in enumerate(rp.convs):
                calls = conv.calls
                schemas = sorted({c.tool_schema_hash for c in calls if c.tool_schema_hash})
                images = sorted({h for c in calls for h in (c.image_hashes or ())})
                out.append(dict(messages=conv.messages, tools=conv.tools,
                                reward=rp.reward.value if rp.reward else None,
                                token_exact=all(c.token_exact for c in calls), segment_index=idx,
                                purpose=rollout_purpose(rp.info),
                                **_lineage(rp, [c.id for c in calls], schemas, images)))
        return {"conversations": out}


EXPORTERS = {"verl": VerlExporter, "trl": TrlExporter, "sft": SftExporter}


def get_exporter(name: str) -> Exporter:
    try:
        return EXPORTERS[name]()
    except KeyError:
        raise ValueError(f"--format {name!r} unknown: use one of {', '.join(EXPORTERS)}") from None
