"""Timeline: a whole rollout in order. Segments with the reason each started, rewards from every source and
exclusions, timing bars (time to first token, generation, tool time), a step index, then every step as a collapsible
block: its new prompt messages, the answer, tool calls with their results, screenshots with the click drawn, errors.

Deep links: ``?page=Timeline&rollout=ID&step=N`` opens the rollout at step N (``&call=CALL_ID``: at that call).
Steps are shown a window of ``WINDOW`` at a time and the page reads ``Store.timeline`` (what each call adds), never
every call's full prompt. The browser's drawing bounds what the page holds: a rollout longer than ``DETAIL_MAX``
steps gets its timing chart at coarse grain (at most ``BINS`` bars per kind) plus the window's calls one by one,
and the step index (a single dataframe) gives every call's latency, time to first token and tool time. A step's
content is written only while its block is open (the linked step's is; opening another reruns the script).
"""

from __future__ import annotations

import json

import altair as alt
import pandas as pd
import streamlit as st

from forge_store import NotFound, StoreError

from .._context import Context
from .._queries import rollout_page
from .._timeline import Step, binned_timing, build, content_text, duration_s, segments, timing_rows
from .trajectories import _screen

WINDOW = 20  # steps drawn in full at a time
DETAIL_MAX = 100  # a rollout up to this long gets one bar per call and kind; a longer one at coarse grain
BINS = 100  # the coarse chart's most bars per kind
KINDS = ["time to first token", "generation", "tools / harness"]


def render(ctx: Context) -> None:
    st.header("Timeline")
    rid = _pick_rollout(ctx)
    if rid is None:
        return
    try:
        info = ctx.store.rollout(rid)
        calls = ctx.store.timeline(rid)
        rewards = ctx.store.rewards(rid)
        excluded = ctx.store.exclusion_reasons([rid]).get(rid, set())
    except (NotFound, StoreError) as exc:
        st.warning(f"Cannot show rollout {rid}: {exc}")
        return
    steps = build(calls)
    st.subheader(f"Rollout {rid}")
    cols = st.columns(5)
    cols[0].metric("Outcome", info.outcome or info.status)
    cols[1].metric("Steps", len(steps))
    cols[2].metric("Segments", steps[-1].segment if steps else 0)
    cols[3].metric("Task", info.task_id or "-")
    cols[4].metric("Policy version", info.policy_version_id or "-")
    st.caption(f"Link to this view: `?page=Timeline&rollout={rid}&step=1` · "
               f"[Trajectories](?page=Trajectories&rollout={rid})"
               + (f" · [its GRPO group](?page=Group&group={info.group_id})" if info.group_id else ""))
    _rewards_and_exclusions(rewards, excluded)
    if not steps:
        st.info("This rollout recorded no model calls.")
        return
    _segments(steps)
    _index_and_steps(ctx, rid, steps)


def _pick_rollout(ctx: Context) -> str | None:
    linked = st.query_params.get("rollout")
    rows, _ = rollout_page(ctx.store, ctx.window, {}, page=0, page_size=200, reward_sources=ctx.reward_sources)
    ids = [] if rows.empty else list(rows["id"])
    if linked and linked not in ids:
        ids.insert(0, linked)
    if not ids:
        st.info("No rollouts in this time window; widen the date range in the sidebar.")
        return None
    rid = st.selectbox("Rollout (the newest 200 in the window, or the linked one)", ids, key="tl_rollout",
                       index=ids.index(linked) if linked in ids else 0)
    if rid != linked:
        st.query_params["rollout"] = rid
    return rid


def _rewards_and_exclusions(rewards, excluded: set[str]) -> None:
    left, right = st.columns(2)
    with left:
        st.markdown("**Rewards** (every source, oldest first; the latest of the chosen sources counts)")
        if rewards:
            st.dataframe(pd.DataFrame([{"value": r.value, "source": r.source, "verifier": r.verifier_version,
                                        "at": r.created_at} for r in rewards]), hide_index=True, width="stretch")
        else:
            st.caption("no reward recorded")
    with right:
        st.markdown("**Exclusions** (why it is not training data)")
        if excluded:
            for reason in sorted(excluded):
                st.markdown(f"- `{reason}`")
        else:
            st.caption("none: this rollout may become training data")


def _segments(steps: list[Step]) -> None:
    rows = segments(steps)
    with st.expander(f"Segments ({len(rows)}): where a new training sample starts, and why", expanded=len(rows) > 1):
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


def _timing_chart(data: pd.DataFrame, height: int) -> alt.Chart:
    """A Gantt of calls: one bar per call and kind, on the rollout's time axis."""
    return alt.Chart(data).mark_bar().encode(
        x=alt.X("start_s:Q", title="seconds since the first call"), x2="end_s:Q",
        y=alt.Y("step:O", title="step", axis=alt.Axis(labelOverlap=True)),
        color=alt.Color("kind:N", title=None, sort=KINDS),
        tooltip=["step", "segment", "kind", alt.Tooltip("start_s:Q", format=".2f"),
                 alt.Tooltip("end_s:Q", format=".2f")]).properties(height=height)


def _timing(steps: list[Step], shown: list[Step]) -> None:
    """Every call's bars for a rollout of up to ``DETAIL_MAX`` steps; a longer one at coarse grain (at most ``BINS``
    groups of consecutive steps, the window's highlighted) with the window's calls in detail below: 3,000 bars of a
    1,000-call rollout read as a smear. (A CPU profile of one open put Vega at about 0.5 s; most of an open's browser
    time is Streamlit's own page, see bench/timeline_render.py in the README.)"""
    if len(steps) <= DETAIL_MAX:
        data = pd.DataFrame(timing_rows(steps))
        if not data.empty:
            st.altair_chart(_timing_chart(data, min(900, max(120, 12 * len(steps)))), width="stretch")
        return
    data = pd.DataFrame(binned_timing(steps, BINS, (shown[0].index, shown[-1].index)))
    per = int(data["calls"].max())
    st.caption(f"The whole rollout, {per} consecutive steps per bar (seconds spent in each kind; the steps shown "
               "below are highlighted). Every call's figures are in the step index; the shown steps' calls are "
               "drawn one by one under it.")
    chart = alt.Chart(data).mark_bar().encode(
        x=alt.X("steps:O", title="steps", sort=alt.SortField("first_step"), axis=alt.Axis(labelOverlap=True)),
        y=alt.Y("sum(seconds):Q", title="seconds"),
        color=alt.Color("kind:N", title=None, sort=KINDS),
        opacity=alt.condition("datum.in_window", alt.value(1.0), alt.value(0.35)),
        tooltip=["steps", "calls", "kind", alt.Tooltip("seconds:Q", format=".2f")]).properties(height=260)
    st.altair_chart(chart, width="stretch")


def _window_timing(steps: list[Step], shown: list[Step]) -> None:
    if len(steps) <= DETAIL_MAX:
        return  # the chart above draws every call
    data = pd.DataFrame(timing_rows(shown, t0=steps[0].call.started_at))
    if not data.empty:
        with st.expander(f"Timing of steps {shown[0].index}-{shown[-1].index}, call by call", expanded=True):
            st.altair_chart(_timing_chart(data, max(120, 14 * len(shown))), width="stretch")


def _index(steps: list[Step]) -> None:
    index = pd.DataFrame([{"step": s.index, "segment": s.segment, "tools": ", ".join(t["name"] for t in s.tool_calls),
                           "finish": s.call.finish_reason, "error": s.call.error_class,
                           "latency_s": round(duration_s(s.call), 2),
                           "ttft_s": None if s.call.ttft_ms is None else round(s.call.ttft_ms / 1000, 2),
                           "tool_s": None if s.tool_s is None else round(s.tool_s, 2),
                           "completion tokens": s.call.n_completion_tokens} for s in steps])
    with st.expander(f"Step index ({len(steps)} steps)", expanded=len(steps) > WINDOW):
        st.dataframe(index, hide_index=True, width="stretch", height=min(400, 36 + 35 * len(steps)))


def _target(steps: list[Step]) -> int:
    """The step the page opens at: the linked call's, else ``&step=N``, as the jump box holds it."""
    by_call = {s.call.id: s.index for s in steps}
    try:
        linked = by_call.get(st.query_params.get("call")) or int(st.query_params.get("step", 1))
    except ValueError:
        linked = 1
    target = int(st.number_input(f"Jump to step (1-{len(steps)})", min_value=1, max_value=len(steps),
                                 value=min(max(1, linked), len(steps)), key="tl_step"))
    if str(target) != st.query_params.get("step"):
        st.query_params["step"] = str(target)
    return target


def _index_and_steps(ctx: Context, rid: str, steps: list[Step]) -> None:
    timing = st.container()  # drawn once the window is known, above the index
    _index(steps)
    target = _target(steps)
    first = max(0, min(target - 1 - WINDOW // 4, len(steps) - WINDOW))
    shown = steps[first:first + WINDOW]
    with timing, st.expander("Timing: time to first token, generation, tools between calls", expanded=True):
        _timing(steps, shown)
    st.caption(f"Steps {shown[0].index}-{shown[-1].index} of {len(steps)}")
    _window_timing(steps, shown)
    for s in shown:
        if s.boundary is not None:
            st.markdown(f"---\n**Segment {s.segment} starts at step {s.index}:** {s.boundary}")
        _step(ctx, rid, s, expanded=s.index == target, key=f"tl_open_{rid}_{target}_{s.index}")


def _arguments(raw: str) -> str:
    """A tool call's arguments as indented JSON in plain monospace text (what was sent, as is, when it is not JSON).
    Not ``st.code``: its syntax highlighter is a 1.5 MB script the browser fetches and compiles for the open step's
    blocks alone; without it the 1,000-call Timeline opened in 1.97-1.98 s against 2.16-2.28 s (median of 5 opens,
    two runs each, bench/timeline_render.py, 2026-12-04)."""
    try:
        return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return raw


def _step(ctx: Context, rid: str, s: Step, expanded: bool, key: str) -> None:
    """One step as an expander whose content the script writes only while it is open (opening one reruns the
    script): the browser draws the linked step, not the messages, code blocks and screenshots of the whole window."""
    c = s.call
    tools = ", ".join(t["name"] for t in s.tool_calls) or (c.finish_reason or "answer")
    timing = f"{duration_s(c):.2f} s" + (f" (first token {c.ttft_ms / 1000:.2f} s)" if c.ttft_ms else "")
    title = f"Step {s.index} · {tools} · {timing}" + (" · ERROR" if c.error_class else "")
    box = st.expander(title, expanded=expanded, key=key, on_change="rerun")
    if not box.open:
        return
    with box:
        st.caption(f"call {c.id} · seq {c.seq} · segment {s.segment} · {c.n_prompt_tokens or 0} prompt / "
                   f"{c.n_completion_tokens or 0} completion tokens · finish `{c.finish_reason}` · policy "
                   f"`{c.policy_version_id}` · token-exact {c.token_exact}"
                   + (f" · then {s.tool_s:.2f} s of tools" if s.tool_s is not None else "")
                   + (f" · [tokens](?page=Tokens&rollout={rid}&call={c.id})" if c.token_exact else ""))
        if c.error_class:
            st.error(f"{c.error_class} (HTTP {c.upstream_status}): {c.error_detail or ''}")
        new = [m for m in c.new_messages if m.get("role") not in ("assistant", "tool")]
        for m in new:
            with st.chat_message(m.get("role") or "message"):
                st.text(content_text(m)[:4000])
        answer = c.response_message or {}
        if content_text(answer):
            with st.chat_message("assistant"):
                st.text(content_text(answer)[:4000])
        for t in s.tool_calls:
            st.markdown(f"`{t['name']}`")
            st.text(_arguments(t["arguments"])[:4000])
            if t["result"] is None:
                st.caption("no tool result in a later prompt")
            else:
                st.text(t["result"][:4000])
        if c.image_hashes:
            _screen(ctx, c)
