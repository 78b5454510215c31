"""Build agent trajectories through the ``Store`` API: a demo store to try the dashboards on, and test fixtures.

``agent_calls`` turns a list of turns (tool calls + their results) into the ``CallRecord`` s a recording proxy
would have stored for a chat-completions harness: each prompt carries the history so far, each response the
assistant message with its ``tool_calls``, tool results arrive as ``role: "tool"`` messages in the next prompt.
"""

from __future__ import annotations

import json
import random
import struct
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from . import CallRecord, Store

__all__ = ["REACT_TOOLS", "T0", "Turn", "agent_calls", "png_1px", "seed_demo_store"]

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

REACT_TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"]}}},
]

def png_1px(rgb: tuple[int, int, int] = (40, 120, 200)) -> bytes:
    """A valid 1x1 PNG (a stand-in screenshot)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes([0, *rgb]))) + chunk(b"IEND", b""))


@dataclass
class Turn:
    """One model call: the tool calls it made (name, arguments) and the results the harness sent back."""

    tool_calls: list[tuple[str, dict | str]] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    text: str = ""


def agent_calls(rollout_id: str, turns: list[Turn], *, tools: list | None = None, started_at: datetime = T0,
                policy_version_id: str | None = None, instruction: str = "Fix the bug.",
                image_hashes: dict[int, list[str]] | None = None, step_s: float = 2.0) -> list[CallRecord]:
    """The calls of one rollout; results of turn i appear in the prompt of call i + 1."""
    tools = REACT_TOOLS if tools is None else tools
    history = [{"role": "system", "content": "You are a careful software agent."},
               {"role": "user", "content": instruction}]
    prompt_ids: list[int] = list(range(1, 40))
    out = []
    for i, turn in enumerate(turns):
        tcs = [{"id": f"{rollout_id}-t{i}-{j}", "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
               for j, (name, args) in enumerate(turn.tool_calls)]
        msg = {"role": "assistant", "content": turn.text or None}
        if tcs:
            msg["tool_calls"] = tcs
        completion = [1000 + (i * 7 + j) % 500 for j in range(12 + 3 * len(tcs))] + [2]
        t = started_at + timedelta(seconds=step_s * i)
        out.append(CallRecord(
            id=f"{rollout_id}-c{i}", rollout_id=rollout_id, seq=i, api_surface="chat.completions",
            messages=list(history), started_at=t, ended_at=t + timedelta(seconds=step_s * 0.8), tools=tools,
            params={"model": "demo-policy", "temperature": 1.0}, model="demo-policy",
            response={"text": msg["content"], "tool_calls": tcs or None, "reasoning": None}, response_message=msg,
            finish_reason="tool_calls" if tcs else "stop", prompt_token_ids=list(prompt_ids),
            completion_token_ids=completion, completion_logprobs=[-0.25] * len(completion),
            usage={"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion)},
            latency_ms=step_s * 800, ttft_ms=120.0, policy_version_id=policy_version_id, token_exact=True,
            image_hashes=(image_hashes or {}).get(i)))
        history.append(msg)
        for tc, result in zip(tcs, turn.results):
            history.append({"role": "tool", "tool_call_id": tc["id"], "content": result})
        prompt_ids = prompt_ids + completion + list(range(3000, 3000 + 8 * max(1, len(tcs))))
    return out


def _demo_turns(rng: random.Random, good: bool) -> list[Turn]:
    turns = [Turn([("bash", {"command": "ls"})], ["src\ntests\n"]),
             Turn([("read_file", {"path": "src/app.py"})], ["def add(a, b):\n    return a - b\n"])]
    if rng.random() < 0.4:
        turns.append(Turn([("bash", {"command": "python -m pytest -q"})],
                          ["Traceback (most recent call last):\nAssertionError: 1 != 3\nexit code 1"]))
    turns.append(Turn([("write_file", {"path": "src/app.py", "content": "def add(a, b):\n    return a + b\n"})],
                      ["wrote 2 lines"]))
    if good:
        turns.append(Turn([("bash", {"command": "python -m pytest -q"})], ["3 passed in 0.02s"]))
    if rng.random() < 0.1:
        turns.append(Turn([("bash", "{not json")], ["Error: arguments are not JSON"]))
    turns.append(Turn(text="Done: add() fixed."))
    return turns


def seed_demo_store(store: Store, *, n_tasks: int = 4, per_task: int = 4, seed: int = 0,
                    policies: tuple[str, ...] = ("policy-v1", "policy-v2")) -> list[str]:
    """A small, realistic store: tasks, two policy versions, two harnesses, rewards, one screenshot, exclusions,
    an export row. Returns the rollout ids."""
    rng = random.Random(seed)
    for i, pv in enumerate(policies):
        store.register_policy_version(pv, model_name="demo-policy", global_step=100 * (i + 1))
    harnesses = [store.register_harness("react", "1.0"), store.register_harness("mini-swe-agent", "1.1")]
    shot = store.put_blob(png_1px(), "image/png")
    ids = []
    for t in range(n_tasks):
        task = store.register_task(f"task-{t}", domain=("swe", "data")[t % 2], source="demo",
                                   metadata={"required_tools": ["bash", "write_file"], "reference_steps": 4})
        for pi, pv in enumerate(policies):
            group = store.create_group(f"g-{t}-{pv}", task_id=task, target_size=per_task, policy_version_id=pv)
            for r in range(per_task):
                rid = f"r-{t}-{pi}-{r}"
                start = T0 + timedelta(days=pi, minutes=10 * t + r)
                good = rng.random() < (0.4 + 0.3 * pi)
                store.start_rollout(rid, group_id=group, task_id=task, harness_id=harnesses[r % 2],
                                    policy_version_id=pv, backend="local", image_ref="demo:latest",
                                    image_digest="sha256:" + "ab" * 32, started_at=start)
                turns = _demo_turns(rng, good)
                images = {0: [shot]} if r == 0 else None
                for rec in agent_calls(rid, turns, started_at=start, policy_version_id=pv, image_hashes=images):
                    store.record_call(rec)
                outcome = "success" if good else ("policy_timeout" if r == 3 else "failure")
                if t == 0 and r == 2:
                    outcome = "infra_error"
                store.finish_rollout(rid, outcome, ended_at=start + timedelta(seconds=2 * len(turns) + r))
                if outcome != "infra_error":
                    store.add_reward(rid, 1.0 if good else 0.0, verifier_version="demo-1")
                else:
                    store.add_exclusion("infra_error", rollout_id=rid, detail={"kind": "sandbox_lost"})
                ids.append(rid)
    store.record_export("export-demo", format="verl", watermark=store.watermark(), query="outcome = 'success'",
                        out_dir="/tmp/openforge-demo-export", manifest={"format_version": 1, "rows": 10},
                        counts={"rows": 10, "rollouts_exported": 10})
    return ids
