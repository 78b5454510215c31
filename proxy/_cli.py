"""``openforge proxy``: run the recording proxy (heavy imports happen only when the command runs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from ._protocols.openai_chat import DIALECTS


def proxy_command(
    upstream: List[str] = typer.Option(..., "--upstream", help="Inference server base URL (vLLM, SGLang, any "
                                       "OpenAI-compatible endpoint), e.g. http://127.0.0.1:8000. Repeat it for "
                                       "engine replicas: calls are balanced by load (outstanding requests plus "
                                       "bound rollouts) with rollout affinity; every replica must be the same "
                                       "engine (checked at start); replicas may serve different models (a teacher "
                                       "beside the policy): a call goes to one that serves its model. Change them "
                                       "with the /admin/upstreams routes."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL (default: the embedded SQLite store)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8100, "--port", help="Port to listen on."),
    dialect: str = typer.Option("vllm", "--dialect", help=f"Upstream token-id dialect: {', '.join(DIALECTS)} "
                                "(openai: a hosted API, text only, calls marked not token-exact)."),
    journal: str = typer.Option("proxy", "--journal", help="Journal name; one per proxy process."),
    policy_version: Optional[str] = typer.Option(None, "--policy-version", help="Policy version current at start."),
    model_map: List[str] = typer.Option([], "--model-map", help="NAME=VERSION (repeatable): a requested model name "
                                        "kept and served by that policy version's model, its calls recorded under "
                                        "it. Any other name is served by the active version's model "
                                        "(OPENFORGE_PROXY_PIN_MODEL=false: forwarded as asked)."),
    upstream_api_key_file: Optional[Path] = typer.Option(
        None, "--upstream-api-key-file", help="File holding the API key the proxy presents to the upstream "
        "(default: OPENFORGE_UPSTREAM_API_KEY). Never pass the key itself on the command line: every user can read "
        "it there.", show_default=False),
    upstream_api_key: Optional[str] = typer.Option(None, "--upstream-api-key", hidden=True),
    workers_log: str = typer.Option("warning", "--log-level", help="Log level of the proxy's own log."),
    workers: int = typer.Option(1, "--workers", help="Proxy processes behind this one address (replicas sharing "
                                "the store, each with its own journal; a dead one is restarted and drains its "
                                "journal). Use a PostgreSQL --store with more than one."),
    replica_id: Optional[str] = typer.Option(None, "--replica-id", help="Run as one replica of several sharing the "
                                             "store (e.g. a Kubernetes pod's name): its journal and ledger are named "
                                             "by it; a replica restarted with the same id drains what it left."),
    listen_fd: Optional[int] = typer.Option(None, "--listen-fd", hidden=True),  # a worker of --workers
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", hidden=True),  # its supervisor's (proxy._siblings)
) -> None:
    """Run the recording proxy: harnesses call it instead of the inference server, every call lands in the store."""
    import logging

    from rich.console import Console

    from forge_store import JournalError, StoreError, get_settings

    from ._build import build_proxy
    from ._settings import ProxySettings

    err = Console(stderr=True)
    if upstream_api_key is not None:
        err.print("[bold red]error:[/] --upstream-api-key puts the key in the process list (/proc/PID/cmdline, "
                  "`ps`), which every user of this machine can read; it is no longer accepted. Put the key in "
                  "OPENFORGE_UPSTREAM_API_KEY, or in a file (mode 0600) passed as --upstream-api-key-file PATH.",
                  highlight=False)
        raise typer.Exit(2)
    level = workers_log.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        err.print(f"[bold red]error:[/] --log-level {workers_log!r} unknown; use debug, info, warning, error or "
                  "critical")
        raise typer.Exit(2)
    if workers < 1:
        err.print(f"[bold red]error:[/] --workers {workers}: the proxy needs at least one process; pass --workers 1 "
                  "or more")
        raise typer.Exit(2)
    if model_map:   # through the environment, so that every --workers process reads the same settings
        os.environ["OPENFORGE_PROXY_MODEL_MAP"] = _model_map(model_map, err)
    settings, proxy_settings = get_settings(), ProxySettings()
    api_key = _api_key(upstream_api_key_file, proxy_settings, err)
    os.umask(0o077)  # what the proxy writes holds prompts: SQLite store, journal, blobs, dead letters, ledger
    if listen_fd is not None:
        import socket

        listener = socket.socket(fileno=listen_fd)
    else:
        listener = _listen(host, port, err)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    listeners = [listener]
    if run_dir is not None and replica_id is not None:  # bound before the build reads the siblings' state
        from ._siblings import bind_private

        listeners.append(bind_private(run_dir, replica_id))
    if workers > 1:
        raise typer.Exit(_supervise(listener, workers, replica_id, err, settings=settings,
                                    proxy_settings=proxy_settings, upstream=upstream,
                                    store=store, dialect=dialect, journal=journal, policy_version=policy_version,
                                    upstream_api_key_file=upstream_api_key_file, log_level=workers_log, host=host,
                                    port=port))
    try:
        proxy = build_proxy(upstream, settings=settings, store_url=store, dialect=dialect, journal_name=journal,
                            upstream_api_key=api_key, policy_version=policy_version, replica_id=replica_id,
                            run_dir=run_dir, proxy_settings=proxy_settings)
    except (StoreError, JournalError, ValueError) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    admin = ("admin token from OPENFORGE_PROXY_ADMIN_TOKEN" if proxy_settings.admin_token
             else f"admin token in {settings.home / 'proxy-admin-token'}")
    err.print(f"proxy on http://{host}:{port} -> {', '.join(r.url for r in proxy.service.upstream.replicas)} "
              f"({dialect}); "
              f"store {proxy.store.url}; {admin}" + (f"; replica {replica_id}" if replica_id else ""), highlight=False)
    try:
        _serve(proxy.app, listeners, proxy_settings.max_body_bytes)
    finally:
        proxy.store.close()
        proxy.service.rollouts.ledger.close()


def _supervise(listener, workers: int, replica_id: str | None, err, *, settings, proxy_settings,
               store: str | None, journal: str, **args) -> int:
    """``--workers N``: supervise N replicas on ``listener`` (``proxy._replicas``); the exit code."""
    from forge_store import StoreError

    from ._replicas import supervise, worker_args

    if (store or settings.resolved_store_url()).startswith("sqlite"):
        err.print("note: --workers with a SQLite store: the replicas share one database file, whose writes are "
                  "serialized; use PostgreSQL (--store postgresql+psycopg://...) to scale out", highlight=False)
    try:
        return supervise(listener, workers, worker_args(store=store, journal=journal, **args), store_url=store,
                         settings=settings, proxy_settings=proxy_settings, journal=journal,
                         replica_prefix=replica_id,
                         say=lambda msg: err.print(f"proxy supervisor: {msg}", highlight=False, soft_wrap=True))
    except StoreError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2


def _api_key(path: Path | None, proxy_settings, err) -> str | None:
    """The upstream API key: from ``path``, else the environment (``ProxySettings``: the new name, then the older
    one); exit 2 if the file cannot be read."""
    if path is None:
        return proxy_settings.upstream_api_key
    try:
        key = path.read_text().strip()
    except OSError as exc:
        err.print(f"[bold red]error:[/] --upstream-api-key-file {path}: cannot read it ({exc.strerror}); pass a "
                  "readable file holding the key", highlight=False)
        raise typer.Exit(2) from None
    if not key:
        err.print(f"[bold red]error:[/] --upstream-api-key-file {path} is empty; put the key in it", highlight=False)
        raise typer.Exit(2)
    return key


def _listen(host: str, port: int, err):
    """The listening socket, or exit 2 saying why it cannot be had."""
    import socket

    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        err.print(f"[bold red]error:[/] cannot listen on {host}:{port} ({exc.strerror}); pick another --port")
        raise typer.Exit(2) from None
    return listener


def _serve(app, listeners: list, max_body: int) -> None:
    """Serve ``app`` on ``listeners`` with the proxy's own server until SIGINT or SIGTERM."""
    import asyncio
    import gc
    import signal

    import uvloop

    from ._http import HttpServer

    # Everything allocated so far (modules, the app, the store's engine) lives as long as the process: moving it out
    # of the collector's reach keeps full collections from walking it on the request path.
    gc.collect()
    gc.freeze()
    front = HttpServer(app, max_body=max_body)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, front.stop)
        await front.serve(listeners)

    uvloop.run(serve())


def _model_map(pairs: list[str], err) -> str:
    import json

    out = json.loads(os.environ.get("OPENFORGE_PROXY_MODEL_MAP") or "{}")
    for pair in pairs:
        name, sep, version = pair.partition("=")
        if not (sep and name.strip() and version.strip()):
            err.print(f"[bold red]error:[/] --model-map {pair!r}: write NAME=VERSION, the model name a harness asks "
                      "for and the policy version that serves it, e.g. --model-map teacher-big=teacher-v1",
                      highlight=False)
            raise typer.Exit(2)
        out[name.strip()] = version.strip()
    return json.dumps(out)

