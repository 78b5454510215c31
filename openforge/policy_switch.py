"""Switch the policy a running engine serves, fenced at the proxy: pause (drain) -> load -> activate -> resume.

The fence is what keeps every recorded call under the policy version that answered it. The proxy records a call
under the version current when it admitted the call; the pause holds new calls and the drain waits until every
admitted one (streams included) has been answered and recorded; only then do the engine's weights change, and the
new version is active before any held call is let through. A switch without the fence (activate while calls are in
flight, or load while they stream) records answers of one version under the other: ``tests/test_policy_switch.py``
shows it happen.

``switch_policy`` is the composition: it needs the proxy's admin API (``rollout.AdminClient``) and a ``load`` that
changes the engine's weights (``lambda: server.load_weights(checkpoint)`` for ``proxy.engines.VllmServer``), so it
lives in the roof. What each failure leaves behind is in the error it raises (``PolicySwitchError``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["PolicySwitch", "PolicySwitchError", "switch_policy"]


@dataclass(frozen=True)
class PolicySwitch:
    """One switch: the versions, the seconds each phase took, and what ``load`` returned."""

    version: str
    previous: str | None
    pause_s: float  # pause + drain of the calls in flight
    load_s: float
    activate_s: float
    resume_s: float
    load_result: Any = None

    @property
    def switch_s(self) -> float:
        """How long calls were held: from the pause to the resume."""
        return self.pause_s + self.load_s + self.activate_s + self.resume_s


class PolicySwitchError(RuntimeError):
    """A switch that did not complete. ``phase``: where it stopped (pause, drain, load, activate, resume); ``paused``:
    whether the proxy is left paused; the message says which weights the engine holds and what to do."""

    def __init__(self, phase: str, message: str, *, paused: bool):
        super().__init__(message)
        self.phase, self.paused = phase, paused


def switch_policy(admin, load: Callable[[], Any], *, version: str, model_name: str, drain_timeout_s: float = 300.0,
                  **policy_fields: Any) -> PolicySwitch:
    """Serve ``version`` from now on: pause the proxy and drain its calls, ``load()`` the new weights into the engine,
    register (a no-op if the version exists: a learner registers its own with the lineage) and activate ``version``,
    resume. ``policy_fields``: what ``AdminClient.register_policy_version`` takes (checkpoint_id, global_step,
    engine, metadata, ...).

    Failures: before the weights change (pause refused, drain timed out, ``load`` raised) the proxy is resumed and
    the old version stays active. If ``load`` succeeded but the activation failed, the proxy stays paused: the
    engine serves the new weights while the proxy would record the old version, so letting calls through would
    attribute them wrongly; the error says how to finish or undo the switch."""
    t0 = time.perf_counter()
    previous = _pause(admin, version, drain_timeout_s)
    t1 = time.perf_counter()
    try:
        result = load()
    except Exception as exc:
        raise _resumed(admin, "load", f"the engine's load of {version!r} failed ({type(exc).__name__}: {exc}); "
                       f"{previous!r} stays active. If the load stopped half-way, the engine may hold a mix of "
                       f"weights: load {previous!r}'s checkpoint again before trusting its answers") from exc
    t2 = time.perf_counter()
    try:
        admin.register_policy_version(version, model_name, activate=True, **policy_fields)
    except Exception as exc:
        raise PolicySwitchError(
            "activate", f"the engine now serves {version!r}'s weights, but the proxy could not record and activate "
            f"{version!r} ({type(exc).__name__}: {exc}). The proxy stays paused, with {previous!r} active, so that no "
            f"call is recorded under {previous!r} with {version!r}'s weights: activate {version!r} "
            f"(AdminClient.register_policy_version / activate_policy_version) or load {previous!r}'s weights back, "
            "then resume (AdminClient.resume).", paused=True) from exc
    t3 = time.perf_counter()
    try:
        admin.resume()
    except Exception as exc:
        raise PolicySwitchError(
            "resume", f"{version!r} is loaded and active, but the resume failed ({type(exc).__name__}: {exc}): the "
            "proxy holds every call until it is resumed (AdminClient.resume, or POST /admin/resume).",
            paused=True) from exc
    t4 = time.perf_counter()
    return PolicySwitch(version=version, previous=previous, pause_s=t1 - t0, load_s=t2 - t1, activate_s=t3 - t2,
                        resume_s=t4 - t3, load_result=result)


def _pause(admin, version: str, drain_timeout_s: float) -> str | None:
    """Pause and drain; the version active before the switch. A failure raises, the proxy resumed (unless the pause
    was someone else's)."""
    try:
        ans = admin.pause(drain=True, timeout_s=drain_timeout_s)
    except Exception as exc:
        raise _resumed(admin, "pause", f"the proxy's pause failed ({type(exc).__name__}: {exc}); nothing was "
                       f"loaded for {version!r}") from exc
    previous = ans.get("policy_version")
    if ans.get("was_paused"):
        raise PolicySwitchError(
            "pause", f"the proxy was already paused (another switch under way, or an operator's pause), so this "
            f"switch to {version!r} did not start: nothing was loaded and {previous!r} stays active. Wait for the "
            "other switch, or resume the proxy (AdminClient.resume) if nothing else holds it.", paused=True)
    if not ans.get("drained"):
        raise _resumed(admin, "drain", f"{ans.get('in_flight')} call(s) were still in flight after "
                       f"{drain_timeout_s:g} s; nothing was loaded and {previous!r} stays active. Pass a longer "
                       "drain_timeout_s, or switch when the rollouts' calls are shorter")
    return previous


def _resumed(admin, phase: str, what: str) -> PolicySwitchError:
    """Resume the proxy after a failure before the weights changed; the error that says what happened."""
    try:
        admin.resume()
    except Exception as exc:
        return PolicySwitchError(phase, f"{what}. The resume failed too ({type(exc).__name__}: {exc}): the proxy "
                                        "may still hold calls; resume it (POST /admin/resume).", paused=True)
    return PolicySwitchError(phase, f"{what}. The proxy is resumed.", paused=False)
