"""Invariant 1 at the proxy: kill -9 during 32 concurrent streams, and a database outage while serving."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import sqlalchemy as sa

from forge_store import Settings, open_store
from proxy.engines.scripted import Delay, Text
from tests.netfault import TcpRelay, free_port
from tests.proxy_fixtures import make_proxy

OPENFORGE = str(Path(sys.executable).parent / "openforge")
ADMIN = "test-admin-token-0123456789"


def _start_proxy(up_url: str, home: Path, store_url: str, port: int, env: dict | None = None,
                 args: tuple = ()) -> subprocess.Popen:
    env = {**os.environ, "OPENFORGE_HOME": str(home), "OPENFORGE_PROXY_ADMIN_TOKEN": ADMIN, **(env or {})}
    home.mkdir(parents=True, exist_ok=True)
    log = home.parent / f"proxy-{port}.log"  # a file, not a pipe nobody reads: a chatty outage cannot block it
    with open(log, "wb") as err:
        proc = subprocess.Popen([OPENFORGE, "proxy", "--upstream", up_url, "--store", store_url, "--port", str(port),
                                 *args], env=env, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"proxy exited: {log.read_text()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"proxy did not start: {log.read_text()}")


def test_sigkill_during_32_concurrent_streams_loses_no_complete_answer(up, tmp_path):
    up.double.script.extend([Delay(0.0, chunk_delay=0.03, then=Text("word " * 40), times=None)])
    home, port = tmp_path / "home", free_port()
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    proc = _start_proxy(up.url, home, store_url, port)
    base = f"http://127.0.0.1:{port}"
    tokens = {}
    for i in range(32):
        r = httpx.post(base + "/admin/rollouts", json={"rollout_id": f"r{i}"}, headers={"Authorization": f"Bearer {ADMIN}"})
        tokens[i] = r.json()["token"]
    complete: set[int] = set()

    async def stream(i: int, client: httpx.AsyncClient):
        await asyncio.sleep(i * 0.04)  # staggered: some finish before the kill, some are cut mid-stream
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": f"question {i}"}]}
        try:
            async with client.stream("POST", base + "/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {tokens[i]}"}) as resp:
                async for line in resp.aiter_lines():
                    if line == "data: [DONE]":
                        complete.add(i)
        except httpx.HTTPError:
            pass

    async def main():
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as client:
            tasks = [asyncio.create_task(stream(i, client)) for i in range(32)]
            deadline = time.monotonic() + 30
            while len(complete) < 4 and time.monotonic() < deadline:  # kill once some, not all, have finished
                await asyncio.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            await asyncio.gather(*tasks)

    try:
        asyncio.run(main())
    finally:
        proc.kill()
        proc.wait(10)
    assert 0 < len(complete) < 32, f"the kill should land mid-run; {len(complete)} streams completed"
    # restart: the proxy's journal is replayed into the database
    with open_store(store_url, journal=True, name="proxy", settings=Settings(home=home)) as st:
        assert st.flush(30)
        for i in range(32):
            calls = st.calls(f"r{i}")
            assert len(calls) <= 1, f"rollout r{i} has its call twice"
            if i in complete:
                assert len(calls) == 1, f"stream {i} completed at the client but its call is not in the store"
                assert calls[0].error_class is None and calls[0].token_exact


def test_database_outage_while_serving(up, tmp_path, pg_database):
    url = sa.engine.make_url(pg_database)
    relay = TcpRelay(url.host or "127.0.0.1", url.port or 5432)
    relayed = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    px, serve = make_proxy(up, tmp_path, store_url=relayed, writer_retry_max_s=0.2)
    try:
        client = px.client(px.register("r1"))
        for i in range(5):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}])
        assert px.store.flush(10)
        relay.cut()
        t0 = time.monotonic()
        for i in range(5, 40):  # the proxy keeps serving while the database is away
            stream = i % 2 == 0
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}], stream=stream)
            list(r) if stream else None
        assert time.monotonic() - t0 < 20
        # the drain (a background process at a lower priority) reports the outage when it next tries to write: on a
        # busy machine that can come after the last call has been answered
        deadline = time.monotonic() + 15
        while httpx.get(px.url + "/health").json()["store"]["db_down_s"] is None:
            assert time.monotonic() < deadline, "the store's health never reported the database down"
            time.sleep(0.1)
        engine = sa.create_engine(pg_database)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM calls")).scalar_one() == 5
        relay.restore()
        assert px.store.flush(60)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM calls")).scalar_one() == 40
        engine.dispose()
        assert len(px.store.calls("r1")) == 40
    finally:
        serve.stop()
        px.store.close()
        relay.close()
