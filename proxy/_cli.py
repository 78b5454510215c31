"""``openforge proxy``: run the recording proxy (heavy imports happen only when the command runs)."""

from __future__ import annotations

from typing import Optional

import typer


def proxy_command(
    upstream: str = typer.Option(..., "--upstream", help="Inference server base URL (vLLM, SGLang, any "
                                 "OpenAI-compatible endpoint), e.g. http://127.0.0.1:8000"),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL (default: the embedded SQLite store)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8100, "--port", help="Port to listen on."),
    dialect: str = typer.Option("vllm", "--dialect", help="Upstream token-id dialect: vllm, sglang, or openai "
                                "(a hosted API: text only, calls marked not token-exact)."),
    journal: str = typer.Option("proxy", "--journal", help="Journal name; one per proxy process."),
    policy_version: Optional[str] = typer.Option(None, "--policy-version", help="Policy version current at start."),
    upstream_api_key: Optional[str] = typer.Option(None, "--upstream-api-key", help="API key the proxy presents "
                                                   "to the upstream (default: OPENFORGE_PROXY_UPSTREAM_API_KEY)."),
    workers_log: str = typer.Option("warning", "--log-level", help="Log level of the proxy's own log."),
) -> None:
    """Run the recording proxy: harnesses call it instead of the inference server, every call lands in the store."""
    import logging

    from rich.console import Console

    from forge_store import JournalError, StoreError, get_settings

    from ._build import build_proxy

    err = Console(stderr=True)
    level = workers_log.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        err.print(f"[bold red]error:[/] --log-level {workers_log!r} unknown; use debug, info, warning, error or "
                  "critical")
        raise typer.Exit(2)
    listener = _listen(host, port, err)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    try:
        proxy = build_proxy(upstream, settings=settings, store_url=store, dialect=dialect, journal_name=journal,
                            upstream_api_key=upstream_api_key or settings.proxy_upstream_api_key,
                            policy_version=policy_version)
    except (StoreError, JournalError, ValueError) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    admin = ("admin token from OPENFORGE_PROXY_ADMIN_TOKEN" if settings.proxy_admin_token
             else f"admin token in {settings.home / 'proxy-admin-token'}")
    err.print(f"proxy on http://{host}:{port} -> {proxy.service.upstream.base_url} ({dialect}); "
              f"store {proxy.store.url}; {admin}", highlight=False)
    try:
        _serve(proxy.app, listener, settings.proxy_max_body_bytes)
    finally:
        proxy.store.close()


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


def _serve(app, listener, max_body: int) -> None:
    """Serve ``app`` on ``listener`` with the proxy's own server until SIGINT or SIGTERM."""
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
        await front.serve([listener])

    uvloop.run(serve())
