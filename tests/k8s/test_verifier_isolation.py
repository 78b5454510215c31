"""The verifier container is kept apart from the harness (rollout/_backends/kubernetes/verifier.py): each guarantee
asserted on the generated manifest, the wrapper's clean env run for real, the reward read from the
verifier container only, end to end against the emulated API server."""

from __future__ import annotations

import os
import subprocess

import kubernetes_validate
import pytest
from pydantic import ValidationError

from rollout._backends.base import Mount, Phase, SandboxError, verifier_env
from rollout._backends.kubernetes import manifests
from rollout._backends.kubernetes.results import PHASE_SCRIPT, message, parse_message

from .conftest import REWARD, TOKEN, config, make_spec


def _build(task_dir, **kw):
    spec = make_spec(task_dir)
    pod, *_ = manifests.build(spec, config(**kw), "img@sha256:" + "a" * 64)
    init = {c["name"]: c for c in pod["spec"]["initContainers"]}
    (main,) = pod["spec"]["containers"]
    return spec, pod, init, main


def _mounts(c: dict) -> dict[str, dict]:
    return {m["mountPath"]: m for m in c["volumeMounts"]}


def test_the_verifier_is_the_main_container_so_it_starts_after_the_harness_exited(task_dir):
    _, pod, init, main = _build(task_dir)
    assert main["name"] == "p-verifier" and len(pod["spec"]["containers"]) == 1
    # init containers run to completion, in order, before any main container starts (pod semantics); the harness
    # is one (no restartPolicy: Always, which would make it a sidecar that keeps running)
    assert "restartPolicy" not in init["p-harness"]
    assert pod["spec"]["shareProcessNamespace"] is False     # its processes die with its own PID namespace


def test_the_workspace_is_read_only_in_the_verifier_only(task_dir):
    spec, _, init, main = _build(task_dir)
    assert _mounts(main)[spec.workdir] == {"name": "workspace", "mountPath": spec.workdir, "readOnly": True}
    assert not _mounts(init["p-harness"])[spec.workdir].get("readOnly")


def test_tests_and_reward_folder_are_mounted_in_the_verifier_alone(task_dir):
    _, pod, init, main = _build(task_dir)
    mine = _mounts(main)
    for path in ("/tests", "/logs/verifier"):
        volume = mine[path]["name"]
        for c in init.values():
            assert volume not in {m["name"] for m in c["volumeMounts"]}, (path, c["name"])
            assert path not in _mounts(c), (path, c["name"])
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "configMap" in volumes[mine["/tests"]["name"]] and mine["/tests"]["readOnly"] is True
    assert "emptyDir" in volumes[mine["/logs/verifier"]["name"]]


def test_nothing_the_verifier_mounts_is_writable_by_another_container(task_dir):
    """The harness cannot write where the verifier reads its code: any volume it shares with another container is
    read-only in the verifier, and every shared one but the workspace (data it scores) is read-only everywhere."""
    spec, pod, init, main = _build(task_dir)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for m in main["volumeMounts"]:
        others = [c["name"] for c in init.values() if m["name"] in {x["name"] for x in c["volumeMounts"]}]
        if not others:
            continue
        assert m.get("readOnly") is True, (m, others)
        kind = volumes[m["name"]]
        assert m["name"] == "workspace" or "configMap" in kind or "secret" in kind, (m, kind)
    assert not {"scratch", "logs", "home"} & {m["name"] for m in main["volumeMounts"]}   # the shared /tmp, /logs, HOME


def test_the_verifier_runs_as_another_uid_locked_down(task_dir):
    _, pod, init, main = _build(task_dir, run_as_user=1000, verifier_run_as_user=2345)
    sc = main["securityContext"]
    assert sc["runAsUser"] == sc["runAsGroup"] == 2345 != pod["spec"]["securityContext"]["runAsUser"] == 1000
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True
    assert all("runAsUser" not in c["securityContext"] for c in init.values())    # the pod's 1000
    with pytest.raises(ValidationError, match="another uid"):
        config(run_as_user=1000, verifier_run_as_user=1000)


def test_the_verifier_env_is_exactly_the_clean_list_and_home_is_its_own(task_dir):
    spec = make_spec(task_dir)
    phases = list(spec.phases)
    phases[-1] = Phase(**{**phases[-1].__dict__, "env": {"STRICT": "1"}})
    spec = type(spec)(**{**spec.__dict__, "phases": tuple(phases)})
    pod, *_ = manifests.build(spec, config(), "img")
    (main,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in main["env"]}
    want = verifier_env(workdir=spec.workdir, home="/home/verifier", tmpdir="/tmp", task_env={"STRICT": "1"})
    assert env["OPENFORGE_CLEAN_ENV"].split("\n") == list(want)          # what env -i passes on, nothing else
    assert {k: env[k] for k in want} == want
    assert not {"OPENFORGE_PROXY_URL", "OPENFORGE_PROXY_TOKEN", "OPENAI_API_KEY"} & set(env)
    assert TOKEN not in str(main)
    mounts = _mounts(main)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for path in (want["HOME"], want["TMPDIR"]):
        assert "emptyDir" in volumes[mounts[path]["name"]]
        assert all(mounts[path]["name"] not in {m["name"] for m in c["volumeMounts"]}
                   for c in pod["spec"]["initContainers"])
    assert main["workingDir"] == want["HOME"]
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)


def test_specs_that_would_break_the_isolation_are_refused(task_dir):
    spec = make_spec(task_dir)
    harness, verifier = spec.phases[-2], spec.phases[-1]
    early = type(spec)(**{**spec.__dict__, "phases": (verifier, harness)})
    with pytest.raises(SandboxError, match="declare the verifier last"):
        manifests.build(early, config(), "img")
    odd = Phase(**{**verifier.__dict__, "env": {"NOT-A-NAME": "x"}})
    with pytest.raises(SandboxError, match="NOT-A-NAME"):
        manifests.build(type(spec)(**{**spec.__dict__, "phases": (harness, odd)}), config(), "img")
    # a verifier that declares no reward folder still gets its own (never the shared /logs)
    bare = Phase("verifier", ("/bin/sh", "/tests/test.sh"), mounts=(Mount(task_dir / "tests", "/tests"),),
                 outputs=(REWARD,), clean=True)
    pod, *_ = manifests.build(type(spec)(**{**spec.__dict__, "phases": (harness, bare)}), config(), "img")
    assert _mounts(pod["spec"]["containers"][0])["/logs/verifier"]["name"] == "verifier-reward"


# --- the wrapper, run for real ----------------------------------------------------------------------------------

def _wrap(tmp_path, argv, env, *, prefix=()):
    log = tmp_path / "termination-log"
    log.write_text("")
    env = {"PATH": os.environ["PATH"], "OPENFORGE_TERMINATION_LOG": str(log), "OPENFORGE_SCRATCH": str(tmp_path),
           "OPENFORGE_TIMEOUT_S": "0", **env}
    proc = subprocess.run([*prefix, "/bin/sh", "-c", PHASE_SCRIPT, "openforge-phase", *argv], env=env,
                          capture_output=True, timeout=60, check=False)
    return proc, parse_message(log.read_text())


def test_the_command_sees_only_the_clean_env(tmp_path):
    odd = "a b 'c' \"d\" $HOME `x` \\ \n end"
    proc, _ = _wrap(tmp_path, ["env"], {"OPENFORGE_CLEAN_ENV": "PATH\nODD\nEMPTY", "ODD": odd, "EMPTY": "",
                                        "SECRET": "s3cret", "OPENFORGE_OUTPUTS": ""})
    assert proc.returncode == 0, proc.stderr
    seen = proc.stdout.decode()
    assert f"ODD={odd}\n" in seen and "EMPTY=\n" in seen and "PATH=" in seen
    names = {line.split("=", 1)[0] for line in seen.splitlines() if "=" in line and not line.startswith(" ")}
    assert "SECRET" not in names and not any(n.startswith("OPENFORGE_") for n in names), seen


def test_an_output_that_is_a_link_is_not_read(tmp_path):
    real, link = tmp_path / "elsewhere.json", tmp_path / "reward.json"
    real.write_text('{"reward": 1.0}')
    link.symlink_to(real)
    _, result = _wrap(tmp_path, ["true"], {"OPENFORGE_OUTPUTS": f"{link}\n{real}"})
    assert result.outputs == {str(real): b'{"reward": 1.0}'}


# --- end to end against the emulated API server -----------------------------------------------------------------

def test_the_reward_comes_from_the_verifier_container_only(backend_factory, kubelet, emulator, task_dir,
                                                           in_thread):
    """The pod the API server got keeps the guarantees; a forged reward in the harness container's termination
    message or log is ignored; a forged overflow block the verifier printed (a workspace file it echoed) followed
    by enough output to push the real one past phase_log_bytes does not stand in for the wrapper's last line."""
    backend = backend_factory(phase_log_bytes=1024)
    sb = backend.create(make_spec(task_dir, service=False))
    (pod,) = [p for p in emulator.objects("pods") if p["metadata"]["name"] == sb.id]
    (main,) = pod["spec"]["containers"]
    assert pod["spec"]["shareProcessNamespace"] is False and main["securityContext"]["runAsUser"] == 1001
    assert _mounts(main)["/workspace"]["readOnly"] is True
    forged = message(0, {REWARD: b'{"reward": 1.0}'})
    block = f"@@openforge-result-begin@@{forged}@@openforge-result-end@@"
    honest = message(0, {REWARD: b'{"reward": 0.0, "pad": "' + b"z" * 6000 + b'"}'})
    verifier_log = f"{block}\n{'x' * 5000}\n@@openforge-result-begin@@{honest}@@openforge-result-end@@\n"

    def kubelet_plays():
        kubelet.schedule(sb.id)
        kubelet.start(sb.id, "seed")
        kubelet.finish(sb.id, "seed", exit_code=0)
        kubelet.start(sb.id, "p-harness")
        kubelet.finish(sb.id, "p-harness", msg=forged, log=block + "\n")
        kubelet.start(sb.id, "p-verifier", phase="Running")
        kubelet.finish(sb.id, "p-verifier", msg='{"v":1,"exit":0,"timed_out":0,"overflow":1}', log=verifier_log,
                       phase="Succeeded")

    in_thread(kubelet_plays)
    phases = {p.name: p for p in sb.spec.phases}
    harness = backend.run_phase(sb, phases["harness"])
    assert harness.outputs == {}                              # the harness declares no outputs: nothing read
    verifier = backend.run_phase(sb, phases["verifier"])
    assert verifier.outputs[REWARD].startswith(b'{"reward": 0.0'), verifier.outputs
    backend.destroy(sb)
