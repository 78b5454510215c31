"""A rollout's timeline as the Timeline page draws it: steps (one per call) grouped into segments, with the reason
each new segment started, tool results paired with the tool calls that asked for them, and timing bars.

Segments follow the learner's rule (DESIGN.md, Reconstruction): a call extends the segment when its prompt token
ids start with the previous call's prompt + completion ids (``TimelineCall.extends_tokens``, read off the store's
token delta); a call without token ids is judged by its messages. Why the prefix broke is read off the messages:
another system prompt (a sub-agent), a shorter history (compaction), a changed earlier message (edited history), or
the same messages rendered into other tokens (a template that strips earlier reasoning).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from forge_store import TimelineCall


@dataclass
class Step:
    index: int  # 1-based, as the page shows it
    call: TimelineCall
    segment: int  # 1-based
    boundary: str | None  # why a new segment starts here (None: it extends the previous call)
    tool_calls: list[dict] = field(default_factory=list)  # {id, name, arguments, result}
    tool_s: float | None = None  # seconds between this call's end and the next call's start (tools, harness)


def boundary_reason(prev: TimelineCall | None, call: TimelineCall) -> str | None:
    """Why ``call`` starts a new segment after ``prev``; None when it extends it."""
    if prev is None:
        return "first call"
    extends = call.extends_tokens if call.extends_tokens is not None else call.extends_messages
    if extends:
        return None
    if call.system_prompt_hash != prev.system_prompt_hash:
        return "another system prompt (a sub-agent, or the harness changed its instructions)"
    if call.extends_messages:
        return "same messages, other tokens (the chat template re-rendered earlier turns, e.g. stripped reasoning)"
    if call.n_prompt_messages < prev.n_prompt_messages + 1:
        return (f"compaction: the history shrank from {prev.n_prompt_messages + 1} messages to "
                f"{call.n_prompt_messages}")
    return "edited history: an earlier message differs from the previous prompt"


def _tool_calls(call: TimelineCall) -> list[dict]:
    msg = call.response_message or {}
    raw = msg.get("tool_calls") or (call.response or {}).get("tool_calls") or []
    out = []
    for tc in raw if isinstance(raw, list) else []:
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
        args = fn.get("arguments", fn.get("input"))
        out.append({"id": tc.get("id"), "name": str(fn.get("name") or ""),
                    "arguments": args if isinstance(args, str) else repr(args), "result": None})
    return out


def build(calls: list[TimelineCall]) -> list[Step]:
    """The steps of a rollout, with segments, tool results (from the next prompts' tool messages) and tool time."""
    steps: list[Step] = []
    segment, prev = 0, None
    pending: dict[str, dict] = {}  # tool_call_id -> its tool call, until a prompt brings its result
    for i, call in enumerate(calls):
        reason = boundary_reason(prev, call)
        segment += reason is not None
        for m in call.new_messages:
            if m.get("role") == "tool" and m.get("tool_call_id") in pending:
                pending.pop(m["tool_call_id"])["result"] = content_text(m)
        step = Step(index=i + 1, call=call, segment=segment, boundary=reason, tool_calls=_tool_calls(call))
        pending.update({tc["id"]: tc for tc in step.tool_calls if tc["id"]})
        if steps and steps[-1].call.ended_at is not None:
            steps[-1].tool_s = max(0.0, (call.started_at - steps[-1].call.ended_at).total_seconds())
        steps.append(step)
        prev = call
    return steps


def segments(steps: list[Step]) -> list[dict]:
    """One row per segment: its number, first and last step, calls and why it started."""
    out: dict[int, dict] = {}
    for s in steps:
        row = out.setdefault(s.segment, {"segment": s.segment, "first step": s.index, "last step": s.index,
                                         "calls": 0, "started because": s.boundary})
        row["last step"], row["calls"] = s.index, row["calls"] + 1
    return list(out.values())


def duration_s(c: TimelineCall) -> float:
    """The call's total time: its recorded latency, else from its start to its end (0 without an end)."""
    if c.latency_ms is not None:
        return c.latency_ms / 1000
    return (c.ended_at - c.started_at).total_seconds() if c.ended_at else 0.0


def timing_rows(steps: list[Step], t0: datetime | None = None) -> list[dict]:
    """Bars for the timing chart, in seconds from ``t0`` (the first step's start by default: pass the rollout's when
    ``steps`` is a window of it): time to first token, the rest of the generation, and the tool time after it."""
    if not steps:
        return []
    t0 = steps[0].call.started_at if t0 is None else t0
    rows = []
    for s in steps:
        c = s.call
        start = (c.started_at - t0).total_seconds()
        total = duration_s(c)
        ttft = min(total, (c.ttft_ms or 0) / 1000)
        for kind, a, b in (("time to first token", start, start + ttft), ("generation", start + ttft, start + total),
                           ("tools / harness", start + total, start + total + (s.tool_s or 0))):
            if b > a:
                rows.append({"step": s.index, "segment": s.segment, "kind": kind, "start_s": a, "end_s": b})
    return rows


def binned_timing(steps: list[Step], bins: int, shown: tuple[int, int] = (0, 0)) -> list[dict]:
    """The whole rollout at coarse grain: consecutive steps in at most ``bins`` groups, each with the seconds its
    calls spent per kind (time to first token, the rest of the generation, tools / harness after them), so a chart of
    a long rollout holds at most ``3 * bins`` bars. ``in_window``: the group holds a step of the 1-based inclusive
    range ``shown``."""
    size = max(1, -(-len(steps) // max(1, bins)))
    rows = []
    for i in range(0, len(steps), size):
        group = steps[i:i + size]
        lo, hi = group[0].index, group[-1].index
        total = sum(duration_s(s.call) for s in group)
        ttft = sum(min(duration_s(s.call), (s.call.ttft_ms or 0) / 1000) for s in group)
        tools = sum(s.tool_s or 0 for s in group)
        label = f"{lo}" if lo == hi else f"{lo}-{hi}"
        window = lo <= shown[1] and hi >= shown[0]
        for kind, secs in (("time to first token", ttft), ("generation", total - ttft), ("tools / harness", tools)):
            rows.append({"steps": label, "first_step": lo, "calls": len(group), "kind": kind,
                         "seconds": round(secs, 3), "in_window": window})
    return rows


def content_text(m: dict) -> str:
    """A message's content as text (text parts joined; images as ``[image]``)."""
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n".join(str(p.get("text", "[image]")) if isinstance(p, dict) else str(p) for p in c)
    return "" if c is None else str(c)
