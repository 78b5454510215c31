"""Every manifest the backend generates validates offline (kubernetes-validate --strict) and is locked down."""

from __future__ import annotations

import json
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from rollout._backends.base import Phase, SandboxError
from rollout._backends.kubernetes import manifests
from rollout._backends.kubernetes.config import Toleration

from .conftest import TOKEN, config, make_spec

# 1.29: the first release with native sidecars on by default; latest: what the package ships newest.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


def _all(task_dir, **kw):
    cfg = config(image_pull_secrets=["registry"], node_selector={"pool": "rollouts"}, service_account="rollout",
                 tolerations=[Toleration(key="dedicated", value="rl", effect="NoSchedule")], **kw)
    pod, secret, cms, plan = manifests.build(make_spec(task_dir), cfg, "ghcr.io/example/img@sha256:" + "a" * 64)
    return cfg, pod, secret, cms, plan, manifests.network_policy(cfg)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("read_only", [False, True])
def test_every_manifest_validates_strictly(task_dir, version, read_only):
    _, pod, secret, cms, _, policy = _all(task_dir, read_only_root_fs=read_only)
    for m in (pod, secret, *cms, policy):
        kubernetes_validate.validate(m, version, strict=True)


def test_the_cli_validates_them_too(task_dir, tmp_path):
    _, pod, secret, cms, _, policy = _all(task_dir)
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump_all([pod, secret, *cms, policy]))
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k",
                          kubernetes_validate.latest_version(), str(path)], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_validation_is_not_vacuous(task_dir):
    _, pod, *_ = _all(task_dir)
    pod["spec"]["containers"][0]["restartPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)


def test_pod_is_locked_down(task_dir):
    _, pod, _, cms, plan, _ = _all(task_dir, read_only_root_fs=True)
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] >= 1
    for c in spec["initContainers"] + spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["readOnlyRootFilesystem"] is True
        assert c["resources"]["requests"] == c["resources"]["limits"]
    # the token lives only in the Secret: never a literal in the pod or the ConfigMaps
    assert TOKEN not in json.dumps(pod) and TOKEN not in json.dumps(cms)
    harness = next(c for c in spec["initContainers"] if c["name"] == "p-harness")
    env = {e["name"]: e for e in harness["env"]}
    assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": plan.secret, "key": "token"}
    assert "secretKeyRef" in env["AUTH_HEADER"]["valueFrom"]
    assert env["LITERAL"]["value"] == "$$(NOT_A_VAR) costs $$5"      # the kubelet turns $$ back into $
    assert "$(OPENFORGE_PROXY_TOKEN)" in harness["args"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "openforge"
    assert {"openforge.dev/run", "openforge.dev/group", "openforge.dev/rollout", "openforge.dev/task"} \
        <= set(pod["metadata"]["labels"])
    assert 0 < spec["activeDeadlineSeconds"]


def test_phases_map_onto_containers(task_dir):
    _, pod, _, cms, plan, _ = _all(task_dir)
    init = pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["seed", "p-mock-api", "p-harness"]
    assert init[1]["restartPolicy"] == "Always" and init[1]["startupProbe"]["tcpSocket"]["port"] == 9000
    assert "restartPolicy" not in init[2]
    (main,) = pod["spec"]["containers"]
    assert main["name"] == "p-verifier"
    assert plan.containers == {"mock-api": ("p-mock-api", "sidecar"), "harness": ("p-harness", "init"),
                               "verifier": ("p-verifier", "main")}
    # /tests only in the verifier; the workspace in all
    assert any(m["mountPath"] == "/tests" for m in main["volumeMounts"])
    assert not any(m["mountPath"] == "/tests" for c in init for m in c["volumeMounts"])
    assert all(any(m["name"] == "workspace" for m in c["volumeMounts"]) for c in init + [main])
    ws = next(cm for cm in cms if cm["metadata"]["name"].endswith("-ws"))
    assert "binaryData" in ws and any("src/main.py" == i["path"] for v in pod["spec"]["volumes"]
                                      for i in (v.get("configMap") or {}).get("items", []))


def test_network_policy_allows_only_the_proxy_and_dns():
    cfg = config(proxy_url="http://openforge-proxy.openforge.svc:8000", proxy_pod_labels={"app": "proxy"})
    pol = manifests.network_policy(cfg)["spec"]
    assert pol["policyTypes"] == ["Ingress", "Egress"] and pol["ingress"] == []
    proxy, dns = pol["egress"]
    assert proxy["to"][0]["podSelector"]["matchLabels"] == {"app": "proxy"}
    assert proxy["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert len(manifests.network_policy(config(allow_dns=False))["spec"]["egress"]) == 1


def test_a_workspace_too_big_for_a_configmap_is_an_error_that_says_the_fix(task_dir):
    (task_dir / "environment" / "workspace" / "big.bin").write_bytes(b"x" * 5000)
    with pytest.raises(SandboxError, match="image_provides") as err:
        manifests.build(make_spec(task_dir), config(configmap_max_bytes=4096), "img")
    assert err.value.kind == "spec_too_large"
    pod, *_ = manifests.build(make_spec(task_dir), config(configmap_max_bytes=4096, image_provides=[
        "/openforge/seed", "/environment", "/tests"]), "img")
    assert not any("configMap" in v for v in pod["spec"]["volumes"])


def test_names_and_labels_survive_odd_ids(task_dir):
    spec = make_spec(task_dir, rollout_id="Run_7/Rollout:0001" + "x" * 80)
    pod, *_ = manifests.build(spec, config(), "img")
    name = pod["metadata"]["name"]
    assert len(name) <= 63 and name == name.lower()
    assert pod["metadata"]["annotations"]["openforge.dev/rollout-id"] == spec.rollout_id
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    assert manifests.dns_name("of", "a") != manifests.dns_name("of", "A")


def test_digest_pinning():
    cfg = config(image_digests={"python:3.12": "sha256:" + "1" * 64})
    assert manifests.pinned_image("python:3.12", cfg, {}) == "python:3.12@sha256:" + "1" * 64
    assert manifests.pinned_image("x:1", cfg, {"x:1": "sha256:" + "2" * 64}).endswith("2" * 64)
    assert manifests.pinned_image("x@sha256:" + "3" * 64, cfg, {}) == "x@sha256:" + "3" * 64
    assert manifests.pinned_image("y:2", cfg, {}) == "y:2"


def test_a_spec_without_a_foreground_phase_is_rejected(task_dir):
    spec = make_spec(task_dir)
    spec = type(spec)(**{**spec.__dict__, "phases": (Phase("svc", ("x",), background=True),)})
    with pytest.raises(SandboxError, match="verifier"):
        manifests.build(spec, config(), "img")


def _kubelet_expand(s: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion (k8s third_party/forked/golang/expansion), for command, args and env."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "$" and i + 1 < len(s):
            nxt = s[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
            elif nxt == "(" and ")" in s[i + 2:]:
                end = s.index(")", i + 2)
                name = s[i + 2:end]
                out.append(env.get(name, f"$({name})"))
                i = end + 1
            else:
                out.append("$" + nxt)
                i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def test_the_kubelet_expansion_gives_back_what_was_written(task_dir):
    from rollout._backends.kubernetes.results import PHASE_SCRIPT

    _, pod, *_ = _all(task_dir)
    harness = next(c for c in pod["spec"]["initContainers"] if c["name"] == "p-harness")
    env = {"OPENFORGE_PROXY_TOKEN": TOKEN}
    assert _kubelet_expand(harness["command"][2], env) == PHASE_SCRIPT
    args = [_kubelet_expand(a, env) for a in harness["args"]]
    assert args == ["mini-swe-agent", "--task", "fix it", "--api-key", TOKEN]
    literal = next(e for e in harness["env"] if e["name"] == "LITERAL")
    assert _kubelet_expand(literal["value"], env) == "$(NOT_A_VAR) costs $5"


def test_the_verifier_output_folder_is_its_own(task_dir):
    """The harness cannot pre-write the reward: /logs/verifier in the verifier is an emptyDir no other container has."""
    _, pod, *_ = _all(task_dir)
    containers = {c["name"]: c for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]}
    (verifier_mount,) = [m for m in containers["p-verifier"]["volumeMounts"] if m["mountPath"] == "/logs/verifier"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == verifier_mount["name"])
    assert "emptyDir" in volume
    for name, c in containers.items():
        if name != "p-verifier":
            assert verifier_mount["name"] not in {m["name"] for m in c["volumeMounts"]}, name
