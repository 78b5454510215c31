"""Admin calls behind ``openforge proxy --workers N`` hold on every worker (``proxy._fleet``, ``proxy._siblings``):
pause (with the drain of every worker's calls in flight), resume, the active policy version and the engine replicas;
a worker restarted after SIGKILL comes up in the proxy-wide state; a worker that does not answer the fan-out is
named in the error, and a pause it did not take is undone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from forge_store import Settings
from proxy import HttpServer, ProxySettings, build_proxy
from openforge.policy_switch import switch_policy
from proxy._siblings import FORWARDED, bind_private
from proxy.engines.scripted import ScriptedUpstream, UpstreamServer
from proxy.engines.scripted.script import Script, step_from_dict
from rollout import AdminClient
from tests.netfault import free_port
from tests.test_proxy_replicas import ADMIN, AUTH, _children, _eventually, _register, _start

SLOW_S = 8.0  # what a call saying "slow" spends in the engine double: long enough that all 9 are still in flight
# when the pause, fanned out across workers, reaches them on a loaded machine (3.0 s was not, in CI)


def _slow(up) -> None:
    up.double.script = Script([step_from_dict({"match": "slow", "delay": SLOW_S, "then": {"text": "late"},
                                               "times": None})])


def _post(base: str, path: str, body: dict | None = None, timeout: float = 60) -> httpx.Response:
    return httpx.post(base + path, json=body, headers=AUTH, timeout=timeout)


def _chat(base: str, token: str, text: str) -> tuple[int, str | None, float]:
    """A model call on a fresh connection (the kernel picks the worker): status, call id, when it ended."""
    try:
        r = httpx.post(base + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                          "content": text}]},
                       headers={"Authorization": f"Bearer {token}"}, timeout=120)
    except httpx.HTTPError:
        return 0, None, time.monotonic()
    return r.status_code, r.headers.get("x-openforge-call-id"), time.monotonic()


def _model_calls(up) -> int:
    return sum(1 for r in up.double.requests if r.method == "POST" and r.path.startswith("/v1/"))


def _stored(pg_url: str, ids: list[str]) -> dict[str, tuple[str | None, str | None]]:
    """call id -> (policy version, replica that recorded it), for those of ``ids`` in the store."""
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT id, policy_version_id, metadata FROM calls")).all()
    finally:
        engine.dispose()
    out = {}
    for cid, version, meta in rows:
        meta = json.loads(meta) if isinstance(meta, str) else meta
        if cid in set(ids):
            out[cid] = (version, (meta or {}).get("replica"))
    return out


def _replica_of(pid: int) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return args[args.index(b"--replica-id") + 1].decode()


def _until_every_replica(base, tokens, pg_url, ids: list[str], want: int = 3, tag: str = "burst") -> dict:
    """Bursts of calls on fresh connections until the store has calls recorded by ``want`` replicas."""
    seen: dict = {}
    for round_ in range(12):
        with ThreadPoolExecutor(24) as pool:
            got = list(pool.map(lambda i: _chat(base, tokens[i % len(tokens)], f"{tag}-{round_}-{i}"), range(24)))
        assert all(status == 200 for status, _, _ in got), got
        ids += [cid for _, cid, _ in got]
        assert _eventually(lambda: len(_stored(pg_url, ids)) == len(ids), 60)
        seen = _stored(pg_url, ids)
        if len({replica for _, replica in seen.values()}) >= want:
            break
    return seen


def test_admin_calls_behind_workers_reach_every_worker(up, tmp_path, pg_database):
    home, port = tmp_path / "home", free_port()
    _slow(up)
    sup = _start(["--upstream", up.url, "--store", pg_database, "--workers", "3", "--policy-version", "v1"], home,
                 port, tmp_path / "w.log")
    base = f"http://127.0.0.1:{port}"
    try:
        assert len(_children(sup.pid)) == 3
        tokens = [_register(base, f"ro{i}") for i in range(12)]
        assert _eventually(lambda: sorted(httpx.get(base + "/admin/status", headers=AUTH, timeout=30).json()[
            "workers"]) == ["0", "1", "2"], 60)

        # calls in flight on the workers, then a pause through the one address: it answers once all are done
        n0 = _model_calls(up)
        with ThreadPoolExecutor(9) as flight:
            before = [flight.submit(_chat, base, tokens[i], f"slow-{i}") for i in range(9)]
            assert _eventually(lambda: _model_calls(up) - n0 == 9), "the slow calls did not reach the engine"
            t0 = time.monotonic()
            paused = _post(base, "/admin/pause", {"drain": True, "timeout_s": 60})
            answered = time.monotonic()
            assert paused.status_code == 200, paused.text
            body = paused.json()
            assert body["drained"] is True and body["in_flight"] == 0 and body["in_flight_at_pause"] == 9
            assert sorted(body["workers"]) == ["0", "1", "2"]
            assert all(w["paused"] and w["drained"] for w in body["workers"].values())
            assert answered - t0 > SLOW_S / 2  # it waited for the calls in flight
            results = [f.result() for f in before]
        assert all(status == 200 for status, _, _ in results)
        assert max(ended for _, _, ended in results) <= answered + 0.5  # every one had ended when the pause answered

        # paused: no worker starts a new call (many at once, each on a fresh connection)
        n1 = _model_calls(up)
        held_pool = ThreadPoolExecutor(30)
        held = [held_pool.submit(_chat, base, tokens[i % 12], f"held-{i}") for i in range(30)]
        time.sleep(3.0)
        assert _model_calls(up) == n1, "a worker started an upstream call while the proxy was paused"
        assert not any(f.done() for f in held)
        workers = httpx.get(base + "/admin/status", headers=AUTH, timeout=30).json()["workers"]
        assert all(w["paused"] for w in workers.values()) and len(workers) == 3

        resumed = _post(base, "/admin/resume")
        assert resumed.status_code == 200 and resumed.json()["was_paused"] is True
        assert all(not w["paused"] for w in resumed.json()["workers"].values())
        assert all(f.result()[0] == 200 for f in held)  # the held calls run once resumed
        held_pool.shutdown()

        # a new policy version through the one address: every worker records under it
        r = _post(base, "/admin/policy_versions", {"id": "v2", "model_name": "m"})
        assert r.status_code == 200 and r.json()["previous"] == "v1", r.text
        seen = _until_every_replica(base, tokens, pg_database, [], tag="v2")
        assert {version for version, _ in seen.values()} == {"v2"}
        assert {replica for _, replica in seen.values()} == {"0", "1", "2"}

        # paused, a new version activated, a worker SIGKILLed: its replacement is paused and under v3
        assert _post(base, "/admin/pause", {"drain": True, "timeout_s": 60}).json()["drained"] is True
        assert _post(base, "/admin/policy_versions/v3/activate").json()["previous"] == "v2"
        victim = _children(sup.pid)[1]
        rid = _replica_of(victim)
        os.kill(victim, signal.SIGKILL)
        assert _eventually(lambda: len(_children(sup.pid)) == 3 and victim not in _children(sup.pid), 30)

        def replacement() -> dict | None:
            ws = httpx.get(base + "/admin/status", headers=AUTH, timeout=30).json()["workers"]
            return ws.get(rid) if len(ws) == 3 else None

        back = _eventually(replacement, 60)
        assert back is not None, "the replacement worker never answered"
        assert back["paused"] is True and back["policy_version"] == "v3"
        n2 = _model_calls(up)
        with ThreadPoolExecutor(30) as pool:
            held = [pool.submit(_chat, base, tokens[i % 12], f"held2-{i}") for i in range(30)]
            time.sleep(3.0)
            assert _model_calls(up) == n2, "a worker (the replacement?) started a call while paused"
            assert _post(base, "/admin/resume").status_code == 200
            held_ids = [f.result()[1] for f in held]
        assert all(held_ids)
        seen = _until_every_replica(base, tokens, pg_database, held_ids, tag="v3")
        assert {version for version, _ in seen.values()} == {"v3"}
        assert rid in {replica for _, replica in seen.values()}  # the replacement served, under v3
        ups = httpx.get(base + "/admin/upstreams", headers=AUTH, timeout=30).json()
        assert sorted(ups["workers"]) == ["0", "1", "2"]

        # the fence through the one address: a policy switch, then a trainer's weight update whose hook runs once
        admin = AdminClient(base, ADMIN)
        try:
            switched = switch_policy(admin, lambda: None, version="v4", model_name="m")
        finally:
            admin.close()
        assert switched.previous == "v3"
        hooks = len([r for r in up.double.requests if r.path == "/tokenize"])
        r = _post(base, "/admin/weights/update", {"version": "v5", "model_name": "m", "hook": {
            "path": "/tokenize", "body": {"model": "m", "prompt": "load the new weights"}}})
        assert r.status_code == 200 and r.json()["previous"] == "v4", r.text
        assert len([r for r in up.double.requests if r.path == "/tokenize"]) == hooks + 1  # once, not per worker
        workers = httpx.get(base + "/admin/status", headers=AUTH, timeout=30).json()["workers"]
        assert {(w["policy_version"], w["paused"]) for w in workers.values()} == {("v5", False)} and len(workers) == 3
    finally:
        sup.send_signal(signal.SIGTERM)
        sup.wait(90)
    assert sup.returncode == 0
    log = (tmp_path / "w.log").read_text()
    assert log.count("restarting it") == 1 and "Traceback" not in log


# ---- in process: two workers on one run folder ----------------------------------------------------------------
@pytest.fixture
def pair(up, tmp_path, pg_database):
    """Workers "0" and "1" of one run folder, each on its own loopback port and its private socket."""
    run = Path(tempfile.mkdtemp(prefix="of-test-"))  # short: a Unix socket's path has ~100 bytes
    settings = Settings(home=tmp_path / "home")
    ps = ProxySettings(admin_token=ADMIN)
    started = []
    for rid in ("0", "1"):
        tcp = socket.socket()
        tcp.bind(("127.0.0.1", 0))
        private = bind_private(run, rid)
        proxy = build_proxy(up.url, settings=settings, store_url=pg_database, replica_id=rid, run_dir=run,
                            proxy_settings=ps)
        server = HttpServer(proxy.app, max_body=proxy.service.max_body, graceful_s=1)
        server.start_in_thread([tcp, private])
        started.append((f"http://127.0.0.1:{tcp.getsockname()[1]}", proxy, server))
    yield run, started, settings, pg_database
    for _, proxy, server in started:
        server.stop()
        server.join()
        proxy.store.close()
    shutil.rmtree(run, ignore_errors=True)


def test_upstream_changes_reach_the_sibling_and_a_silent_worker_is_named(pair, tokenizer, monkeypatch):
    run, [(a, pa, _), (b, pb, _)], settings, pg_url = pair
    second = UpstreamServer(ScriptedUpstream(tokenizer=tokenizer))
    url2 = second.start()
    try:
        added = _post(a, "/admin/upstreams", {"url": url2})
        assert added.status_code == 200 and sorted(added.json()["workers"]) == ["0", "1"], added.text
        assert [r.url for r in pb.service.upstream.replicas] == [pa.service.upstream.replicas[0].url, url2]
        assert _post(b, "/admin/upstreams/drain", {"url": url2, "timeout_s": 1}).status_code == 200
        assert pa.service.upstream.find(url2).state == "draining"
        view = httpx.get(a + "/admin/upstreams", headers=AUTH, timeout=30).json()["workers"]
        assert [u["state"] for u in view["1"]["upstreams"]] == ["up", "draining"]
        assert _post(a, "/admin/pause", {"drain": True, "timeout_s": 5}).json()["workers"]["1"]["paused"]
        # a worker starting now takes the state the last change left, not its command line's
        late = build_proxy("http://127.0.0.1:1", settings=settings, store_url=pg_url, replica_id="9", run_dir=run,
                           proxy_settings=ProxySettings(admin_token=ADMIN))
        try:
            assert [(r.url, r.state) for r in late.service.upstream.replicas] == [(up_url(pa), "up"),
                                                                                  (url2, "draining")]
            assert late.service.rollouts.paused
        finally:
            late.store.close()
            late.service.rollouts.ledger.close()
        assert _post(b, "/admin/resume").json()["workers"]["0"]["paused"] is False
        assert _post(a, "/admin/upstreams/remove", {"url": url2}).status_code == 200
        assert len(pb.service.upstream.replicas) == 1
        # and the state file has what the last change left: v2, the one engine replica
        assert _post(b, "/admin/policy_versions/v2/activate").status_code == 200
        state = json.loads((run / "state.json").read_text())
        assert state["policy_version"] == "v2" and [u["url"] for u in state["upstreams"]] == [up_url(pa)]
        assert pa.service.rollouts.policy_version == "v2"
        r = _post(a, "/admin/policy_versions", {"id": "org/v2.1", "model_name": "m"})  # any id, a '/' too
        assert r.status_code == 200 and pb.service.rollouts.policy_version == "org/v2.1", r.text
    finally:
        second.stop()

    # a worker that accepts but never answers: named; the pause it did not take is undone everywhere
    silent = bind_private(run, "2")
    monkeypatch.setattr("proxy._fleet.MARGIN_S", 0.5)
    monkeypatch.setattr("proxy._siblings.TIMEOUT_S", 1.0)
    try:
        t0 = time.monotonic()
        r = _post(a, "/admin/pause", {"drain": True, "timeout_s": 0.5})
        assert r.status_code == 503 and time.monotonic() - t0 < 10, r.text
        error = r.json()["error"]
        assert error["code"] == "worker_failed"
        assert "worker 2: no answer within 1s" in error["message"]
        assert "undone: worker(s) 0, 1 resumed; the resume failed on worker 2" in error["message"]
        assert not pa.service.rollouts.paused and not pb.service.rollouts.paused
        assert json.loads((run / "state.json").read_text())["paused"] is False
        r = _post(b, "/admin/policy_versions/v3/activate")
        assert r.status_code == 503 and "on worker(s) 0, 1 but not on worker 2" in r.json()["error"]["message"]
        assert pa.service.rollouts.policy_version == "v3"  # applied where it could be, and said so
        # the forwarded mark on the public port is no way around the fan-out
        r = httpx.post(a + "/admin/resume", headers={**AUTH, FORWARDED: "1"}, timeout=30)
        assert r.status_code == 503 and "worker 2" in r.json()["error"]["message"]
        # the admin token is checked on the private socket too
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(run / "1.sock")), base_url="http://w") as c:
            assert c.post("/admin/pause", headers={FORWARDED: "0"}).status_code == 401
            assert not pb.service.rollouts.paused
    finally:
        silent.close()


def up_url(proxy) -> str:
    return proxy.service.upstream.replicas[0].url
