"""Weight-sync fencing under load, through ``POST /admin/weights/update`` (pause -> drain -> hook -> register and
activate -> resume in one call), over two engine replicas whose every answer names the weights that produced it.

With 16 concurrent rollouts (half streamed) while the update runs again and again: every stored call carries the
policy version whose weights answered it; calls in flight at the pause finish (not fail) under the old version; calls
that arrive during the pause wait (not fail) and run under the new one; the new version's row records its global
step and parent, as the lineage reads them. And the failures: a drain that times out, a hook that fails everywhere
(old version kept, proxy resumed), a hook that fails on one replica (that replica refused, the update goes on)."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import openai
import pytest

from forge_store import Settings
from learner import policy_lineage
from proxy import build_proxy
from proxy.engines.scripted import ScriptedUpstream, UpstreamServer
from tests.proxy_fixtures import ProxyHarness, ServeInThread

UPDATES = 4
LOAD_S = 0.4  # how long an engine takes to load new weights (the hook's answer waits that long)


def serving(weights: str, chunk_delay: float = 0.01) -> dict:
    """The engine's answer while it holds ``weights``: named in the text, streamed slowly enough to stay open."""
    return {"delay": 0.0, "chunk_delay": chunk_delay, "times": None,
            "then": {"text": f"weights={weights} " + "word " * 12}}


def answered_by(call) -> str:
    found = re.match(r"weights=(\S+)", (call.response or {}).get("text") or "")
    assert found, f"call {call.id}: no weights in its answer ({call.error_class})"
    return found.group(1)


@pytest.fixture
def fenced(tokenizer, tmp_path):
    doubles, servers = [], []
    for _ in range(2):
        d = ScriptedUpstream(tokenizer=tokenizer)
        d.script.replace([serving("v0")])
        d.set_slow(0.02)  # each request spends a while in the engine
        doubles.append(d)
        servers.append(UpstreamServer(d))
    urls = [s.start() for s in servers]
    proxy = build_proxy(urls, settings=Settings(home=tmp_path / "home"),
                        store_url=f"sqlite:///{tmp_path / 'proxy.sqlite'}")
    serve = ServeInThread(proxy.app)
    px = ProxyHarness(proxy, serve.start(), up=None)
    r = px.admin("POST", "/admin/policy_versions", json={"id": "v0", "model_name": "smollm2"})
    assert r.status_code == 200, r.text
    yield px, doubles, urls, servers
    serve.stop()
    proxy.store.close()
    for s in servers:
        s.stop()


def update(px, k: int, **extra) -> httpx.Response:
    body = {"version": f"v{k}", "model_name": "smollm2", "global_step": k * 10, "parent": f"v{k - 1}",
            "hook": {"path": "/_scripted/load", "body": {"seconds": LOAD_S, "steps": [serving(f"v{k}")]}}, **extra}
    return px.admin("POST", "/admin/weights/update", json=body)


async def harness(px, rid: str, token: str, stream: bool, stop: threading.Event, log: list, errors: list) -> None:
    client = openai.AsyncOpenAI(base_url=px.url + "/v1", api_key=token, max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "hello"}]
    try:
        while not stop.is_set():
            t0 = time.time()  # wall clock, as the proxy's paused_at / resumed_at
            try:
                raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages,
                                                                             stream=stream)
                if stream:
                    text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
                else:
                    text = raw.parse().choices[0].message.content
            except openai.APIError as exc:
                errors.append(f"{rid}: {exc}")
                continue
            log.append((raw.headers["x-openforge-call-id"], t0, time.time()))
            messages = messages[:1] + [{"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
    finally:
        await client.close()


def test_updates_under_load_fence_every_call(fenced):
    px, doubles, urls, _ = fenced
    stop, log, errors, windows, answers = threading.Event(), [], [], [], []

    def calls_flow(n: int) -> None:  # until n more answers came (whatever the machine's load)
        target, deadline = len(log) + n, time.monotonic() + 120
        while len(log) < target and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.01)

    def trainer():
        try:
            for k in range(1, UPDATES + 1):
                calls_flow(24)
                r = update(px, k)
                answers.append(r)
                if r.status_code == 200:
                    windows.append((r.json()["paused_at"], r.json()["resumed_at"], f"v{k - 1}", f"v{k}"))
            calls_flow(24)
        finally:
            stop.set()

    tokens = [px.register(f"f{i}") for i in range(16)]

    async def load():
        await asyncio.gather(*(harness(px, f"f{i}", tokens[i], i % 2 == 0, stop, log, errors) for i in range(16)))

    t = threading.Thread(target=trainer)
    t.start()
    asyncio.run(load())
    t.join()
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    assert not errors, errors[:5]  # nothing failed: held calls waited
    assert px.store.flush(60)
    stored = {c.id: c for i in range(16) for c in px.calls(f"f{i}")}
    assert {cid for cid, _, _ in log} == set(stored)
    wrong = [(c.id, c.policy_version_id, answered_by(c)) for c in stored.values()
             if c.policy_version_id != answered_by(c)]
    assert not wrong, wrong[:5]
    assert {c.policy_version_id for c in stored.values()} == {f"v{k}" for k in range(UPDATES + 1)}
    assert all({h["url"] for h in r.json()["hook"]} == set(urls) for r in answers)

    held = finished_in_pause = 0
    for paused, resumed, old, new in windows:  # the proxy's clock: it runs in this process
        for cid, start, end in log:
            if paused < start < resumed:  # sent while the proxy was paused: waited (not failed), then the new version
                assert stored[cid].policy_version_id == new, (cid, stored[cid].policy_version_id, new)
                assert end > resumed, (cid, start, end, resumed)
                held += 1
            if paused < end < resumed:  # answered during the pause: admitted before it, so under the old version
                assert stored[cid].policy_version_id == old, (cid, stored[cid].policy_version_id, old)
                finished_in_pause += 1
    assert held > 0 and finished_in_pause > 0, (held, finished_in_pause)

    chain = policy_lineage(px.store, f"v{UPDATES}")
    assert [link["policy_version"] for link in chain] == [f"v{k}" for k in range(UPDATES + 1)]
    assert [link["global_step"] for link in chain[1:]] == [k * 10 for k in range(1, UPDATES + 1)]
    assert [link["parent"] for link in chain[1:]] == [f"v{k - 1}" for k in range(1, UPDATES + 1)]


def test_failed_updates_keep_the_old_version_and_resume(fenced):
    px, doubles, urls, servers = fenced
    client = px.client(px.register("g1"))
    ask = lambda: client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])  # noqa: E731

    # a drain that cannot finish: nothing loaded, v0 stays, the proxy resumes
    doubles[0].script.replace([serving("v0", chunk_delay=0.2)])
    doubles[1].script.replace([serving("v0", chunk_delay=0.2)])
    streamer = threading.Thread(target=lambda: list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "slow"}], stream=True)))
    streamer.start()
    time.sleep(0.3)
    r = update(px, 1, drain_timeout_s=0.2)
    assert r.status_code == 409 and r.json()["error"]["code"] == "drain_timeout", r.text
    assert "'v0' stays active" in r.json()["error"]["message"]
    streamer.join()
    status = px.admin("GET", "/admin/status").json()
    assert status["policy_version"] == "v0" and status["paused"] is False
    for d in doubles:
        d.script.replace([serving("v0")])

    # a hook every replica fails: 424, v0 stays, resumed, no replica refused
    r = px.admin("POST", "/admin/weights/update", json={"version": "v1", "model_name": "smollm2",
                                                        "hook": {"path": "/no/such/route"}})
    assert r.status_code == 424 and r.json()["error"]["code"] == "hook_failed", r.text
    status = px.admin("GET", "/admin/status").json()
    assert status["policy_version"] == "v0" and status["paused"] is False
    ask()
    last = px.calls("g1")[-1]
    assert last.policy_version_id == "v0" == answered_by(last)
    assert {u["state"] for u in px.admin("GET", "/admin/upstreams").json()["upstreams"]} == {"up"}

    # a replica the hook cannot reach (its engine died): refused (it may hold either weights), the update goes on
    servers[1].stop()
    r = px.admin("POST", "/admin/weights/update", json={
        "version": "v1", "model_name": "smollm2", "global_step": 1, "parent": "v0",
        "hook": {"path": "/_scripted/load", "body": {"steps": [serving("v1")]}, "timeout_s": 5}})
    assert r.status_code == 200, r.text
    states = {u["url"]: u for u in px.admin("GET", "/admin/upstreams").json()["upstreams"]}
    assert states[urls[1]]["state"] == "refused" and "weight" in states[urls[1]]["last_error"]
    assert states[urls[0]]["state"] == "up"
    for _ in range(4):
        ask()
    assert {(c.policy_version_id, answered_by(c)) for c in px.calls("g1")[-4:]} == {("v1", "v1")}

    # without a hook, after the caller paused the proxy itself: the route activates and resumes
    assert px.admin("POST", "/admin/pause", json={"drain": True}).json()["drained"] is True
    for d in doubles:
        d.script.replace([serving("v2")])
    r = px.admin("POST", "/admin/weights/update", json={"version": "v2", "model_name": "smollm2", "parent": "v1"})
    assert r.status_code == 200 and r.json()["was_paused"] is True and r.json()["previous"] == "v1"
    ask()
    last = px.calls("g1")[-1]
    assert last.policy_version_id == "v2" == answered_by(last)
