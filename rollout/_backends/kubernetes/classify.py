"""Pod status -> the outcome taxonomy. Pure functions over the pod dict a watch delivers.

Infra conditions raise ``SandboxError`` with a kind: ``image_pull`` (ErrImagePull / ImagePullBackOff /
InvalidImageName past ``image_pull_grace_s``), ``unschedulable`` (PodScheduled=False/Unschedulable past
``unschedulable_grace_s``), ``evicted`` (node pressure; includes node-level OOM), ``deadline_exceeded`` (the
``activeDeadlineSeconds`` backstop fired), ``container_config`` (CreateContainerConfigError and kin),
``sandbox_setup`` (the seed container failed), ``oom_killed`` (a container that is not the phase's own, e.g. the
seed, ran out of memory), ``sandbox_lost`` (the pod failed or vanished otherwise). A phase's own container that is
OOM-killed is not raised here: ``run_phase`` returns exit code 137 like any non-zero exit (a harness error for the
harness phase; the orchestrator treats a verifier that dies so as a crashed verifier, an infra error).
"""

from __future__ import annotations

from datetime import datetime

from ..base import SandboxError

IMAGE_PULL = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                        "RegistryUnavailable"})
CONTAINER_CONFIG = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def statuses(pod: dict) -> dict[str, dict]:
    """Container name -> container status, init and regular containers together."""
    st = pod.get("status") or {}
    return {cs["name"]: cs for key in ("initContainerStatuses", "containerStatuses")
            for cs in st.get(key) or [] if "name" in cs}


def container(pod: dict, name: str) -> dict:
    return statuses(pod).get(name) or {}


def _since(first_seen: dict[str, float], key: str, now: float) -> float:
    return now - first_seen.setdefault(key, now)


def check_pod(pod: dict, *, own: str, seed: str, first_seen: dict[str, float], now: float,
              image_pull_grace_s: float, unschedulable_grace_s: float) -> None:
    """Raise ``SandboxError`` when the pod cannot (or can no longer) run container ``own``."""
    name = (pod.get("metadata") or {}).get("name", "?")
    st = pod.get("status") or {}
    reason, message = st.get("reason"), st.get("message") or ""
    if reason == "Evicted":
        raise SandboxError(f"pod {name} was evicted by its node ({message}); node pressure is an infra error, the "
                           f"rollout is retried", kind="evicted")
    if reason == "DeadlineExceeded":
        raise SandboxError(f"pod {name} passed its activeDeadlineSeconds backstop ({message}); raise "
                           f"deadline_backstop_s if image pulls are slow", kind="deadline_exceeded")
    for cond in st.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == "Unschedulable":
            waited = _since(first_seen, "unschedulable", now)
            if waited >= unschedulable_grace_s:
                raise SandboxError(f"pod {name} unschedulable for {waited:.0f}s: {cond.get('message', '')}; "
                                   f"free capacity, or lower resources / max_pods_in_flight", kind="unschedulable")
    for cname, cs in statuses(pod).items():
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        why = waiting.get("reason")
        if why in IMAGE_PULL:
            waited = _since(first_seen, f"pull:{cname}", now)
            if waited >= image_pull_grace_s or why == "InvalidImageName":
                raise SandboxError(f"pod {name} container {cname}: {why} for image {cs.get('image', '?')} "
                                   f"({waiting.get('message', '')}); check the image reference and "
                                   f"image_pull_secrets", kind="image_pull")
        elif why in CONTAINER_CONFIG:
            raise SandboxError(f"pod {name} container {cname}: {why} ({waiting.get('message', '')})",
                               kind="container_config")
        term = state.get("terminated") or {}
        if cname != own and term and term.get("exitCode", 0) != 0:
            if term.get("reason") == "OOMKilled":
                raise SandboxError(f"pod {name} container {cname} was OOM-killed (exit 137) before phase "
                                   f"container {own} finished; raise the task's memory_mb", kind="oom_killed")
            if cname == seed:
                raise SandboxError(f"pod {name}: the workspace seed container exited {term.get('exitCode')} "
                                   f"({term.get('reason')}: {term.get('message', '')}); the image needs /bin/sh "
                                   f"and cp", kind="sandbox_setup")
    own_state = (container(pod, own).get("state") or {})
    if st.get("phase") == "Failed" and "terminated" not in own_state:
        raise SandboxError(f"pod {name} failed ({reason}: {message}) before container {own} finished",
                           kind="sandbox_lost")
