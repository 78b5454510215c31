"""Tokens: one segment of a rollout token by token, as an export trains on it. Prompt and completion tokens as
text; policy tokens (response mask 1) coloured by the engine's probability, environment tokens (mask 0) grey; a
hover shows each token's id and logprobs; the advantage of the newest export that used the segment; the logprob
under another version where the segment was re-scored; the lowest-probability tokens listed. Where the text comes
from (and why never from a guessed tokenizer): ``dashboards/_tokenizer.py``.

Deep links: ``?page=Tokens&rollout=ID&segment=N`` (1-based), ``&call=CALL_ID`` (the segment holding that call),
``&token=K`` (a token outlined, its window shown). A segment shows ``WINDOW`` tokens at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from forge_store import NotFound, Store, StoreError, TimelineCall
from learner import reconstruct_tokens

from .._context import Context
from .._tokenizer import engine_texts, resolve
from .._tokens import (SegmentData, check_inputs, export_advantage, legend_html, lowest, rescore_options,
                       segment_data, shown_text, tokens_html, toks)
from .timeline import _pick_rollout

WINDOW = 3000


@dataclass
class _Rollout:
    segments: list[SegmentData]
    excluded: list[tuple[str, str]]  # (call id, why it is in no segment)
    n_calls: int
    timeline: dict[str, TimelineCall]


@st.cache_data(ttl=60, show_spinner=False, max_entries=4)
def _read(_store: Store, url: str, rid: str, watermark: int) -> _Rollout:
    """The rollout's segments (``Store.token_calls``: raw arrays, no prompt messages) and its timeline (answers)."""
    calls = _store.token_calls([rid]).get(rid, [])
    timeline = _store.timeline(rid)
    rec = reconstruct_tokens(calls)
    by_id, steps = {c.id: c for c in calls}, {t.id: n + 1 for n, t in enumerate(timeline)}
    return _Rollout([segment_data(s, by_id, steps) for s in rec.segments],
                    [(e.call_id, e.reason) for e in rec.excluded], len(calls), {t.id: t for t in timeline})


def _int(name: str) -> int | None:
    try:
        return int(st.query_params.get(name)) if st.query_params.get(name) is not None else None
    except ValueError:
        return None


def render(ctx: Context) -> None:
    st.header("Tokens")
    rid = _pick_rollout(ctx)
    if rid is None:
        return
    try:
        ro = _read(ctx.store, ctx.store.url, rid, ctx.store.watermark())
    except (NotFound, StoreError) as exc:
        st.warning(f"Cannot show rollout {rid}: {exc}")
        return
    if not ro.segments:
        why = ", ".join(sorted({r for _, r in ro.excluded})) or "it recorded no calls"
        st.info(f"Rollout {rid} has no token-level segment ({ro.n_calls} calls; left out: {why}). Only calls with "
                "engine token ids become segments.")
        return
    n = _segment(ro, rid)
    data = ro.segments[n - 1]
    version = ro.timeline[data.call_ids[0]].policy_version_id if data.call_ids[0] in ro.timeline else None
    folder = st.text_input("Tokenizer folder (optional: a folder with tokenizer.json, checked before use)",
                           key="tok_folder").strip() or None
    answers, first_prompt = check_inputs(ro.timeline, data)
    tt = resolve(ctx.store, version, data.ids, answers, first_prompt, folder)
    options = rescore_options(ctx.store, data.call_ids)
    other = _rescored(options, version)
    target = _int("token")
    start = _start(data, rid, n, target)
    shown = range(start, min(len(data.ids), start + WINDOW))
    low = lowest(data)
    texts = _texts(tt, data, ro.timeline, sorted(set(shown) | set(low)))
    rescored = options.get(other) if other else None
    _summary(ctx.store, rid, n, ro, data, tt, texts, other)
    st.caption(f"Tokens {shown.start}-{shown.stop - 1} of {len(data.ids):,}")
    st.html(legend_html())
    st.html(tokens_html(toks(data, shown, texts, rescored), highlight=target, rescored_as=other))
    _lowest(toks(data, low, texts, rescored), rid, n, other)


def _segment(ro: _Rollout, rid: str) -> int:
    linked = _int("segment")
    call = st.query_params.get("call")
    if call:
        linked = next((i + 1 for i, s in enumerate(ro.segments) if call in s.call_ids), linked)
    labels = [f"Segment {i + 1}: {len(s.call_ids)} calls, {len(s.ids):,} tokens" for i, s in enumerate(ro.segments)]
    default = min(max(1, linked or 1), len(labels))
    n = labels.index(st.selectbox("Segment (as an export cuts the rollout into samples)", labels, index=default - 1,
                                  key=f"tok_segment_{rid}")) + 1
    if str(n) != st.query_params.get("segment"):
        st.query_params["segment"] = str(n)
    return n


def _start(data: SegmentData, rid: str, n: int, target: int | None) -> int:
    start = 0 if target is None else max(0, min(target - WINDOW // 4, len(data.ids) - WINDOW))
    if len(data.ids) <= WINDOW:
        return 0
    return int(st.number_input(f"First token shown (0-{len(data.ids) - 1}; {WINDOW:,} at a time)", min_value=0,
                               max_value=len(data.ids) - 1, value=start, step=WINDOW // 2, key=f"tok_start_{rid}_{n}"))


def _texts(tt, data: SegmentData, timeline: dict[str, TimelineCall], positions: list[int]) -> dict[int, str | None]:
    """Text of the tokens at ``positions``: the tokenizer's, else the engine's own (completion tokens), else none."""
    decoded = tt.texts([data.ids[p] for p in positions])
    if decoded is not None:
        return dict(zip(positions, decoded))
    own = {cid: engine_texts(timeline[cid]) if cid in timeline else None for cid in data.call_ids}
    out = {}
    for p in positions:
        texts, k = own.get(data.call_ids[data.call_of[p]]), data.k[p]
        out[p] = texts[k] if texts is not None and 0 <= k < len(texts) else None
    return out


def _rescored(options: dict, version: str | None) -> str | None:
    if not options:
        return None
    names = sorted(options, key=lambda o: (o.startswith(f"{version} "), o))  # another version than the engine's first
    return st.selectbox("Logprob under another version (re-scored: `openforge rescore`)", names, key="tok_rescore")


def _summary(store: Store, rid: str, n: int, ro: _Rollout, data: SegmentData, tt, texts: dict, other) -> None:
    policy = sum(data.policy)
    scored = [x for x in data.logprobs if x is not None]
    adv, note = export_advantage(store, rid, data.call_ids[0])
    st.subheader(f"Rollout {rid} · segment {n} of {len(ro.segments)}")
    cols = st.columns(5)
    cols[0].metric("Tokens", f"{len(data.ids):,}")
    cols[1].metric("Policy tokens (mask 1)", f"{policy:,}")
    cols[2].metric("Environment tokens (mask 0)", f"{len(data.ids) - policy:,}")
    cols[3].metric("Mean engine logprob", f"{sum(scored) / len(scored):.3f}" if scored else "-")
    cols[4].metric("Advantage (latest export)",
                   f"{adv['advantage']:+.3f}" if adv and adv["advantage"] is not None else "-")
    calls = ", ".join(f"`{c}`" for c in data.call_ids[:6]) + (" ..." if len(data.call_ids) > 6 else "")
    st.caption((f"Advantage from {adv['format']} export `{adv['export'][:12]}` of {adv['created_at']}" if adv
                else f"Advantage: {note}") + f" · calls {calls} · [Timeline](?page=Timeline&rollout={rid}&call="
               f"{data.call_ids[0]}) · link to this view: `?page=Tokens&rollout={rid}&segment={n}`")
    if tt.tokenizer is not None:
        st.caption(f"Token text: {tt.source}; checked: {tt.checked}")
    elif any(t is not None for t in texts.values()):
        st.info(f"Token text: the engine's own per-token text for completion tokens; prompt tokens as ids "
                f"([id]): {tt.source}.")
    else:
        st.info(f"Token ids only ([id]): {tt.source}. Name a folder with the version's tokenizer.json above, or "
                "record the version's checkpoint folder (checkpoint_id).")
    for r in tt.rejected:
        st.caption(f"not used: {r}")
    if other:
        st.caption(f"Re-scored under {other}: hover a policy token for its logprob there.")
    if ro.excluded:
        st.caption("Calls of this rollout in no segment: " + ", ".join(f"`{c}` ({r})" for c, r in ro.excluded[:10]))


def _lowest(tokens, rid: str, n: int, other: str | None) -> None:
    st.markdown("**Lowest-probability policy tokens** (the engine's logprobs)")
    if not tokens:
        st.caption("the engine recorded no logprobs for this segment")
        return
    rows = [{"token": t.pos, "text": shown_text(t), "id": t.id,
             "engine logprob": t.logprob, "p": math.exp(t.logprob),
             **({f"under {other}": t.rescored} if other else {}), "step": t.step,
             "link": f"?page=Tokens&rollout={rid}&segment={n}&token={t.pos}"} for t in tokens]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
                 column_config={"link": st.column_config.LinkColumn("link", display_text="show"),
                                "p": st.column_config.NumberColumn(format="%.4f")})
