"""The verifier's container: what keeps a rollout's reward out of its harness's reach on Kubernetes.

The pod runs every harness phase as an init container and the verifier as its one main container, so the kubelet
starts the verifier only after the harness container has exited; with ``shareProcessNamespace: false`` each
container has a PID namespace of its own, torn down when it exits, so nothing the harness started is left running
(task services are native sidecars in their own containers). On top of that the verifier container:

- runs as its own uid and gid (``verifier_run_as_user``), never the harness's: non-root, no privilege escalation,
  every capability dropped, its root filesystem read-only. Containers never share a root filesystem, so what a
  harness changed in its own copy of the image (a ``json.py`` in site-packages) is not what the verifier runs;
- mounts the workspace read-only and no other volume a harness or service container mounts writable: not the shared
  ``/tmp``, ``/logs`` or HOME. Its ``/tests`` (a ConfigMap), ``/logs/verifier``, HOME and ``/tmp`` are volumes no
  other container has;
- runs its command under ``env -i`` with exactly ``base.verifier_env`` (nothing of the image's ENV, the kubelet's
  ``KUBERNETES_*`` or the wrapper's own variables; no proxy URL or token).

What it cannot give: harness code the verifier itself runs (a script it tests) runs with the verifier's uid, so the
verifier must end every process of it before writing the reward (docs/rollouts.md, "What a verifier must do").

The reward leaves through this container's termination message (or, when too long, the last line of this
container's log), never through a file or log another container could write.
"""

from __future__ import annotations

import re

from ..base import VERIFIER_LOGS, SandboxError, verifier_env
from .config import KubernetesConfig

HOME = "/home/verifier"
TMPDIR = "/tmp"
VOLUMES = {"verifier-home": HOME, "verifier-tmp": TMPDIR, "verifier-reward": VERIFIER_LOGS}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def environment(workdir: str, task_env: dict[str, str]) -> dict[str, str]:
    """Exactly what the verifier's command sees; names checked, as the wrapper passes them through ``env -i``."""
    env = verifier_env(workdir=workdir, home=HOME, tmpdir=TMPDIR, task_env=task_env)
    bad = sorted(k for k in env if not _NAME.match(k))
    if bad:
        raise SandboxError(f"verifier env names {bad} are not shell variable names ([A-Za-z_][A-Za-z0-9_]*); "
                           f"rename them in the task's [verifier] env", kind="spec_invalid")
    return env


def security(cfg: KubernetesConfig) -> dict:
    uid = cfg.verifier_run_as_user
    return {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True, "runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid}


def mounts(workspace_volume: str, workdir: str, declared: list[dict]) -> tuple[list[dict], list[dict]]:
    """(volumeMounts, new emptyDir volumes): the workspace read-only, the verifier's own HOME, /tmp and reward
    folder, and ``declared`` (its /tests and the read-only shared ConfigMaps) minus any other /logs/verifier."""
    out = [{"name": workspace_volume, "mountPath": workdir, "readOnly": True}]
    out += [m for m in declared if m["mountPath"] != VERIFIER_LOGS]
    out += [{"name": name, "mountPath": path} for name, path in VOLUMES.items()]
    return out, [{"name": name, "emptyDir": {}} for name in VOLUMES]
