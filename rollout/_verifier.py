"""The verifier: runs a task's ``tests/test.sh`` in the rollout's sandbox and turns what it wrote into a reward.

Contract (Harbor's): the script writes ``/logs/verifier/reward.json`` (``{"reward": x, ...evidence}``) or
``/logs/verifier/reward.txt`` (a bare number). A verifier that exits non-zero without a reward, writes something
that is not a finite number, or runs past its deadline has *crashed*: an infrastructure error, never a zero reward
(DESIGN.md invariant 6).

One exception, and why: a reward file the backend *refused* (``PhaseResult.refused``: a symbolic link, a folder, a
fifo, a file too large; backends read it from their own side of the mount, never following a link) scores 0, a
graded failure, not a crash. The reward folder is emptied after every harness process is dead and the verifier's
processes are all dead before it is read, so such a file was made by the verifier itself, and an honest verifier
writes a regular file: it does otherwise when steered by what the harness left (a link it copied out of the
workspace, output it echoed), and calling that a crash would hand the harness a retry and an exclusion in place of
its failure. A verifier broken on its own this way fails every rollout, the oracle included, which the example and
oracle tests catch.
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
    """``clean``: the backend gives it ``verifier_env`` (the task's ``[verifier] env`` on top), a fresh HOME as cwd,
    and only once nothing of the harness runs (``rollout._backends.base``)."""
    return Phase("verifier", ("bash", "/tests/test.sh"), env=dict(task.config.verifier.env),
                 timeout_s=task.verifier_timeout_s, clean=True,
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
    refused = {p: why for p, why in result.refused.items() if p in (REWARD_JSON, REWARD_TXT)}
    if refused:
        evidence |= {"refused": refused, "source": "refused"}
        return Verdict(0.0, evidence, version)
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
