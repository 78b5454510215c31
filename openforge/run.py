"""``openforge run``: run GRPO groups of rollouts of a task set with a harness, in sandboxes, through the proxy."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Optional

import typer
from rollout import backend_names, harness_names

from .progress import RunProgress, sigterm_interrupts

RUN_KEYS = {"tasks", "harness", "group_size", "groups_per_task", "concurrency", "upstream", "proxy", "admin_token",
            "store", "model", "backend", "max_infra_retries", "max_in_flight", "max_waiting", "max_turns",
            "agent_timeout", "dialect", "run_name", "upstream_metrics", "kubernetes", "purpose"}


def run_command(
    tasks: Optional[Path] = typer.Argument(None, help="A task folder or a folder of task folders."),
    harness: Optional[str] = typer.Option(None, "--harness", help="Harness adapter: "
                                          f"{', '.join(harness_names())} (oracle runs the task's solution)."),
    group_size: Optional[int] = typer.Option(None, "--group-size", help="Rollouts per GRPO group (default 4)."),
    groups_per_task: Optional[int] = typer.Option(None, "--groups-per-task", help="Groups per task (default 1)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Rollouts running at once (default 4)."),
    upstream: Optional[str] = typer.Option(None, "--upstream", help="Inference server (vLLM, SGLang, OpenAI-compatible);"
                                           " a recording proxy runs in this process in front of it."),
    proxy: Optional[str] = typer.Option(None, "--proxy", help="An already running `openforge proxy` instead of "
                                        "--upstream (with --admin-token)."),
    admin_token: Optional[str] = typer.Option(None, "--admin-token", help="The --proxy's admin token."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL (default: the embedded SQLite store)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name the harness asks for (default: the "
                                        "upstream's first model)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Sandbox backend: "
                                         f"{', '.join(backend_names())} (local: bubblewrap)."),
    max_infra_retries: Optional[int] = typer.Option(None, "--max-infra-retries", help="Retries of infra errors (default 2)."),
    max_in_flight: Optional[int] = typer.Option(None, "--max-in-flight", help="Start no rollout while the proxy has "
                                                "this many calls in flight."),
    max_waiting: Optional[int] = typer.Option(None, "--max-waiting", help="Start no rollout while the upstream (vLLM "
                                              "/metrics) has this many requests waiting."),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", help="Turn / step limit passed to the harness."),
    agent_timeout: Optional[float] = typer.Option(None, "--agent-timeout", help="Override every task's agent "
                                                  "timeout_sec."),
    dialect: Optional[str] = typer.Option(None, "--dialect", help="Upstream dialect for the embedded proxy: vllm, "
                                          "sglang, openai."),
    run_name: Optional[str] = typer.Option(None, "--name", help="A name for this run."),
    purpose: Optional[str] = typer.Option(None, "--purpose", help="train (default), eval (never exported for "
                                          "training) or teacher (demonstrations: SFT shards only); recorded on "
                                          "the run and every rollout."),
    config: Optional[Path] = typer.Option(None, "--config", help="A TOML file with any of these options (CLI wins)."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
) -> None:
    """Run GRPO groups of rollouts: each rollout is one harness on one task in its own sandbox, recorded in the store."""
    from rich.console import Console

    err = Console(stderr=True)
    opts = _merge(config, locals(), err)
    from forge_store import JournalError, StoreError
    from rollout import ProxyUnavailable, SandboxError

    try:
        summary = _run(opts, err)
    except (ValueError, KeyError, FileNotFoundError, StoreError, JournalError, SandboxError, ProxyUnavailable) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    _print_summary(summary, err, json_out)
    if summary.cancelled:
        raise typer.Exit(130)


def _merge(config: Path | None, given: dict, err) -> dict:
    opts = {}
    if config is not None:
        try:
            opts = tomllib.loads(config.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            err.print(f"[bold red]error:[/] --config {config}: {exc}")
            raise typer.Exit(2) from None
        unknown = set(opts) - RUN_KEYS
        if unknown:
            err.print(f"[bold red]error:[/] --config {config}: unknown keys {sorted(unknown)}; known keys: "
                      f"{', '.join(sorted(RUN_KEYS))}")
            raise typer.Exit(2)
        if "tasks" in opts:
            opts["tasks"] = (config.parent / opts["tasks"]).resolve()
    names = {"agent_timeout": "agent_timeout", "run_name": "run_name"}
    for key in RUN_KEYS:
        value = given.get(names.get(key, key))
        if value is not None:
            opts[key] = value
    defaults = {"group_size": 4, "groups_per_task": 1, "concurrency": 4, "backend": "local", "max_infra_retries": 2,
                "dialect": "vllm", "purpose": "train"}
    return defaults | opts


def _run(opts: dict, err):
    from forge_store import get_settings, open_store
    from proxy import ProxySettings
    from rollout import (
        AdminClient,
        Orchestrator,
        RunConfig,
        SocketRelay,
        TaskError,
        get_backend,
        get_harness,
        load_tasks,
    )

    from .embedded_proxy import EmbeddedProxy, own_socket, served_model

    if not opts.get("tasks"):
        raise ValueError("no tasks: pass a task folder (or `tasks = \"DIR\"` in --config), e.g. examples/tasks")
    if not opts.get("harness"):
        raise ValueError("no --harness: pass one of react, mini-swe-agent, codex, claude-code, oracle")
    if bool(opts.get("upstream")) == bool(opts.get("proxy")):
        raise ValueError("pass exactly one of --upstream URL (run a proxy here) or --proxy URL --admin-token T")
    try:
        tasks = load_tasks(opts["tasks"])
    except TaskError as exc:
        raise ValueError(str(exc)) from None
    settings = get_settings()
    harness = get_harness(opts["harness"])
    if not harness.is_installed():
        raise ValueError(f"harness {harness.name!r} is not installed: {harness.install_hint()}")
    sandbox_root = settings.resolved_sandbox_dir()
    sandbox_root.mkdir(parents=True, exist_ok=True)
    socket_path = own_socket(sandbox_root)
    store = embedded = relay = backend = None
    try:
        if opts.get("upstream"):
            store = open_store(opts.get("store"), journal=True, name="run",
                               settings=settings.model_copy(update={"journal_fsync": ProxySettings().journal_fsync}))
            embedded = EmbeddedProxy(opts["upstream"], store=store, settings=settings, socket_path=socket_path,
                                     dialect=opts["dialect"])
            admin = AdminClient(embedded.url, embedded.admin_token)
        else:
            if not opts.get("admin_token"):
                raise ValueError("--proxy needs --admin-token (the proxy prints where it keeps it)")
            store = open_store(opts.get("store"))
            admin = AdminClient(opts["proxy"], opts["admin_token"])
            host_port = opts["proxy"].split("://", 1)[-1].split("/", 1)[0]
            host, _, port = host_port.rpartition(":")
            relay = SocketRelay(socket_path, host or "127.0.0.1", int(port or 80))
        if opts["backend"] == "local":
            backend = get_backend("local", root=sandbox_root, proxy_socket=socket_path)
        elif opts["backend"] == "kubernetes":
            if opts.get("upstream"):
                raise ValueError("--backend kubernetes: pods cannot reach a proxy inside this process; run "
                                 "`openforge proxy` as a Service in the cluster and pass --proxy URL --admin-token T "
                                 "(and kubernetes.proxy_url in --config, the URL pods use); see docs/kubernetes.md")
            from rollout import KubernetesConfig

            backend = get_backend("kubernetes", config=KubernetesConfig.model_validate(opts.get("kubernetes") or {}))
        else:
            backend = get_backend(opts["backend"])
        model = opts.get("model")
        if opts.get("upstream"):
            model = served_model(opts["upstream"], model)
        elif not model:
            raise ValueError("--model is required with --proxy: the name the inference server behind it serves")
        metrics = opts.get("upstream_metrics") or (f"{opts['upstream'].rstrip('/').removesuffix('/v1')}/metrics"
                                                   if opts.get("upstream") and opts.get("max_waiting") else None)
        cfg = RunConfig(harness=harness.name, model=model, group_size=opts["group_size"],
                        groups_per_task=opts["groups_per_task"], concurrency=opts["concurrency"],
                        max_infra_retries=opts["max_infra_retries"], max_in_flight=opts.get("max_in_flight"),
                        upstream_metrics_url=metrics, max_waiting=opts.get("max_waiting"),
                        max_turns=opts.get("max_turns"), agent_timeout_s=opts.get("agent_timeout"),
                        run_name=opts.get("run_name"), purpose=opts["purpose"])
        progress = RunProgress(err)
        orch = Orchestrator(cfg, store=store, backend=backend, harness=harness, admin=admin, progress=progress)
        with sigterm_interrupts(), progress:
            summary = orch.run(tasks)
        store.flush(60)
        return summary
    finally:
        if backend is not None and hasattr(backend, "close"):
            backend.close()
        if embedded is not None:
            embedded.stop()
        if relay is not None:
            relay.stop()
        if store is not None:
            store.close()


def _print_summary(summary, err, json_out: bool) -> None:
    from forge_store import print_table

    oc = summary.outcomes
    doc = {"run_id": summary.run_id, "rollouts": len(summary.results), "outcomes": dict(oc),
           "groups": summary.groups, "groups_complete": summary.groups_complete,
           "superseded_groups": summary.superseded_groups, "mean_reward": summary.mean_reward,
           "cancelled": summary.cancelled, "wall_s": round(summary.wall_s, 2)}
    if json_out:
        print(json.dumps(doc))
        return
    row = {"rollouts": len(summary.results), "groups complete": f"{summary.groups_complete}/{summary.groups}",
           **{k: oc[k] for k in sorted(oc)},
           "mean reward": "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}",
           "wall s": f"{summary.wall_s:.1f}"}
    print_table(err, f"run {summary.run_id}" + (" (cancelled)" if summary.cancelled else ""), [row])
