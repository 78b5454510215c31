"""Database engines by URL: SQLite (embedded default) and PostgreSQL (at scale)."""

from __future__ import annotations

import os
from pathlib import Path

import sqlalchemy as sa

from ._errors import StoreURLError

SUPPORTED = "sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB"


def redact_url(url: str) -> str:
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return url


def _private_sqlite_file(path: Path) -> None:
    """Create the database file owner-only (0600; its folder 0700 if we make it) before SQLite opens it: it holds
    prompts, and SQLite gives its -wal and -shm files the database file's mode. An existing file keeps its mode."""
    if path.exists():
        return
    missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def create_engine(url: str) -> sa.Engine:
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise StoreURLError(f"store URL {url!r} is not a database URL: use {SUPPORTED}") from None
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise StoreURLError(
                f"store URL {url!r} names no file: the store must outlive the process; use sqlite:///PATH/store.sqlite"
            )
        _private_sqlite_file(Path(parsed.database).expanduser())
        engine = sa.create_engine(parsed, connect_args={"timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    if backend == "postgresql":
        if driver != "psycopg":
            raise StoreURLError(
                f"store URL {redact_url(url)!r} uses driver {driver!r}: OpenForge talks to PostgreSQL through "
                "psycopg 3; write it as postgresql+psycopg://... (or postgresql://...)"
            )
        return sa.create_engine(parsed, pool_pre_ping=True, pool_size=4, max_overflow=4,
                                connect_args={"connect_timeout": 5})
    raise StoreURLError(f"store URL {redact_url(url)!r}: backend {backend!r} is not supported; use {SUPPORTED}")
