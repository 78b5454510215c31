"""The verifier: runs a task's ``tests/test.sh`` in the rollout's sandbox and turns what it wrote into a reward.

Contract (Harbor's): the script writes ``/logs/verifier/reward.json`` (``{"reward": x, ...evidence}``) or
``/logs/verifier/reward.txt`` (a bare number). A verifier that exits non-zero without a reward, writes something
that is not a finite number, or runs past its deadline has *crashed*: an infrastructure error, never a zero reward
(DESIGN.md invariant 6).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ._backends.base import VERIFIER_LOGS, Mount, Phase, PhaseResult
from ._task import Task

REWARD_JSON = f"{VERIFIER_LOGS}/reward.json"
REWARD_TXT = f"{VERIFIER_LOGS}/reward.txt"


class VerifierCrashed(RuntimeError):
    """The verifier could not score; ``evidence`` keeps what it printed."""

    def __init__(self, message: str, evidence: dict):
        super().__init__(message)
        self.evidence = evidence


@dataclass
class Verdict:
    reward: float
    evidence: dict = field(default_factory=dict)
    version: str = ""


def verifier_phase(task: Task) -> Phase:
    return Phase("verifier", ("bash", "/tests/test.sh"), env=dict(task.config.verifier.env),
                 timeout_s=task.verifier_timeout_s,
                 mounts=(Mount(task.tests_dir, "/tests"), Mount(None, VERIFIER_LOGS, writable=True)),
                 outputs=(REWARD_JSON, REWARD_TXT))


def read_verdict(task: Task, result: PhaseResult) -> Verdict:
    """The reward from a finished verifier phase, or ``VerifierCrashed`` saying why there is none."""
    evidence = {"exit_code": result.exit_code, "timed_out": result.timed_out,
                "duration_s": round(result.duration_s, 3),
                "stdout": result.stdout[-8000:].decode(errors="replace"),
                "stderr": result.stderr[-8000:].decode(errors="replace")}
    version = task.verifier_hash[:16]
    if result.timed_out:
        raise VerifierCrashed(f"verifier of task {task.id} ran past its {task.verifier_timeout_s:g} s deadline "
                              f"([verifier] timeout_sec)", evidence)
    reward, source = None, None
    if REWARD_JSON in result.outputs:
        source = "reward.json"
        try:
            doc = json.loads(result.outputs[REWARD_JSON])
            reward = doc.get("reward") if isinstance(doc, dict) else doc
            evidence["verifier"] = doc
        except ValueError as exc:
            raise VerifierCrashed(f"verifier of task {task.id} wrote reward.json that is not JSON ({exc})",
                                  evidence) from None
    elif REWARD_TXT in result.outputs:
        source = "reward.txt"
        text = result.outputs[REWARD_TXT].decode(errors="replace").strip()
        try:
            reward = float(text)
        except ValueError:
            raise VerifierCrashed(f"verifier of task {task.id} wrote reward.txt {text[:80]!r}: not a number",
                                  evidence) from None
    if reward is None:
        raise VerifierCrashed(f"verifier of task {task.id} exited {result.exit_code} without writing "
                              f"{REWARD_JSON} or {REWARD_TXT}", evidence)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise VerifierCrashed(f"verifier of task {task.id}: reward {reward!r} in {source} is not a finite number",
                              evidence)
    evidence["source"] = source
    return Verdict(float(reward), evidence, version)
