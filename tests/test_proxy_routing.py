"""Routing over engine replicas (``proxy._upstream.pool``): four engine doubles, each in its own process, behind one
proxy, 64 concurrent rollouts through the official OpenAI SDK over loopback.

What must hold: calls spread within 10% across healthy replicas; every call of a rollout goes to one replica while it
is healthy; a replica killed (SIGKILL) mid-run loses no call a client received in full (every answer a client got
is in the store exactly once), the calls it broke are recorded as failed and retried on another replica
(``retry_of``, ``failover_from``); replicas of another engine are refused at start and when added (replicas of other
models are admitted: tests/test_model_replicas.py routes by model);
the admin routes list, add, drain and remove replicas; a replica that comes back is marked up again."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict

import httpx
import openai
import pytest

from forge_store import Settings
from proxy import build_proxy
from proxy.engines.scripted import ScriptedUpstream, UpstreamServer
from tests.doubles.engine_replicas import EngineReplicas
from tests.proxy_fixtures import ProxyHarness, ServeInThread

CLIENTS = 64
CALLS = 4  # per rollout, in the spread test


class Routed:
    """A proxy over ``urls`` served in a thread, with the harness helpers of ``tests.proxy_fixtures``."""

    def __init__(self, urls, tmp_path, health_interval_s: float = 0.25):
        self.proxy = build_proxy(urls, settings=Settings(home=tmp_path / "home"),
                                 store_url=f"sqlite:///{tmp_path / 'proxy.sqlite'}")
        self.proxy.service.upstream.health_interval_s = health_interval_s
        self.serve = ServeInThread(self.proxy.app)
        self.px = ProxyHarness(self.proxy, self.serve.start(), up=None)

    def close(self) -> None:
        self.serve.stop()
        self.proxy.store.close()

    def upstreams(self) -> dict[str, dict]:
        r = self.px.admin("GET", "/admin/upstreams")
        assert r.status_code == 200, r.text
        return {u["url"]: u for u in r.json()["upstreams"]}


async def rollout(px: ProxyHarness, rid: str, token: str, calls: int, stream: bool, got: list,
                  stop: threading.Event | None) -> None:
    """One harness: ``calls`` turns (or until ``stop``), each prompt the last plus the answer and a new user turn.
    ``got``: (rollout, call id) of every answer received in full."""
    client = openai.AsyncOpenAI(base_url=px.url + "/v1", api_key=token, max_retries=0, timeout=60)
    messages = [{"role": "user", "content": f"task {rid}"}]
    n = 0
    try:
        while n < calls and not (stop is not None and stop.is_set()):
            n += 1
            try:
                raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages,
                                                                             stream=stream)
                if stream:
                    text, done = "", False
                    async for chunk in raw.parse():
                        if chunk.choices:
                            text += chunk.choices[0].delta.content or ""
                            done = done or chunk.choices[0].finish_reason is not None
                    if not done:
                        continue
                else:
                    text = raw.parse().choices[0].message.content
            except (openai.APIError, openai.APIConnectionError):
                continue  # not received in full: nothing to hold the proxy to
            got.append((rid, raw.headers["x-openforge-call-id"]))
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"go on {n}"}]
            messages = messages[:1] + messages[-6:]
    finally:
        await client.close()


def run_clients(px, calls: int, stop: threading.Event | None = None) -> list:
    """``CLIENTS`` rollouts (every fourth streamed), registered first, then started together."""
    with httpx.Client(base_url=px.url, headers={"Authorization": f"Bearer {px.proxy.admin_token}"},
                      timeout=60) as admin:
        tokens = {f"r{i}": admin.post("/admin/rollouts", json={"rollout_id": f"r{i}"}).json()["token"]
                  for i in range(CLIENTS)}

    async def main() -> list:
        got: list = []
        await asyncio.gather(*(rollout(px, rid, token, calls, i % 4 == 0, got, stop)
                               for i, (rid, token) in enumerate(tokens.items())))
        return got

    return asyncio.run(main())


@pytest.fixture(scope="module")
def engines():
    """Four engine doubles for this module's two load tests; the second kills one, so it runs last."""
    with EngineReplicas(4, slow=0.15) as e:  # 64 first calls reach the proxy before the first answer
        yield e


def test_spread_and_affinity_over_four_replicas(engines, tmp_path):
    assert not engines.killed, "the kill test ran first: run this module's tests in file order"
    routed = Routed(engines.urls, tmp_path)
    try:
        got = run_clients(routed.px, calls=CALLS)
        assert len(got) == CLIENTS * CALLS
        per_replica = engines.calls()
        mean = sum(per_replica.values()) / 4
        assert sum(per_replica.values()) == CLIENTS * CALLS
        assert all(abs(n - mean) <= 0.10 * mean for n in per_replica.values()), per_replica
        listing = routed.upstreams()
        assert {u["state"] for u in listing.values()} == {"up"}
        assert all(u["engine"] == "vllm" for u in listing.values())
        by_rollout = defaultdict(set)
        stored = 0
        for i in range(CLIENTS):
            for c in routed.px.calls(f"r{i}"):
                assert c.error_class is None and c.retry_of is None
                by_rollout[c.rollout_id].add(c.metadata["upstream"])
                stored += 1
        assert stored == CLIENTS * CALLS
        assert all(len(u) == 1 for u in by_rollout.values()), by_rollout  # 100% affinity
        bound = Counter(next(iter(u)) for u in by_rollout.values())
        assert {url: u["rollouts"] for url, u in listing.items()} == dict(bound)
        for i in range(CLIENTS):
            routed.px.end(f"r{i}")
        assert {u["rollouts"] for u in routed.upstreams().values()} == {0}  # ended rollouts bind nothing
    finally:
        routed.close()


def test_a_replica_killed_mid_run_loses_no_answered_call(engines, tmp_path):
    routed = Routed(engines.urls, tmp_path)
    victim = engines.urls[2]
    stop = threading.Event()

    def killer():
        """Once calls flow and some are in flight on the victim: SIGKILL it; the load goes on a while."""
        pool = routed.proxy.service.upstream
        victim_rep = next(r for r in pool.replicas if r.url == victim)
        deadline = time.monotonic() + 60
        while (victim_rep.calls < 32 or victim_rep.client.outstanding == 0) and time.monotonic() < deadline:
            time.sleep(0.005)
        engines.kill(2)
        time.sleep(2.0)
        stop.set()

    try:
        t = threading.Thread(target=killer)
        t.start()
        got = run_clients(routed.px, calls=10_000, stop=stop)
        t.join()
        assert routed.px.store.flush(60)
        ids = [cid for _, cid in got]
        assert len(ids) == len(set(ids))
        assert routed.px.store.known_call_ids(ids) == set(ids)  # every answer a client got is stored
        failed, retries, switched = {}, [], 0
        for i in range(CLIENTS):
            calls = routed.px.calls(f"r{i}")
            ok = [c for c in calls if c.error_class is None]
            # exactly once: the answers stored for this rollout are the ones its client received in full
            assert sorted(c.id for c in ok) == sorted(cid for rid, cid in got if rid == f"r{i}")
            failed.update({c.id: c for c in calls if c.error_class == "upstream_unreachable"})
            retries += [c for c in calls if c.retry_of is not None]
            path = [c.metadata["upstream"] for c in ok]
            changes = sum(1 for a, b in zip(path, path[1:]) if a != b)
            assert changes <= 1, path  # affinity while healthy: one move, off the killed replica, at most
            if changes:
                assert path[0] == victim != path[-1], path  # from the victim to a live one
                switched += 1
        assert failed, "the kill broke no call in flight and no call tried the dead replica"
        assert all(c.metadata["upstream"] == victim for c in failed.values())
        for r in retries:  # a retry names the attempt it repeats and the replica that failed it
            assert r.retry_of in failed and r.metadata["failover_from"] == victim
            assert r.metadata["upstream"] != victim
        assert retries and switched
        listing = routed.upstreams()
        assert listing[victim]["state"] == "down" and listing[victim]["failures"] >= 1
        assert {listing[u]["state"] for u in engines.urls if u != victim} == {"up"}
        survivors = {i: n for i, n in engines.calls().items() if i != 2}
        assert len(survivors) == 3
    finally:
        routed.close()


# ---- admission, the admin routes, health (in-process doubles) ----------------------------------------------------
def _double(tokenizer, **kw) -> tuple[ScriptedUpstream, UpstreamServer, str]:
    double = ScriptedUpstream(tokenizer=tokenizer, **kw)
    server = UpstreamServer(double)
    return double, server, server.start()


def test_other_engines_are_refused_and_other_models_admitted_at_start_and_when_added(tokenizer, tmp_path):
    _, s1, vllm_a = _double(tokenizer)
    _, s2, vllm_b = _double(tokenizer)
    _, s3, plain = _double(tokenizer, owned_by="openai")
    _, s4, other_model = _double(tokenizer, model="someone/else")
    try:
        with pytest.raises(ValueError) as refused:
            build_proxy([vllm_a, plain], settings=Settings(home=tmp_path / "h1"),
                        store_url=f"sqlite:///{tmp_path / 'a.sqlite'}")
        msg = str(refused.value)
        assert plain in msg and "'openai'" in msg and "'vllm' dialect" in msg and "own proxy" in msg
        mixed = build_proxy([vllm_a, other_model], settings=Settings(home=tmp_path / "h2"),
                            store_url=f"sqlite:///{tmp_path / 'b.sqlite'}")
        mixed.store.close()
        cli = subprocess.run([sys.executable, "-m", "openforge.cli", "proxy", "--upstream", vllm_a, "--upstream", plain,
                              "--port", "0", "--store", f"sqlite:///{tmp_path / 'c.sqlite'}"], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "OPENFORGE_HOME": str(tmp_path / "h3")})
        assert cli.returncode == 2 and "is a 'openai' server" in cli.stderr, cli.stderr

        routed = Routed([vllm_a], tmp_path / "p")
        try:
            r = routed.px.admin("POST", "/admin/upstreams", json={"url": plain})
            assert r.status_code == 409 and r.json()["error"]["code"] == "dialect_mismatch", r.text
            r = routed.px.admin("POST", "/admin/upstreams", json={"url": other_model})
            assert r.status_code == 200 and r.json()["models"] == ["someone/else"], r.text
            r = routed.px.admin("POST", "/admin/upstreams/remove", json={"url": other_model})
            assert r.status_code == 200, r.text
            r = routed.px.admin("POST", "/admin/upstreams", json={"url": "http://127.0.0.1:9"})
            assert r.status_code == 424 and r.json()["error"]["code"] == "upstream_unreachable"
            r = routed.px.admin("POST", "/admin/upstreams", json={"url": "ftp://x"})
            assert r.status_code == 400
            assert list(routed.upstreams()) == [vllm_a]
            r = routed.px.admin("POST", "/admin/upstreams", json={"url": vllm_b + "/v1"})
            assert r.status_code == 200 and r.json()["added"] is True and r.json()["engine"] == "vllm"
            assert set(routed.upstreams()) == {vllm_a, vllm_b}
        finally:
            routed.close()
    finally:
        for s in (s1, s2, s3, s4):
            s.stop()


def test_drain_remove_add_and_health(tokenizer, tmp_path):
    d1, s1, a = _double(tokenizer)
    d2, s2, b = _double(tokenizer)
    routed = Routed([a, b], tmp_path)
    px = routed.px
    try:
        token = px.register("h1")
        client = px.client(token)
        ask = lambda: client.chat.completions.with_raw_response.create(  # noqa: E731
            model="m", messages=[{"role": "user", "content": "hi"}])
        ask()
        home = next(u for u, d in routed.upstreams().items() if d["calls"] == 1)
        away = b if home == a else a
        r = px.admin("POST", "/admin/upstreams/drain", json={"url": home, "timeout_s": 5})
        assert r.status_code == 200 and r.json()["drained"] is True and r.json()["state"] == "draining"
        def calls_to_home() -> int:   # model calls only: the health check still asks a draining replica /v1/models
            return sum(r.path != "/v1/models" for r in (d1 if home == a else d2).requests)

        before = calls_to_home()
        for _ in range(3):
            ask()
        assert calls_to_home() == before  # nothing new to the draining replica
        assert routed.upstreams()[away]["calls"] == 3
        r = px.admin("POST", "/admin/upstreams", json={"url": home})
        assert r.status_code == 200 and r.json()["added"] is False and r.json()["was"] == "draining"
        r = px.admin("POST", "/admin/upstreams/remove", json={"url": home})
        assert r.status_code == 200 and r.json()["state"] == "removed"
        r = px.admin("POST", "/admin/upstreams/remove", json={"url": away})
        assert r.status_code == 409 and r.json()["error"]["code"] == "last_upstream"
        r = px.admin("POST", "/admin/upstreams/remove", json={"url": "http://127.0.0.1:1"})
        assert r.status_code == 404
        ask()  # one replica left: it takes the call
        r = px.admin("POST", "/admin/upstreams", json={"url": home})
        assert r.status_code == 200 and r.json()["added"] is True

        # health: a stopped replica is marked down by the periodic check, and up again once it answers
        (s1 if home == a else s2).stop()
        deadline = time.monotonic() + 10
        while routed.upstreams()[home]["state"] != "down":
            assert time.monotonic() < deadline, routed.upstreams()
            time.sleep(0.05)
        fresh = px.client(px.register("h2"))
        for _ in range(4):  # a new rollout binds to the healthy replica: no attempt on the down one
            fresh.chat.completions.create(model="m", messages=[{"role": "user", "content": "new"}])
        assert [c.error_class for c in px.calls("h2")] == [None] * 4
        assert {c.metadata["upstream"] for c in px.calls("h2")} == {away}
        (s1 if home == a else s2).start()
        while routed.upstreams()[home]["state"] != "up":
            assert time.monotonic() < deadline + 10, routed.upstreams()
            time.sleep(0.05)
    finally:
        routed.close()
        s1.stop()
        s2.stop()
