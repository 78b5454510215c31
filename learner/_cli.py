"""The learner's commands: ``openforge export`` (and ``export verify MANIFEST``), ``openforge analyze`` and
``openforge lineage VERSION``.

Declared as entry points in ``pyproject.toml`` (the root discovers them); heavy imports wait until a command runs.
``analyze`` opens the store read-only (an empty database is reported, never given a schema).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ._formats import EXPORTERS
from ._report import print_table

export_app = typer.Typer(help="Export training shards (veRL, TRL, SFT) and verify exports.",
                         invoke_without_command=True)
console, err = Console(), Console(stderr=True)
StoreOpt = typer.Option(None, "--store", help="Store URL (default: OPENFORGE_STORE_URL or the SQLite file under "
                                              "OPENFORGE_HOME).", show_default=False)


def _fail(msg: object, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code)


def _open(store: str | None, *, read_only: bool = False):
    from forge_store import StoreError, get_settings, open_store

    settings = get_settings(auto_upgrade=False) if read_only else get_settings()
    try:
        return open_store(store or settings.resolved_store_url(), settings=settings)
    except StoreError as exc:
        _fail(exc)


@export_app.callback()
def export_command(
    ctx: typer.Context,
    format: str = typer.Option("verl", "--format", help=" | ".join(EXPORTERS)),
    where: Optional[str] = typer.Option(None, "--where", help="Rollout filter, e.g. \"attempt = 1\" (see "
                                        "learner/_query.py). In veRL / TRL exports it may not split a GRPO group."),
    group_where: Optional[str] = typer.Option(None, "--group-where", help="Group filter: keep a group whole when any "
                                              "of its rollouts matches, e.g. \"reward > 0\"."),
    allow_partial_groups: bool = typer.Option(False, "--allow-partial-groups", help="Let --where keep part of a "
                                              "group (advantages still over the whole recorded group)."),
    include_redacted: bool = typer.Option(False, "--include-redacted", help="Export rollouts with a redacted call "
                                          "(their token ids still carry the secret)."),
    include_self_calls: bool = typer.Option(False, "--include-self-calls", help="Train on the calls a harness makes "
                                            "for itself (titles, routing, summaries: metadata.harness_self_call); "
                                            "left out by default, each with its exclusion."),
    as_of: Optional[int] = typer.Option(None, "--as-of", help="Watermark to pin (default: the current one)."),
    out: Optional[str] = typer.Option(None, "--out", help="New folder or s3://BUCKET/PREFIX for the shards and "
                                      "manifest.json (credentials: OPENFORGE_S3_* or AWS_*)."),
    max_policy_lag: Optional[int] = typer.Option(None, help="Exclude rollouts this many policy versions stale."),
    min_group_size: Optional[int] = typer.Option(None, help="Default: each group's target size."),
    keep_truncated: bool = typer.Option(False, help="Train on completions cut at max_tokens."),
    no_std: bool = typer.Option(False, "--no-std", help="Dr.GRPO: do not divide advantages by the group std."),
    call_cost: float = typer.Option(0.0, "--call-cost", help="Efficiency shaping: a rollout of n model calls counts "
                                    "reward * (1 - COST)**(n-1) in its group's advantages (0: the stored reward)."),
    success_at: Optional[float] = typer.Option(None, "--success-at", help="Success-only rewards: a rollout counts 1 "
                                               "in its group's advantages when its reward reaches this (e.g. 1.0), "
                                               "else 0 (default: the stored reward, partial credit included)."),
    reward_source: list[str] = typer.Option([], "--reward-source", help="Only rewards from this source count "
                                            "(verifier | judge | human | api; repeat for several; default: every "
                                            "source). A rollout's reward is its latest from these."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Processes that plan the export (default: one "
                                          "per core, at most 8, for a store of 2,000 finished rollouts or more; "
                                          "1: this process alone). The shards are the same bytes either way."),
    rollout_is: Optional[str] = typer.Option(None, "--rollout-is", help="veRL shards: per-token rollout_is_weights "
                                             "from a re-score (openforge rescore): token-tis | sequence-tis | "
                                             "token-mis | sequence-mis (veRL's rollout correction)."),
    rollout_is_cap: float = typer.Option(2.0, "--rollout-is-cap", help="Cap of the importance weights (veRL's "
                                         "rollout_is_threshold); MIS keeps ratios in [1/cap, cap]."),
    rollout_is_version: Optional[str] = typer.Option(None, "--rollout-is-version", help="The version the trainer "
                                                     "starts from, whose re-scores are the trainer's logprobs "
                                                     "(default: the current policy version)."),
    rollout_is_scorer: str = typer.Option("hf-float32", "--rollout-is-scorer", help="The re-scores' scorer."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL."),
) -> None:
    """Export training shards; ``export verify MANIFEST`` checks an export against the store."""
    if ctx.invoked_subcommand is not None:
        return
    if out is None:
        _fail("--out is missing: an export needs a new folder for its shards; pass --out DIR")
    from forge_store import StoreError

    from ._export import ExportError
    from ._plan import ExportConfig
    from ._export_location import export_to
    from ._query import QueryError

    from forge_store import REWARD_SOURCES

    for s in reward_source:
        if s not in REWARD_SOURCES:
            _fail(f"--reward-source {s!r}: a reward source is one of {', '.join(REWARD_SOURCES)}; repeat the option "
                  "for several")
    if workers is not None and workers < 1:
        _fail(f"--workers {workers}: an export needs at least one process; pass --workers 1 or more, or leave it "
              "out for one per core")
    st = _open(store)
    try:
        cfg = ExportConfig(format=format, reward_sources=tuple(reward_source) or None, where=where, max_policy_lag=max_policy_lag, min_group_size=min_group_size,
                           keep_truncated=keep_truncated, norm_by_std=not no_std, group_where=group_where,
                           allow_partial_groups=allow_partial_groups, include_redacted=include_redacted,
                           include_self_calls=include_self_calls, rollout_is=rollout_is, rollout_is_cap=rollout_is_cap, rollout_is_version=rollout_is_version,
                           rollout_is_scorer=rollout_is_scorer, call_cost=call_cost,
                           success_at=success_at)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err) as bar:
            task = bar.add_task(f"export {format}", total=None)
            manifest = export_to(st, out, cfg, as_of=as_of, workers=workers,
                                 progress=lambda done, total: bar.update(task, completed=done, total=total))
    except (ExportError, QueryError, StoreError, ValueError) as exc:
        _fail(exc)
    finally:
        st.close()
    c = manifest["counts"]
    console.print(f"export {manifest['export_id']}: {c['rows']} rows from {c['rollouts_exported']} rollouts in "
                  f"{c['groups']} groups at watermark {manifest['watermark']}; merge rate {manifest['merge_rate']}; "
                  f"excluded {json.dumps(manifest['exclusions'])} -> {out}")
    if rc := manifest.get("rollout_correction"):
        console.print(f"rollout_is_weights: {rc['mode']} capped at {rc['cap']:g}, trainer logprobs from the re-score "
                      f"of {rc['version']} by {rc['scorer']} (veRL: {json.dumps(rc['verl'])})")


@export_app.command("verify")
def verify_command(manifest: str = typer.Argument(..., help="The export's manifest.json (a path or s3:// URL)."),
                   store: Optional[str] = typer.Option(None, "--store", help="Store URL.")) -> None:
    """Re-derive an export from the store and report every file or row that differs."""
    from forge_store import StoreError, is_url

    from ._export import ExportError
    from ._export_location import verify_at

    if not is_url(manifest) and not Path(manifest).is_file():
        _fail(f"{manifest}: no such manifest; pass the manifest.json inside an export folder")
    st = _open(store)
    try:
        res = verify_at(manifest, st)
    except (ExportError, StoreError) as exc:
        _fail(exc)
    finally:
        st.close()
    if not res["ok"]:
        for p in res["problems"]:
            err.print(f"[red]differs:[/] {p}", highlight=False)
        raise typer.Exit(1)
    console.print(f"export {res['export_id']} verified: every file matches the store")


def _print_rows(title: str, rows: list[dict]) -> None:
    if rows:
        print_table(Console(), title, rows)   # a console made now reads the terminal width (COLUMNS) now


def _write(rows_by_name: dict[str, list[dict]], out: Path, kind: str, say: Console) -> None:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    for name, rows in rows_by_name.items():
        table = pa.Table.from_pylist(rows) if rows else pa.table({})
        if kind == "csv":
            pcsv.write_csv(table, out / f"{name}.csv")
        else:
            pq.write_table(table, out / f"{name}.parquet")
    say.print(f"wrote {', '.join(f'{n}.{kind}' for n in rows_by_name)} to {out}")


def analyze_command(
    store: Optional[str] = StoreOpt,
    by: str = typer.Option("policy_version", "--by", help="Slice by policy_version | harness | domain."),
    k: list[int] = typer.Option([1, 5], "--k", help="pass@k / pass^k for these k (repeat: --k 1 --k 5)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only rollouts started on or after this date (YYYY-MM-DD)."),
    config: Optional[Path] = typer.Option(None, "--config", help="Rubric rules as TOML (see learner/_analysis_config.py)."),
    reward_source: list[str] = typer.Option([], "--reward-source", help="Only rewards from this source count "
                                            "(verifier | judge | human | api; repeat for several; default: every "
                                            "source). A rollout's reward is its latest from these."),
    csv: Optional[Path] = typer.Option(None, "--csv", help="Also write every table as CSV into this folder."),
    parquet: Optional[Path] = typer.Option(None, "--parquet", help="Also write every table as Parquet into this folder."),
    compare: Optional[tuple[str, str]] = typer.Option(None, "--compare", help="Two policy versions A B: every "
                                                      "rubric of each on their evaluation rollouts, B - A and its 95% "
                                                      "interval, paired by task."),
    purpose: str = typer.Option("eval", "--purpose", help="With --compare: the rollouts compared (eval | train | "
                                "teacher | any)."),
    run: list[str] = typer.Option([], "--run", help="With --compare: only rollouts of these runs (repeat; e.g. a "
                                  "version's greedy evaluation run, not its sampled one)."),
    as_json: bool = typer.Option(False, "--json", help="Print every table as JSON (one object: table name -> rows; "
                                 "with --compare, the comparison)."),
    ratio_eps: float = typer.Option(0.2, "--ratio-eps", help="Logprob mismatch table: the share of re-scored "
                                    "tokens whose ratio leaves [1 - eps, 1 + eps]."),
) -> None:
    """Behaviour rubrics, pass@k / pass^k, latency, timeout / infra-error / exclusion rates per slice; with
    --compare A B, two versions side by side with paired intervals."""
    from ._analysis import SLICES, AnalysisError, analyze
    from ._analysis_config import RubricConfig, RubricConfigError

    if compare:
        _compare(store, compare, purpose, tuple(k), tuple(reward_source) or None, as_json, tuple(run) or None)
        return

    if by not in SLICES:
        _fail(f"--by {by!r}: slice by one of {', '.join(SLICES)}")
    if not 0 < ratio_eps < 1:
        _fail(f"--ratio-eps {ratio_eps}: the ratio band [1 - eps, 1 + eps] needs 0 < eps < 1 (PPO's clip: 0.2)")
    start = None
    if since:
        try:
            start = datetime.fromisoformat(since).replace(tzinfo=timezone.utc)
        except ValueError:
            _fail(f"--since {since!r} is not a date: write it as YYYY-MM-DD")
    try:
        cfg = RubricConfig.from_toml(config) if config else RubricConfig()
    except RubricConfigError as exc:
        _fail(exc)
    st = _open(store, read_only=True)
    try:
        report = analyze(st, by=by, ks=tuple(k), config=cfg, since=start, reward_sources=tuple(reward_source) or None)
        from ._judge import judge_agreement

        ids = [r.id for r in st.iter_rollouts() if r.ended_at is not None and (start is None or r.started_at >= start)]
        agreement = judge_agreement(st, ids)
        from ._mismatch import by_version, pairs

        mismatch = by_version(st, pairs(st), ratio_eps)
    except AnalysisError as exc:
        _fail(exc)
    finally:
        st.close()
    if not report["summary"]:
        _fail(f"{st.url} has no finished rollouts{' since ' + since if since else ''}: nothing to analyze. Record "
              "rollouts first, or point --store at another store.", code=1)
    if agreement["n"]:
        report["judge_agreement"] = [agreement]
    if mismatch:
        report["mismatch"] = mismatch
    if as_json:
        print(json.dumps(report, default=str))
    else:
        _print_report(report, by)
    if csv:
        _write(report, csv, "csv", err if as_json else console)
    if parquet:
        _write(report, parquet, "parquet", err if as_json else console)


def _print_report(report: dict, by: str) -> None:
    _print_rows(f"Outcomes by {by}", report["summary"])
    _print_rows(f"Behaviour by {by}", report["behaviour"])
    _print_rows(f"Tool-call share by category and {by}", report["categories"])
    _print_rows(f"Exclusions by reason and {by}", report["exclusions"])
    _print_rows("Judge vs verifier agreement (rollouts with both)", report.get("judge_agreement") or [])
    _print_rows("Logprob mismatch: engine against re-scores (openforge rescore), by behaviour version and "
                "re-scored version", report.get("mismatch") or [])


def _compare(store: str | None, versions: tuple[str, str], purpose: str, ks: tuple[int, ...],
             sources: tuple[str, ...] | None, as_json: bool, runs: tuple[str, ...] | None = None) -> None:
    from ._compare import compare_versions
    from ._report import print_comparison

    if purpose not in ("eval", "train", "teacher", "any"):
        _fail(f"--purpose {purpose!r}: compare rollouts of one purpose: eval, train, teacher or any")
    st = _open(store, read_only=True)
    try:
        known = {r["id"] for r in st.lineage("policy_versions")}
        missing = [v for v in versions if v not in known]
        if missing:
            _fail(f"--compare: {', '.join(missing)} is not a policy version in {st.url}; known: "
                  f"{', '.join(sorted(known)) or '(none)'}")
        diffs = compare_versions(st, *versions, purpose=None if purpose == "any" else purpose, ks=ks,
                                 reward_sources=sources, run_ids=runs)
    finally:
        st.close()
    if not any(d.a is not None or d.b is not None for d in diffs if d.metric == "success_rate"):
        where = f" in run(s) {', '.join(runs)}" if runs else ""
        _fail(f"--compare: neither {versions[0]} nor {versions[1]} has finished {purpose} rollouts{where} in the "
              "store; evaluate them first (openforge run ... --purpose eval), or pass --purpose any"
              + (" or other --run ids (openforge sql \"SELECT DISTINCT run_id, policy_version_id FROM rollouts\")"
                 if runs else ""), code=1)
    if as_json:
        print(json.dumps({"a": versions[0], "b": versions[1], "purpose": purpose,
                          "rubrics": [d.as_dict() for d in diffs]}))
        return
    print_comparison(console, f"{versions[1]} (B) against {versions[0]} (A), {purpose} rollouts, paired by task "
                     "(95% bootstrap intervals)", diffs, "A", "B")


def lineage_command(
    version: str = typer.Argument(..., help="A policy version id (openforge train prints it)."),
    as_json: bool = typer.Option(False, "--json", help="Print the chain as JSON (root first) instead of a table."),
    store: Optional[str] = StoreOpt,
) -> None:
    """The chain base -> SFT -> GRPO rounds that led to a policy version: each with its shard, watermark, sample count
    and parent."""
    from ._lineage import LineageError, policy_lineage

    st = _open(store, read_only=True)
    try:
        chain = policy_lineage(st, version)
    except LineageError as exc:
        _fail(exc)
    finally:
        st.close()
    if as_json:
        print(json.dumps(chain, indent=2))
        return
    console.print(" -> ".join(f"{link['policy_version']} ({link.get('algorithm') or 'missing'})" for link in chain),
                  highlight=False)
    rows = [{"#": i, "policy version": link["policy_version"], "algorithm": link.get("algorithm") or "(not in store)",
             "parent": link.get("parent"), "export": (link.get("export_id") or "")[:12] or None,
             "shard": link.get("shard"), "watermark": link.get("watermark"), "samples": link.get("samples"),
             "steps": link.get("steps"), "loss": _loss(link)} for i, link in enumerate(chain)]
    _print_rows(f"Lineage of {version}", rows)


def _loss(link: dict) -> str | None:
    first, last = link.get("loss_first"), link.get("loss_last")
    if last is None:
        return None
    return f"{first:.4g} -> {last:.4g}" if first is not None else f"{last:.4g}"
