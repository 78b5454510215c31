"""The local bubblewrap sandbox, for real: isolation from the host, the network and other rollouts; only the proxy
answers; per-phase mounts; deadlines; cleanup and reaping."""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollout._backends.base import Mount, Phase, SandboxError, SandboxSpec
from rollout._backends.local import LocalBackend

PROBE = r"""
import json, os, socket, urllib.request
out = {}
def attempt(name, fn):
    try:
        out[name] = ["ok", fn()]
    except Exception as exc:
        out[name] = ["error", type(exc).__name__ + ": " + str(exc)[:200]]
def connect(host, port):
    s = socket.create_connection((host, port), timeout=2); s.close(); return "connected"
attempt("internet", lambda: connect("1.1.1.1", 80))
attempt("dns", lambda: socket.getaddrinfo("pypi.org", 443))
attempt("host_postgres", lambda: connect("127.0.0.1", 5432))
attempt("shadow", lambda: open("/etc/shadow").read()[:10])
attempt("root_home", lambda: os.listdir("/root"))
attempt("other_workspace", lambda: os.listdir(os.environ["OTHER"]))
attempt("proc_host", lambda: len([p for p in os.listdir("/proc") if p.isdigit()]))
attempt("proxy", lambda: urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=5).status)
attempt("write_usr", lambda: open("/usr/evil", "w").write("x"))
attempt("uid", lambda: os.getuid())
print(json.dumps(out))
"""


def _spec(rid: str, phases=(), seed: Path | None = None, **kw) -> SandboxSpec:
    return SandboxSpec(rollout_id=rid, run_id="run-t", group_id="g", task_id="t", workspace_seed=seed,
                       environment_dir=None, phases=tuple(phases), **kw)


@pytest.fixture
def backend(forge):
    return forge.backend


def test_isolation_from_network_host_and_other_rollouts(backend, forge):
    a = backend.create(_spec("iso-a"))
    b = backend.create(_spec("iso-b"))
    try:
        backend.put_file(b, "/workspace/secret.txt", b"rollout b's data")
        other = str(backend.root / "iso-b" / "workspace")
        r = backend.exec(a, ["/usr/bin/python3", "-c", PROBE], env={"OTHER": other})
        probe = json.loads(r.stdout)
    finally:
        backend.destroy(a)
        backend.destroy(b)
    assert probe["internet"][0] == "error" and "unreachable" in probe["internet"][1].lower(), probe
    assert probe["dns"][0] == "error", probe
    assert probe["host_postgres"][0] == "error", probe          # the host's loopback is not the sandbox's
    assert probe["shadow"][0] == "error" and probe["root_home"][0] == "error", probe
    assert probe["other_workspace"][0] == "error", probe
    assert probe["proc_host"][0] == "ok" and probe["proc_host"][1] < 10, probe  # own pid namespace only
    assert probe["proxy"] == ["ok", 200], probe                 # only the proxy answers, through the bridge
    assert probe["write_usr"][0] == "error" and probe["uid"] == ["ok", 1000], probe


@pytest.mark.skipif(os.geteuid() != 0, reason="privileges are dropped only when the orchestrator runs as root")
def test_sandbox_user_cannot_read_root_owned_files_even_if_mounted(backend, shared_tmp):
    secret = shared_tmp / "host-secret"
    secret.write_text("token")
    os.chmod(secret, 0o600)
    sb = backend.create(_spec("mounted", mounts=(Mount(secret, "/opt/secret"),)))
    try:
        r = backend.exec(sb, ["cat", "/opt/secret"])
    finally:
        backend.destroy(sb)
    assert r.exit_code != 0 and b"Permission denied" in r.stderr, r


def test_phase_mounts_visible_only_in_their_phase_and_strays_killed(backend, shared_tmp):
    tests = shared_tmp / "tests"
    tests.mkdir()
    (tests / "check.sh").write_text("cat /workspace/out.txt > $OPENFORGE_REWARD_DIR/seen; echo 1 > "
                                    "$OPENFORGE_REWARD_DIR/reward.txt")
    os.chmod(tests, 0o755)
    os.chmod(tests / "check.sh", 0o644)
    verifier = Phase("verifier", ("bash", "/tests/check.sh"), mounts=(Mount(tests, "/tests"),
                     Mount(None, "/logs/verifier", writable=True)), outputs=("/logs/verifier/seen",
                                                                            "/logs/verifier/reward.txt"))
    # The harness looks for the tests, tries to write a reward, and leaves a daemon that would overwrite the result.
    harness = Phase("harness", ("bash", "-c", "ls /tests; echo 1 > /logs/verifier/reward.txt; echo honest > "
                                "out.txt; (setsid bash -c 'sleep 0.3; echo forged > /workspace/out.txt' &); true"),
                    timeout_s=10)
    sb = backend.create(_spec("phases", (harness, verifier)))
    try:
        h = backend.run_phase(sb, harness)
        time.sleep(0.6)
        v = backend.run_phase(sb, verifier)
    finally:
        backend.destroy(sb)
    assert h.stdout == b"" and b"Permission denied" in h.stderr, h   # /tests empty, /logs/verifier read-only
    assert v.exit_code == 0 and v.outputs["/logs/verifier/seen"] == b"honest\n", v


def test_deadline_kills_the_phase(backend):
    ph = Phase("harness", ("bash", "-c", "echo started; sleep 30"), timeout_s=0.5)
    sb = backend.create(_spec("deadline", (ph,)))
    try:
        t0 = time.monotonic()
        r = backend.run_phase(sb, ph)
        assert r.timed_out and r.exit_code is None and time.monotonic() - t0 < 5, r
        assert b"started" in r.stdout
        after = backend.exec(sb, ["bash", "-c", "ps -eo comm | grep -c sleep || true"])
        assert after.stdout.strip() == b"0", after
    finally:
        backend.destroy(sb)


def test_destroy_removes_everything_and_reap_finds_orphans(backend, shared_tmp):
    sb = backend.create(_spec("gone"))
    pid = sb.backend_state["proc"].pid
    backend.destroy(sb)
    assert not (backend.root / "gone").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # An orchestrator that dies (SIGKILL) leaves its sandbox folder; the next one reaps it.
    code = (f"import time; from rollout._backends.local import LocalBackend; from rollout._backends.base import SandboxSpec;"
            f"b = LocalBackend({str(backend.root)!r});"
            f"b.create(SandboxSpec(rollout_id='orphan', run_id='r', group_id='g', task_id='t', workspace_seed=None,"
            f" environment_dir=None, phases=())); print('up', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=Path(__file__).parents[1])
    assert p.stdout.readline().strip() == b"up"
    meta = json.loads((backend.root / "orphan" / "meta.json").read_text())
    p.send_signal(signal.SIGKILL)
    p.wait()
    time.sleep(0.3)
    assert "orphan" in backend.reap()
    assert not (backend.root / "orphan").exists()
    assert not Path(f"/proc/{meta['pid']}").exists() or b"bwrap" not in Path(f"/proc/{meta['pid']}/cmdline").read_bytes()


def test_missing_bubblewrap_says_how_to_install(shared_tmp):
    with pytest.raises(SandboxError, match="apt-get install -y bubblewrap"):
        LocalBackend(shared_tmp / "x", bwrap="bwrap-not-here")


def test_duplicate_rollout_id_is_refused(backend):
    sb = backend.create(_spec("dup"))
    try:
        with pytest.raises(SandboxError, match="already exists"):
            backend.create(_spec("dup"))
    finally:
        backend.destroy(sb)


NOT_ROOT = r"""
import json, sys, time, types
from pathlib import Path
for name in ("rollout", "rollout._backends"):    # the backend alone (stdlib): the system python3 can run it
    sys.modules[name] = types.ModuleType(name)
    sys.modules[name].__path__ = [name.replace(".", "/")]
from rollout._backends.base import Mount, Phase, SandboxSpec
from rollout._backends.local import LocalBackend
root, tests = Path(sys.argv[1]), Path(sys.argv[2])
b = LocalBackend(root)
assert b.run_as is None
verifier = Phase("verifier", ("bash", "/tests/check.sh"), clean=True, mounts=(Mount(tests, "/tests"),
                 Mount(None, "/logs/verifier", writable=True)), outputs=("/logs/verifier/reward.txt",
                 "/logs/verifier/seen"))
harness = Phase("harness", ("bash", "-c", "echo 1 > /logs/verifier/reward.txt; echo honest > /workspace/out.txt; "
                "chmod 000 /workspace; (setsid bash -c 'sleep 1; echo 1 > /logs/verifier/reward.txt' &); true"))
sb = b.create(SandboxSpec(rollout_id="nr", run_id="r", group_id="g", task_id="t", workspace_seed=None,
                          environment_dir=None, phases=(harness, verifier)))
try:
    h = b.run_phase(sb, harness)
    v = b.run_phase(sb, verifier)
    time.sleep(1.5)
finally:
    b.destroy(sb)
print(json.dumps({"harness_err": h.stderr.decode(), "outputs": {k: x.decode() for k, x in v.outputs.items()},
                  "verifier_err": v.stderr.decode(), "left": (root / "nr").exists()}))
"""


def test_not_as_root_the_reward_folder_is_the_verifiers_alone(shared_tmp):
    """``LocalBackend(run_as=None)``, the path taken when the orchestrator is not root (as root, the test runs it as
    ``nobody`` under the system python3, which needs nothing but the stdlib): the sandbox user owns every host folder,
    so the harness may write the reward folder, but nothing it wrote (or a process it left) reaches the
    verifier's result, and a workspace it made unreadable is readable again for the verifier."""
    tests = shared_tmp / "nr-tests"
    tests.mkdir()
    (tests / "check.sh").write_text('ls "$OPENFORGE_REWARD_DIR" > "$OPENFORGE_REWARD_DIR/seen"; '
                                    'cat /workspace/out.txt >> "$OPENFORGE_REWARD_DIR/seen"; '
                                    'touch /workspace/new 2>/dev/null && echo writable >> "$OPENFORGE_REWARD_DIR/seen";'
                                    ' echo 0 > "$OPENFORGE_REWARD_DIR/reward.txt"')
    for p in (tests, tests / "check.sh"):
        os.chmod(p, 0o755)
    root = shared_tmp / "nr-sandboxes"
    root.mkdir()
    creds = {}
    if os.geteuid() == 0:
        os.chown(root, 65534, 65534)
        creds = {"user": 65534, "group": 65534, "extra_groups": []}
    code = shared_tmp / "nr-code"  # the checkout may sit where nobody cannot read it (a private clone): a copy
    shutil.copytree(Path(__file__).parents[1] / "rollout", code / "rollout",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for d in [code, *code.rglob("*")]:
        os.chmod(d, 0o755 if d.is_dir() else 0o644)
    p = subprocess.run(["/usr/bin/python3", "-c", NOT_ROOT, str(root), str(tests)], capture_output=True, text=True,
                       cwd=code, timeout=120, env={"PATH": os.environ["PATH"]}, **creds)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["outputs"] == {"/logs/verifier/reward.txt": "0\n", "/logs/verifier/seen": "seen\nhonest\n"}, out
    assert not out["left"], out
