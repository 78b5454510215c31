"""The Alembic chain on real SQLite and PostgreSQL: up, down, models == migrations, and every bad state."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from forge_store import SchemaMismatch, StoreUnavailable, StoreURLError, open_store
from forge_store import _migrate as migrate
from forge_store._engine import create_engine
from forge_store._schema import Base, modelled


def test_upgrade_downgrade_upgrade(store_url):
    engine = create_engine(store_url)
    assert migrate.current(engine) is None
    migrate.upgrade(engine)
    assert migrate.current(engine) in migrate.heads()
    assert set(Base.metadata.tables) <= set(sa.inspect(engine).get_table_names())
    migrate.downgrade(engine, "base")
    assert migrate.current(engine) is None
    assert set(sa.inspect(engine).get_table_names()) <= {"alembic_version"}
    migrate.upgrade(engine)
    assert migrate.current(engine) in migrate.heads()
    engine.dispose()


def test_models_match_the_migrations(store_url):
    """Autogenerate finds nothing to do: the SQLAlchemy models and the migration chain describe one schema (but the
    search index's backend-only objects, which the models name in ``UNMODELLED``: SQLite's FTS5 tables, PostgreSQL's
    trigram index)."""
    engine = create_engine(store_url)
    migrate.upgrade(engine)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": modelled})
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    assert diff == []


def test_fresh_store_gets_schema_and_store_id(store_url, settings):
    with open_store(store_url, settings=settings) as st:
        assert len(st.store_id) == 36 and st.watermark() == 0


def test_auto_upgrade_off_says_what_to_run(store_url, settings):
    settings.auto_upgrade = False
    with pytest.raises(SchemaMismatch, match="openforge db upgrade"):
        open_store(store_url, settings=settings)


def test_unknown_revision_is_a_clear_error(store_url, settings):
    engine = create_engine(store_url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'f00dfeed'"))
    engine.dispose()
    with pytest.raises(SchemaMismatch, match=r"revision 'f00dfeed'.*newer OpenForge"):
        open_store(store_url, settings=settings)


def test_older_revision_says_upgrade(store_url, settings, monkeypatch):
    engine = create_engine(store_url)
    migrate.upgrade(engine)
    engine.dispose()
    monkeypatch.setattr(migrate, "heads", lambda: ("9999",))  # as if this code had a newer migration
    known = migrate.known_revisions()
    monkeypatch.setattr(migrate, "known_revisions", lambda: {*known, "9999"})
    with pytest.raises(SchemaMismatch, match=r"older than this OpenForge's head 9999.*openforge db upgrade"):
        open_store(store_url, settings=settings)


def test_foreign_tables_without_version_are_refused(store_url, settings):
    engine = create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE calls (id TEXT)"))
    engine.dispose()
    with pytest.raises(SchemaMismatch, match="no alembic_version"):
        open_store(store_url, settings=settings)


@pytest.mark.parametrize(
    "url, message",
    [
        ("not a url", "is not a database URL"),
        ("mysql://root@localhost/x", "backend 'mysql' is not supported"),
        ("postgresql+asyncpg://root@localhost/x", "driver 'asyncpg'"),
        ("sqlite://", "names no file"),
        ("sqlite:///:memory:", "names no file"),
    ],
)
def test_wrong_store_urls(url, message, settings):
    with pytest.raises(StoreURLError, match=message):
        open_store(url, settings=settings)


def test_unreachable_postgres_says_where_and_what_to_check(settings):
    with pytest.raises(StoreUnavailable, match=r"127.0.0.1.*port 1 failed.*server is running"):
        open_store("postgresql+psycopg://nobody@127.0.0.1:1/none", settings=settings)


def test_missing_postgres_database(pg_admin_url, settings):
    url = sa.engine.make_url(pg_admin_url).set(drivername="postgresql+psycopg", database="of_no_such_db")
    with pytest.raises(StoreUnavailable, match=r'"of_no_such_db" does not exist.*createdb'):
        open_store(url.render_as_string(hide_password=False), settings=settings)


def test_reads_of_an_unreachable_database_raise_the_stores_error_not_the_drivers(settings):
    """Clients catch ``StoreUnavailable`` (the proxy answers 503 with it), never SQLAlchemy's errors."""
    with open_store("postgresql+psycopg://nobody@127.0.0.1:1/none", journal=True, offline=True,
                    settings=settings) as st:
        for read in (lambda: st.rollout("r1"), lambda: st.ended_rollouts(["r1"]),
                     lambda: st.find_call("r1", "response_id", "resp_1"), lambda: list(st.iter_rollouts())):
            with pytest.raises(StoreUnavailable, match=r"cannot be read now \(.*port 1 failed.*then retry"):
                read()
