"""Proxy replicas on one PostgreSQL store (issue 23): any replica serves any rollout's token and continues any
replica's Responses conversation; a replica killed with un-drained journal entries is drained by its successor;
``openforge proxy --workers 2`` serves on one port and restarts a killed worker."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import sqlalchemy as sa

from forge_store import Settings
from proxy import build_proxy
from tests.netfault import TcpRelay, free_port
from tests.proxy_fixtures import ProxyHarness, ServeInThread

OPENFORGE = str(Path(sys.executable).parent / "openforge")
ADMIN = "test-admin-token-0123456789"
SECRET = "replicas-share-this-token-secret-0123"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
                       "AAAABJRU5ErkJggg==")


@pytest.fixture
def replicas(up, tmp_path, pg_database):
    """Two replicas in this process ("1", "2"), sharing a home (secret, admin token) and the PostgreSQL store."""
    started = []

    def start(rid: str) -> ProxyHarness:
        proxy = build_proxy(up.url, settings=Settings(home=tmp_path / "home"), store_url=pg_database, replica_id=rid)
        serve = ServeInThread(proxy.app)
        started.append((serve, proxy))
        return ProxyHarness(proxy, serve.start(), up, serve.server)

    yield start("1"), start("2")
    for serve, proxy in started:
        serve.stop()
        proxy.store.close()


def _eventually(check, timeout_s: float = 15.0):
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.1)


def test_each_replica_has_its_own_journal_and_ledger(replicas, tmp_path):
    r1, r2 = replicas
    home = tmp_path / "home"
    assert (home / "journal" / "proxy-1").is_dir() and (home / "journal" / "proxy-2").is_dir()
    assert (home / "proxy-rollouts" / "proxy-1.ledger").is_file()
    assert (home / "proxy-rollouts" / "proxy-2.ledger").is_file()
    with pytest.raises(ValueError, match="replica id '../x'"):
        build_proxy("http://127.0.0.1:1", settings=Settings(home=home), replica_id="../x")


def test_a_token_registered_on_one_replica_works_on_another_until_ended(replicas):
    r1, r2 = replicas
    token = r1.register("ro-1")
    answer = r2.client(token).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content
    answer = r1.client(token).chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
    calls = r2.calls("ro-1") if r1.store.flush(30) else []
    assert [c.messages[-1]["content"] for c in calls] == ["hi", "again"]
    r1.end("ro-1")  # without an outcome: r2 learns it from the store (the end's event), within its sync period

    def refused() -> bool:
        try:
            r2.client(token).chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}])
        except openai.AuthenticationError as exc:
            return "has ended" in str(exc)
        return False

    assert _eventually(refused), "replica 2 still serves a token replica 1 ended"
    # a replica that never served the rollout refuses it at once: the store has the end
    token = r1.register("ro-2")
    r1.end("ro-2")
    assert r1.store.flush(30)
    with pytest.raises(openai.AuthenticationError, match="has ended"):
        r2.client(token).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_a_token_nobody_registered_is_refused(replicas):
    r1, r2 = replicas
    forged = r1.proxy.signer.issue("never-registered")  # signed with the shared secret, never registered
    t0 = time.monotonic()
    with pytest.raises(openai.AuthenticationError, match="nor, within 5s, in the store"):
        r2.client(forged).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert time.monotonic() - t0 >= 4.5  # it waited for a registration still on its way from another replica


def test_previous_response_id_across_replicas(replicas):
    r1, r2 = replicas
    token = r1.register("ro-resp")
    image = "data:image/png;base64," + base64.b64encode(PNG).decode()
    first = r1.client(token).responses.create(
        model="m", instructions="Be brief.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "what is on screen"},
                                            {"type": "input_image", "image_url": image}]}])
    n = len(r1.up.double.requests)
    second = r2.client(token).responses.create(model="m", instructions="Be brief.", previous_response_id=first.id,
                                               input="and now?")
    assert second.output_text
    sent = r2.up.double.requests[n].json["messages"]  # what replica 2 sent upstream: the whole conversation
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[0]["content"] == "Be brief." and sent[2]["content"] == first.output_text
    assert sent[1]["content"][1] == {"type": "image_url", "image_url": {"url": image}}  # the image, restored whole
    assert sent[3]["content"] == "and now?"
    # and back: replica 1 continues the response replica 2 answered (from the store again)
    third = r1.client(token).responses.create(model="m", previous_response_id=second.id, input="last")
    sent = r1.up.double.requests[-1].json["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"] and third.output_text
    # another rollout cannot continue it
    other = r1.register("ro-other")
    with pytest.raises(openai.BadRequestError, match="not known to this proxy"):
        r2.client(other).responses.create(model="m", previous_response_id=first.id, input="steal")


def test_the_store_reads_replicas_use(store_url, settings):
    """``find_call``, ``ended_rollouts`` and ``restore_images`` on SQLite and PostgreSQL."""
    from forge_store import NotFound, open_store
    from tests.conftest import make_call, start_draft

    image = "data:image/png;base64," + base64.b64encode(PNG).decode()
    with open_store(store_url, settings=settings) as store:
        for rid in ("a", "b", "c"):
            store.start_rollout(rid)
        for turn, rid in enumerate(("a", "a", "b")):
            msgs = [{"role": "user", "content": [{"type": "text", "text": f"turn {turn}"},
                                                 {"type": "image_url", "image_url": {"url": image}}]}]
            rec = make_call(f"call-{turn}", rid, turn, messages=msgs, metadata={"response_id": f"resp_{turn}"})
            asyncio.run(start_draft(store, rec).finish())
        found = store.find_call("a", "response_id", "resp_1")
        assert found.id == "call-1" and image not in str(found.messages)  # stored as a blob reference
        assert store.restore_images(found.messages) == [{"role": "user", "content": [
            {"type": "text", "text": "turn 1"}, {"type": "image_url", "image_url": {"url": image}}]}]
        with pytest.raises(NotFound):
            store.find_call("a", "response_id", "resp_2")  # rollout b's: never another rollout's call
        store.finish_rollout("b", "success")
        store.add_event("rollout.token_ended", source="proxy", rollout_id="c")
        assert store.ended_rollouts(["a", "b", "c", "zz"]) == {"b"}
        assert store.ended_rollouts(["a", "b", "c", "zz"], "rollout.token_ended") == {"b", "c"}


# ---- out of process: kill -9 and --workers ----------------------------------------------------------------------
def _env(home: Path) -> dict:
    return {**os.environ, "OPENFORGE_HOME": str(home), "OPENFORGE_PROXY_ADMIN_TOKEN": ADMIN,
            "OPENFORGE_PROXY_TOKEN_SECRET": SECRET}


def _start(args: list[str], home: Path, port: int, log: Path) -> subprocess.Popen:
    home.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as err:
        proc = subprocess.Popen([OPENFORGE, "proxy", "--port", str(port), *args], env=_env(home),
                                stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 60
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


def _register(base: str, rollout_id: str) -> str:
    r = httpx.post(base + "/admin/rollouts", json={"rollout_id": rollout_id}, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["token"]


def _call(base: str, token: str, text: str, client: httpx.Client | None = None) -> str | None:
    """The call id of a 200, else None."""
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    try:
        r = (client or httpx).post(base + "/v1/chat/completions", json=body, timeout=30,
                                   headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError:
        return None
    return r.headers["x-openforge-call-id"] if r.status_code == 200 else None


def _stored(pg_url: str, ids: list[str]) -> dict[str, int]:
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT id, count(*) FROM calls GROUP BY id")).all()
    finally:
        engine.dispose()
    return {cid: n for cid, n in rows if cid in set(ids)}


def test_kill9_replica_with_undrained_journal_is_drained_by_its_successor(up, tmp_path, pg_database):
    url = sa.engine.make_url(pg_database)
    relay = TcpRelay(url.host or "127.0.0.1", url.port or 5432)  # replica a's way to the database, to cut
    relayed = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    home, pa, pb = tmp_path / "home", free_port(), free_port()
    a = _start(["--upstream", up.url, "--store", relayed, "--replica-id", "a"], home, pa, tmp_path / "a.log")
    b = _start(["--upstream", up.url, "--store", pg_database, "--replica-id", "b"], home, pb, tmp_path / "b.log")
    base_a, base_b = f"http://127.0.0.1:{pa}", f"http://127.0.0.1:{pb}"
    procs = [a, b]
    try:
        tokens = [_register(base_a, f"k{i}") for i in range(4)]
        assert all(_call(base_b, t, "warm") for t in tokens)  # b serves a's rollouts (from the store)
        relay.cut()  # a keeps answering from its journal; nothing of it reaches the database now
        ids_a = [_call(base_a, t, f"a-{i}-{j}") for j in range(3) for i, t in enumerate(tokens)]
        ids_b = [_call(base_b, t, f"b-{i}") for i, t in enumerate(tokens)]
        assert all(ids_a) and all(ids_b)
        assert _eventually(lambda: len(_stored(pg_database, ids_b)) == len(ids_b))
        assert _stored(pg_database, ids_a) == {}  # a's calls are only in its journal
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        relay.restore()
        procs[0] = _start(["--upstream", up.url, "--store", relayed, "--replica-id", "a"], home, pa,
                          tmp_path / "a.log")  # the successor: same replica id, same journal
        everything = ids_a + ids_b
        assert _eventually(lambda: len(_stored(pg_database, everything)) == len(everything), 60), (
            f"not drained: {len(everything) - len(_stored(pg_database, everything))} calls missing")
        assert set(_stored(pg_database, everything).values()) == {1}
        assert _call(base_a, tokens[0], "after")  # and serves again
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        relay.close()
    calls = _stored(pg_database, everything)
    assert len(calls) == len(everything) and set(calls.values()) == {1}


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_workers_serve_on_one_port_and_a_killed_worker_is_replaced(up, tmp_path, pg_database):
    """On an empty database: the supervisor makes the schema once (workers racing to make it would fail)."""
    home, port = tmp_path / "home", free_port()
    sup = _start(["--upstream", up.url, "--store", pg_database, "--workers", "2"], home, port, tmp_path / "w.log")
    base = f"http://127.0.0.1:{port}"
    received: list[str] = []
    try:
        workers = _children(sup.pid)
        assert len(workers) == 2
        tokens = [_register(base, f"w{i}") for i in range(8)]

        async def burst(tag: str, n: int) -> list[str | None]:
            async def one(i: int) -> str | None:  # a fresh connection each: the kernel picks the worker
                async with httpx.AsyncClient(timeout=30) as client:
                    body = {"model": "m", "messages": [{"role": "user", "content": f"{tag}-{i}"}]}
                    try:
                        r = await client.post(base + "/v1/chat/completions", json=body,
                                              headers={"Authorization": f"Bearer {tokens[i % 8]}"})
                    except httpx.HTTPError:
                        return None
                    return r.headers["x-openforge-call-id"] if r.status_code == 200 else None
            return await asyncio.gather(*(one(i) for i in range(n)))

        first = asyncio.run(burst("one", 48))
        assert all(first)
        received += first
        os.kill(workers[0], signal.SIGKILL)
        second = asyncio.run(burst("two", 48))  # the other worker (and the queue) carry on meanwhile
        received += [c for c in second if c]
        assert _eventually(lambda: len(_children(sup.pid)) == 2 and workers[0] not in _children(sup.pid))
        assert _eventually(lambda: _call(base, tokens[0], "back") is not None)
        third = asyncio.run(burst("three", 48))
        assert all(third)
        received += third
    finally:
        sup.send_signal(signal.SIGTERM)
        sup.wait(90)
    assert sup.returncode == 0
    calls = _stored(pg_database, received)
    assert len(calls) == len(received) and set(calls.values()) == {1}  # every 200 stored, once
    ledgers = [(home / "proxy-rollouts" / f"proxy-{i}.ledger").read_text() for i in (0, 1)]
    assert all(ledger.count('["S"') for ledger in ledgers), "one of the workers served no rollout"
    log = (tmp_path / "w.log").read_text()
    assert "exited on signal SIGKILL; restarting it under the same replica id" in log
    assert log.count("restarting it") == 1 and "Traceback" not in log  # the one we killed, nothing else


# ---- Kubernetes ------------------------------------------------------------------------------------------------
MANIFEST = Path(__file__).resolve().parents[1] / "examples" / "kubernetes" / "proxy-replicas.yaml"


def _settings_env_names() -> set[str]:
    from proxy import ProxySettings

    names = set()
    for cls in (Settings, ProxySettings):
        prefix = cls.model_config["env_prefix"]
        for field, info in cls.model_fields.items():
            names.add(f"{prefix}{field.upper()}")
            names.update(a for a in getattr(info.validation_alias, "choices", ()) if isinstance(a, str) and a.isupper())
    return names


def test_the_replica_manifests_validate_strictly():
    import kubernetes_validate
    import yaml

    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Service", "Service", "StatefulSet"]
    for version in ("1.29.0", kubernetes_validate.latest_version()):
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k",
                          kubernetes_validate.latest_version(), str(MANIFEST)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][c["args"].index("--replica-id") + 1] == "$(POD_NAME)"  # a stable id: its journal's name
    assert {v["metadata"]["name"] for v in sts["spec"]["volumeClaimTemplates"]} == {
        m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/var/lib/openforge"}  # the journal persists
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    env = {e["name"]: e for e in c["env"]}
    known = _settings_env_names()
    assert {n for n in [*env, *config] if n.startswith("OPENFORGE_")} <= known  # every setting is a real one
    for name in ("OPENFORGE_STORE_URL", "OPENFORGE_PROXY_TOKEN_SECRET", "OPENFORGE_PROXY_ADMIN_TOKEN",
                 "OPENFORGE_S3_SECRET_ACCESS_KEY"):
        assert "secretKeyRef" in env[name]["valueFrom"]  # secrets by reference only
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and pod["automountServiceAccountToken"] is False
    services = [d for d in docs if d["kind"] == "Service"]
    assert all(s["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"] for s in services)
    assert sts["spec"]["serviceName"] in {s["metadata"]["name"] for s in services}
