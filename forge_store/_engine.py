"""Database engines by URL: SQLite (embedded default) and PostgreSQL (at scale)."""

from __future__ import annotations

import os
import re
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


_PROJECT = re.compile(r"[a-z][a-z0-9_]{0,62}")
_PATH_OPTION = "-csearch_path="


def project_of(url: sa.URL) -> str | None:
    """The project a PostgreSQL engine URL is bound to (its schema), or None (the database's default schema)."""
    options = url.query.get("options")
    if isinstance(options, str) and options.startswith(_PATH_OPTION):
        return options[len(_PATH_OPTION):]
    return None


def bind_project(parsed: sa.URL, url: str) -> sa.URL:
    """``?project=NAME`` -> the libpq option that makes NAME the only schema every connection sees.

    Projects in one PostgreSQL database are a schema each (not a project column): every table, index, migration
    and the ingest counter exist once per project, so no read, export, DuckDB view, dashboard or admin API can see
    another project's rows by a forgotten WHERE, each project migrates and erases on its own, and one project can
    be dumped or dropped whole (``pg_dump -n``, ``DROP SCHEMA``). The price: a query across projects names the
    schemas itself."""
    project = parsed.query.get("project")
    if project is None:
        return parsed
    if parsed.get_backend_name() != "postgresql":
        raise StoreURLError(f"store URL {redact_url(url)!r}: ?project= needs PostgreSQL (a schema each); an "
                            "embedded SQLite store is one project: give each project its own OPENFORGE_HOME")
    if not isinstance(project, str) or not _PROJECT.fullmatch(project) or project in ("public", "information_schema"):
        raise StoreURLError(f"store URL {redact_url(url)!r}: project {project!r} is not a valid name: lowercase "
                            "letters, digits and _, starting with a letter, at most 63 characters, not 'public'")
    if "options" in parsed.query:
        raise StoreURLError(f"store URL {redact_url(url)!r} has both ?project= and ?options=: drop options (the "
                            "project sets the search path)")
    return parsed.difference_update_query(["project"]).update_query_dict({"options": _PATH_OPTION + project})


def create_engine(url: str) -> sa.Engine:
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise StoreURLError(f"store URL {url!r} is not a database URL: use {SUPPORTED}") from None
    parsed = bind_project(parsed, url)
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
