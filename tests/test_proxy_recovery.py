"""A proxy that starts and recovers by itself (issue 22), on the real ``openforge proxy`` process and real PostgreSQL
behind a relay that takes it away (``tests.netfault``): kill -9 under load while the drain is behind, then the
README's recovery commands as written; a start and a restart during an outage (live tokens served, ended ones
refused); a stalled database on /health; the upstream API key in no process's argv.

Counting: the test's own client keeps the ``X-OpenForge-Call-Id`` header of every answer it received in full, and
those ids are what must be stored, each once."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import sqlalchemy as sa

from proxy.engines.scripted import Delay, Text
from tests.netfault import TcpRelay, free_port
from tests.proxy_fixtures import make_proxy
from tests.test_proxy_crash import ADMIN, OPENFORGE, _start_proxy

REPO = Path(__file__).resolve().parents[1]
HEADER = "x-openforge-call-id"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _relayed(pg_database: str) -> tuple[TcpRelay, str]:
    url = sa.engine.make_url(pg_database)
    relay = TcpRelay(url.host or "127.0.0.1", url.port or 5432)
    return relay, url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)


def _calls_in_db(pg_database: str, ids: list[str] | None = None) -> int:
    engine = sa.create_engine(pg_database)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("calls"):
                return 0
            if ids is None:
                return conn.execute(sa.text("SELECT count(*) FROM calls")).scalar_one()
            rows = conn.execute(sa.text("SELECT id FROM calls WHERE id = ANY(:ids)"), {"ids": ids}).scalars().all()
            assert len(rows) == len(set(rows)), "a call is stored twice"
            return len(rows)
    finally:
        engine.dispose()


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _chat(base: str, token: str, text: str) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", headers={"Authorization": f"Bearer {token}"}, timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": text}]})


def _readme_recovery() -> str:
    """The README's recovery block (the bash block that starts with ``# after a crash``), as written."""
    readme = (REPO / "README.md").read_text()
    for block in re.findall(r"```bash\n(.*?)```", readme, flags=re.S):
        lines = [line[2:] if line.startswith("  ") else line for line in block.splitlines()]
        if lines and lines[0].startswith("# after a crash"):
            return "\n".join(lines)
    raise AssertionError("README.md has no recovery block starting with '# after a crash'")


def test_kill9_under_load_with_the_drain_behind_then_the_readme_recovery(up, tmp_path, pg_database):
    up.double.script.extend([Delay(0.0, chunk_delay=0.005, then=Text("word " * 12), times=None)])
    relay, store_url = _relayed(pg_database)
    home, port = tmp_path / "home", free_port()
    proc = _start_proxy(up.url, home, store_url, port)
    base = f"http://127.0.0.1:{port}"
    tokens = [httpx.post(base + "/admin/rollouts", json={"rollout_id": f"r{i}"}, headers=AUTH).json()["token"]
              for i in range(12)]
    received: list[str] = []  # call ids of the answers a client received in full

    async def client(i: int, http: httpx.AsyncClient, stop: asyncio.Event):
        n = 0
        while not stop.is_set():
            n += 1
            body = {"model": "m", "stream": n % 2 == 0, "messages": [{"role": "user", "content": f"q {i} {n}"}]}
            try:
                async with http.stream("POST", base + "/v1/chat/completions", json=body,
                                       headers={"Authorization": f"Bearer {tokens[i]}"}) as resp:
                    lines = [line async for line in resp.aiter_lines()]
                if resp.status_code == 200 and (not body["stream"] or "data: [DONE]" in lines):
                    received.append(resp.headers[HEADER])
            except httpx.HTTPError:
                return  # the proxy is gone

    async def load():
        stop = asyncio.Event()
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=32)) as http:
            tasks = [asyncio.create_task(client(i, http, stop)) for i in range(12)]
            await asyncio.sleep(0.5)
            relay.cut()  # the database goes away: from here on the drain falls behind, the journal holds the rest
            cut_at = len(received)
            deadline = time.monotonic() + 60
            while len(received) < cut_at + 150 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            stop.set()
            await asyncio.gather(*tasks)
            return cut_at

    try:
        cut_at = asyncio.run(load())
        proc.wait(10)
        assert len(received) >= cut_at + 150, f"only {len(received)} answers before the kill"
        assert _calls_in_db(pg_database) < len(received), "the drain was not behind when the proxy died"
        relay.restore()
        # exactly the README's recovery steps, run by bash as a user runs them (from a folder of theirs)
        (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
        (tmp_path / "call-ids.txt").write_text("\n".join(received) + "\n")
        env = {**os.environ, "OPENFORGE_HOME": str(home), "OPENFORGE_STORE_URL": store_url}
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", _readme_recovery()], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stdout + out.stderr
        assert re.search(r"journal 'proxy': drained [\d,]+ operations", out.stdout), out.stdout
        assert f"{len(received):,} of {len(received):,} call ids are in the store" in out.stdout, out.stdout
        # and counted here, on the database itself: every answered call once
        assert _calls_in_db(pg_database, received) == len(set(received)) == len(received)
    finally:
        proc.kill()
        proc.wait(10)
        relay.close()


def test_restart_during_an_outage_serves_live_tokens_and_refuses_ended_ones(up, tmp_path, pg_database):
    relay, store_url = _relayed(pg_database)
    home = tmp_path / "home"
    port = free_port()
    proc = _start_proxy(up.url, home, store_url, port)
    base = f"http://127.0.0.1:{port}"
    try:
        live, ended = (httpx.post(base + "/admin/rollouts", json={"rollout_id": r}, headers=AUTH).json()["token"]
                       for r in ("live", "ended"))
        assert _chat(base, live, "before").status_code == 200
        assert _chat(base, ended, "before").status_code == 200
        r = httpx.post(base + "/admin/rollouts/ended/end", headers=AUTH)  # no outcome: the orchestrator's way
        assert r.status_code == 200 and r.json()["ended"]
        assert _chat(base, ended, "after end").status_code == 401
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        relay.cut()
        port = free_port()
        proc = _start_proxy(up.url, home, store_url, port)  # the database is down: it starts anyway
        base = f"http://127.0.0.1:{port}"
        refused = _chat(base, ended, "after restart")
        assert refused.status_code in (401, 409), refused.text
        assert "ended" in refused.json()["error"]["message"]
        served = [_chat(base, live, f"during outage {i}") for i in range(3)]
        assert [s.status_code for s in served] == [200] * 3, [s.text for s in served]
        ids = [s.headers[HEADER] for s in served]
        health = _wait(lambda: (h := httpx.get(base + "/health").json())["store"]["db_down_s"] is not None and h,
                       20, "/health never said the database is down")
        assert health["store"]["pending_ops"] >= 3
        relay.restore()
        _wait(lambda: _calls_in_db(pg_database, ids) == 3, 60, "the journal did not drain when the database returned")
        _wait(lambda: httpx.get(base + "/health").json()["store"]["db_down_s"] is None, 20, "still down")
    finally:
        proc.kill()
        proc.wait(10)
        relay.close()


def test_a_proxy_started_while_postgres_is_unreachable_serves_then_drains(up, tmp_path, pg_database):
    relay, store_url = _relayed(pg_database)
    relay.cut()  # never reachable since the proxy started; the database is empty (the drain creates the schema)
    home, port = tmp_path / "home", free_port()
    proc = _start_proxy(up.url, home, store_url, port)
    base = f"http://127.0.0.1:{port}"
    try:
        reg = httpx.post(base + "/admin/rollouts", json={"rollout_id": "r1", "task_id": "t1"}, headers=AUTH)
        assert reg.status_code == 200, reg.text
        pv = httpx.post(base + "/admin/policy_versions", json={"id": "p1", "model_name": "m"}, headers=AUTH)
        assert pv.status_code == 200, pv.text
        answers = [_chat(base, reg.json()["token"], f"q{i}") for i in range(5)]
        assert [a.status_code for a in answers] == [200] * 5
        ids = [a.headers[HEADER] for a in answers]
        _wait(lambda: httpx.get(base + "/health").json()["store"]["db_down_s"] is not None, 20, "not reported down")
        relay.restore()
        _wait(lambda: _calls_in_db(pg_database, ids) == 5, 60, "the journal did not drain when the database came")
        engine = sa.create_engine(pg_database)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT task_id FROM rollouts WHERE id = 'r1'")).scalar_one() == "t1"
            assert conn.execute(sa.text("SELECT count(*) FROM policy_versions")).scalar_one() == 1
        engine.dispose()
    finally:
        proc.kill()
        proc.wait(10)
        relay.close()


class StallingRelay(TcpRelay):
    """``TcpRelay`` that can also stall: connections stay open, bytes stop flowing (a hung database host)."""

    def __init__(self, host: str, port: int):
        self._flowing = asyncio.Event()
        self._flowing.set()
        super().__init__(host, port)

    async def _pipe(self, reader, writer):
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def stall(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def flow(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)


def test_health_reports_a_stalled_database(up, tmp_path, pg_database):
    url = sa.engine.make_url(pg_database)
    relay = StallingRelay(url.host or "127.0.0.1", url.port or 5432)
    relayed = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    px, serve = make_proxy(up, tmp_path, store_url=relayed, writer_stall_s=1.0)
    try:
        client = px.client(px.register("r1"))
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        assert px.store.flush(10)
        assert httpx.get(px.url + "/health").json()["store"]["db_down_s"] is None
        relay.stall()  # not refused: the drain's next write just never returns
        for i in range(20):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}])
        store = _wait(lambda: (s := httpx.get(px.url + "/health").json()["store"])["db_down_s"] is not None and s,
                      20, "/health never reported the stalled database")
        assert store["db_down_s"] >= 1.0 and store["pending_ops"] >= 20
        relay.flow()
        assert px.store.flush(60)
        assert httpx.get(px.url + "/health").json()["store"]["db_down_s"] is None
        assert len(px.store.calls("r1")) == 21
    finally:
        relay.flow()
        serve.stop()
        px.store.close()
        relay.close()


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def test_the_upstream_api_key_is_in_no_process_argv(up, tmp_path):
    key = "sk-test-" + "k3y" * 10
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    home, port = tmp_path / "home", free_port()
    proc = _start_proxy(up.url, home, store_url, port, env={"OPENFORGE_UPSTREAM_API_KEY": key,
                                                            "OPENFORGE_STORE_URL": store_url})
    try:
        token = httpx.post(f"http://127.0.0.1:{port}/admin/rollouts", json={"rollout_id": "r"}, headers=AUTH)
        assert _chat(f"http://127.0.0.1:{port}", token.json()["token"], "q").status_code == 200
        assert up.double.requests[-1].headers["authorization"] == f"Bearer {key}"  # it reached the upstream
        kids = _wait(lambda: _children(proc.pid), 10, "the proxy started no drain process")
        for pid in (proc.pid, *kids):
            assert key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        for pid in kids:  # the drain gets no OpenForge settings at all (store URL, key, admin token)
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert key.encode() not in environ and b"OPENFORGE_" not in environ
    finally:
        proc.kill()
        proc.wait(10)
    # a file works too; the flag is refused with the replacement named
    (tmp_path / "key").write_text(key + "\n")
    proc = _start_proxy(up.url, tmp_path / "home2", f"sqlite:///{tmp_path / 's2.sqlite'}", port := free_port(),
                        args=("--upstream-api-key-file", str(tmp_path / "key")))
    try:
        token = httpx.post(f"http://127.0.0.1:{port}/admin/rollouts", json={"rollout_id": "r"}, headers=AUTH)
        assert _chat(f"http://127.0.0.1:{port}", token.json()["token"], "q").status_code == 200
        assert up.double.requests[-1].headers["authorization"] == f"Bearer {key}"
    finally:
        proc.kill()
        proc.wait(10)
    out = subprocess.run([OPENFORGE, "proxy", "--upstream", up.url, "--upstream-api-key", key], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "OPENFORGE_HOME": str(tmp_path / "h3")})
    assert out.returncode == 2
    assert "OPENFORGE_UPSTREAM_API_KEY" in out.stderr and "--upstream-api-key-file" in out.stderr
    assert "Traceback" not in out.stderr
