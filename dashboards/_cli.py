"""``openforge dashboard``: serve the Streamlit dashboards (``dashboards/app.py``) over a store, read-only.

Declared as an entry point in ``pyproject.toml`` (needs the ``dashboards`` extra).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from forge_store import StoreError, get_settings, open_store

StoreOpt = typer.Option(None, "--store", help="Store URL (default: OPENFORGE_STORE_URL or the SQLite file under "
                                              "OPENFORGE_HOME).", show_default=False)


def _fail(msg: object) -> None:
    typer.secho(f"error: {msg}", fg="red", err=True)
    raise typer.Exit(2)


def dashboard_command(
    store: Optional[str] = StoreOpt,
    port: int = typer.Option(8501, "--port", help="HTTP port of the dashboard."),
    address: str = typer.Option("127.0.0.1", "--address", help="Address to listen on."),
) -> None:
    """Serve the Streamlit dashboards (overview, trajectories, behaviour, exports); read-only."""
    try:
        import streamlit  # noqa: F401
    except ImportError:
        _fail("streamlit is not installed: pip install 'openforge[dashboards]'")
    url = store or get_settings().resolved_store_url()
    try:  # fail here, with the store's own message, rather than inside the browser
        open_store(url, settings=get_settings(auto_upgrade=False)).close()
    except StoreError as exc:
        _fail(exc)
    app = Path(__file__).with_name("app.py")
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(port), "--server.address", address,
           "--server.headless", "true", "--browser.gatherUsageStats", "false", "--", "--store", url]
    typer.echo(f"dashboard on http://{address}:{port} (Ctrl-C to stop)")
    try:
        raise typer.Exit(subprocess.call(cmd))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
