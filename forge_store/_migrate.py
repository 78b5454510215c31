"""Schema migrations (Alembic) driven from Python: upgrade, downgrade, current revision, checks."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from ._errors import SchemaMismatch
from ._schema import Base, modelled

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(connection: sa.Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    cfg.attributes["target_metadata"] = Base.metadata  # migrations/env.py imports nothing of the store
    cfg.attributes["include_name"] = modelled
    return cfg


def heads() -> tuple[str, ...]:
    return tuple(ScriptDirectory.from_config(alembic_config()).get_heads())


def known_revisions() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def ensure_project(engine: sa.Engine) -> None:
    """Create the project's schema (``?project=`` in the store URL) if it does not exist yet."""
    from ._engine import project_of

    project = project_of(engine.url) if engine.dialect.name == "postgresql" else None
    if project is not None:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{project}"')


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    ensure_project(engine)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)


def downgrade(engine: sa.Engine, revision: str) -> None:
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), revision)


def check(engine: sa.Engine, url_for_humans: str, *, auto_upgrade: bool) -> None:
    """Make sure the database is at this code's head revision, or say exactly why not and what to run."""
    if auto_upgrade:
        ensure_project(engine)
    rev = current(engine)
    head = heads()
    if rev in head:
        return
    if rev is None:
        if sa.inspect(engine).has_table("calls"):
            raise SchemaMismatch(
                f"{url_for_humans} has OpenForge tables but no alembic_version row: it was not created by "
                "`openforge db upgrade`. Point --store at a fresh database or restore the version table."
            )
        if auto_upgrade:
            upgrade(engine)
            return
        raise SchemaMismatch(f"{url_for_humans} is empty: create the schema with `openforge db upgrade --store URL`.")
    if rev not in known_revisions():
        raise SchemaMismatch(
            f"{url_for_humans} is at migration revision {rev!r}, which this OpenForge does not know (its head is "
            f"{', '.join(head)}): the database was written by a newer OpenForge. Upgrade OpenForge, or open a "
            "different store."
        )
    raise SchemaMismatch(
        f"{url_for_humans} is at migration revision {rev!r}, older than this OpenForge's head {', '.join(head)}: "
        "run `openforge db upgrade --store URL` (back the database up first at scale)."
    )
