"""A segment's tokens as the Tokens page draws them: every prompt and completion id in order with the response mask
(policy tokens, mask 1, carry the engine's logprob; environment tokens, mask 0, do not), the call each came from, a
re-scored logprob under another version (``openforge rescore``), the advantage the latest export gave the segment,
and the HTML the page shows (one ``<span>`` a token: colour by probability, the id and logprobs in its title).

Segments are the learner's (:func:`learner.reconstruct_tokens`, the export's default rules, over
``Store.token_calls``: raw token arrays, no prompt messages, so a 1,000-call rollout reads in a moment), so segment
N here is the sample an export trains on. The tokens are rebuilt call by call (a call adds the ids its prompt holds
past the previous prompt + completion, then its completion), so each knows its call and its place in that call's
completion, which is where a re-score's logprobs are keyed. Token objects are made only for what is drawn.
"""

from __future__ import annotations

import html
import math
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from forge_store import Store, TimelineCall, is_url, rescores

ADVANTAGE_FORMATS = ("verl", "trl")  # the formats whose shard rows carry an advantage per segment


def _ids(raw: bytes) -> list[int]:
    arr = array("I")
    arr.frombytes(raw)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tolist()


@dataclass
class SegmentData:
    """One segment's tokens as parallel lists (``call_of``: the index in ``call_ids`` of each token's call; ``k``:
    its place in that call's completion, -1 for environment tokens)."""

    call_ids: list[str]
    steps: list[int]  # each call's 1-based place in the rollout (the Timeline's step)
    ids: list[int] = field(default_factory=list)
    policy: list[bool] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    call_of: list[int] = field(default_factory=list)
    k: list[int] = field(default_factory=list)

    def add(self, ids: list[int], call: int, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.call_of += [call] * len(ids)
        if logprobs is None and not ids:
            return
        policy = logprobs is not None
        self.policy += [policy] * len(ids)
        self.logprobs += list(logprobs) if policy else [None] * len(ids)
        self.k += list(range(len(ids))) if policy else [-1] * len(ids)


def segment_data(seg, calls: dict, steps: dict[str, int]) -> SegmentData:
    """The tokens of ``seg`` (a :class:`learner` token segment) from its ``calls`` (id -> ``TokenCall``)."""
    data = SegmentData(list(seg.call_ids), [steps.get(c, 0) for c in seg.call_ids])
    full = b""
    for j, cid in enumerate(seg.call_ids):
        c = calls[cid]
        end = c.n_prompt * 4
        completion = _ids(c.completion)
        lps = c.completion_logprobs
        data.add(_ids(c.full[len(full):end]), j)
        data.add(completion, j, lps if lps is not None else [math.nan] * len(completion))
        full = c.full if len(c.full) == end + len(c.completion) else c.full[:end] + c.completion
    if len(data.ids) != len(seg.prompt_ids) + len(seg.response_ids):  # the learner's rule and this walk agree
        raise ValueError(f"segment of calls {seg.call_ids[0]}..: {len(data.ids)} tokens rebuilt, the learner has "
                         f"{len(seg.prompt_ids) + len(seg.response_ids)}")
    data.logprobs = [None if x is not None and math.isnan(x) else x for x in data.logprobs]
    return data


@dataclass
class Tok:
    pos: int
    id: int
    policy: bool
    logprob: float | None
    step: int
    text: str | None = None
    rescored: float | None = None


def toks(data: SegmentData, positions, texts: dict[int, str | None],
         rescored: dict[str, list[float]] | None) -> list[Tok]:
    """Token objects for ``positions`` (text from ``texts``, a re-scored logprob from ``rescored``: call -> its
    completion's logprobs)."""
    out = []
    for p in positions:
        lps = rescored.get(data.call_ids[data.call_of[p]]) if rescored else None
        k = data.k[p]
        out.append(Tok(p, data.ids[p], data.policy[p], data.logprobs[p], data.steps[data.call_of[p]], texts.get(p),
                       lps[k] if lps is not None and 0 <= k < len(lps) else None))
    return out


def lowest(data: SegmentData, n: int = 20) -> list[int]:
    """The places of the ``n`` policy tokens the engine gave the lowest logprob, lowest first."""
    scored = [(lp, p) for p, lp in enumerate(data.logprobs) if lp is not None]
    return [p for _, p in sorted(scored)[:n]]


def rescore_options(store: Store, call_ids: list[str]) -> dict[str, dict[str, list[float]]]:
    """The segment's re-scores: ``"version (scorer)"`` -> call id -> that call's completion logprobs."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in rescores(store, call_ids=call_ids):
        out.setdefault(f"{r.policy_version_id} ({r.scorer})", {})[r.call_id] = r.logprobs
    return out


def check_inputs(timeline: dict[str, TimelineCall], data: SegmentData) -> tuple[list, tuple | None]:
    """What :func:`dashboards._tokenizer.check` compares: each call's (id, completion ids, answer text, tool
    names), and the segment's prompt ids with its first message's text (when the first call's messages are whole)."""
    per_call: dict[int, list[int]] = {}
    for p, (c, k) in enumerate(zip(data.call_of, data.k)):
        if k >= 0:
            per_call.setdefault(c, []).append(data.ids[p])
    answers = []
    for j, cid in enumerate(data.call_ids):
        t = timeline.get(cid)
        if t is None:
            continue
        answer = (t.response_message or {}).get("content") or (t.response or {}).get("text")
        names = [str((x.get("function") or x).get("name") or "") for x in (t.response or {}).get("tool_calls") or []]
        answers.append((cid, per_call.get(j, []), answer if isinstance(answer, str) else "", names))
    first = timeline.get(data.call_ids[0])
    head = first.new_messages[0].get("content") if first and first.new_messages and not first.extends_messages \
        else None
    n_prompt = next((p for p, c in enumerate(data.call_of) if c > 0 or data.k[p] >= 0), len(data.ids))
    return answers, ((data.ids[:n_prompt], head) if isinstance(head, str) else None)


def export_advantage(store: Store, rollout_id: str, first_call_id: str, limit: int = 50) -> tuple[dict | None, str]:
    """The advantage the newest export (of the latest ``limit``) that holds this segment gave it: its shard row is
    the one of this rollout whose ``call_ids`` start with the segment's first call. (row or None, a note)."""
    skipped = []
    for x in store.stats.exports(limit):
        if x["format"] not in ADVANTAGE_FORMATS:
            continue
        folder = x["out_dir"] or ""
        if is_url(folder):
            skipped.append(f"{x['id'][:12]} (at {folder})")
            continue
        files = [Path(folder) / f["path"] for f in (x["manifest"] or {}).get("files", ())
                 if f["path"].endswith(".parquet") and not f["path"].startswith("rl_prompts")]
        if not files or not all(f.is_file() for f in files):
            skipped.append(f"{x['id'][:12]} (its shards are not in {folder} here)")
            continue
        for f in files:
            rows = pq.read_table(f, columns=["rollout_id", "call_ids", "advantage"],
                                 filters=[("rollout_id", "=", rollout_id)]).to_pylist()
            for r in rows:
                if (r["call_ids"] or [None])[0] == first_call_id:
                    return {"export": x["id"], "format": x["format"], "created_at": x["created_at"],
                            "advantage": r["advantage"]}, ""
    note = "no export holds this segment" + (f"; not read: {', '.join(skipped)}" if skipped else "")
    return None, note


# ---- drawing ----------------------------------------------------------------------------------------------------
CSS = """<style>
.of-tokens{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;line-height:1.9;white-space:pre-wrap;
  word-break:break-all}
.of-tokens span.t{padding:1px 0;border-radius:2px}
.of-tokens span.e{color:#6b7280;background:#eef0f3}
.of-tokens span.p{color:#111;border-bottom:2px solid #1d4ed8}
.of-tokens span.hl{outline:2px solid #000;outline-offset:1px}
.of-tokens span.step{font-family:sans-serif;font-size:11px;color:#fff;background:#374151;border-radius:3px;
  padding:0 4px;margin:0 3px}
</style>"""


def colour(logprob: float | None) -> str:
    """Red (p near 0) through yellow to green (p near 1), by the token's probability."""
    p = 0.0 if logprob is None else math.exp(max(-50.0, min(0.0, logprob)))
    return f"hsl({120 * p:.0f},80%,78%)"


def title(t: Tok, rescored_as: str | None) -> str:
    parts = [f"#{t.pos} id {t.id}", "policy (mask 1)" if t.policy else "environment (mask 0)", f"step {t.step}"]
    if t.logprob is not None:
        parts.append(f"logprob {t.logprob:.4f} (p {math.exp(t.logprob):.3f})")
    if t.rescored is not None and rescored_as:
        parts.append(f"under {rescored_as}: {t.rescored:.4f}")
    return " · ".join(parts)


def shown_text(t: Tok) -> str:
    if t.text is None:
        return f"[{t.id}]"
    return t.text.replace("\n", "\u21b5\n").replace("\t", "\u2192\t") or "\u2205"


def tokens_html(tokens: list[Tok], highlight: int | None = None, rescored_as: str | None = None) -> str:
    """One span a token (class ``p`` policy / ``e`` environment, ``data-pos``, ``data-id``, a title with its id and
    logprobs), a step label where a call's tokens begin."""
    out, step = [CSS, '<div class="of-tokens">'], None
    for t in tokens:
        if t.step != step:
            step = t.step
            out.append(f'<span class="step">step {step}</span>')
        cls = "t p" if t.policy else "t e"
        if t.pos == highlight:
            cls += " hl"
        style = f' style="background:{colour(t.logprob)}"' if t.policy and t.logprob is not None else ""
        out.append(f'<span class="{cls}" id="tok-{t.pos}" data-pos="{t.pos}" data-id="{t.id}"{style} '
                   f'title="{html.escape(title(t, rescored_as))}">{html.escape(shown_text(t))}</span>')
    out.append("</div>")
    return "".join(out)


def legend_html() -> str:
    stops = "".join(f'<span class="t p" style="background:{colour(math.log(p))}">p {p:g}</span> '
                    for p in (0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99))
    return (CSS + '<div class="of-tokens">policy tokens (mask 1), coloured by the engine\'s probability: ' + stops +
            ' · <span class="t e">environment tokens (mask 0: prompt, tool results)</span> · '
            '<span class="step">step N</span> where a call\'s tokens begin</div>')
