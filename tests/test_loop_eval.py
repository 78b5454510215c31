"""The loop's held-out evaluation: one greedy rollout a task, and with ``--eval-samples K`` also K rollouts a task
sampled at the GRPO temperature in a run of their own (the real loop: tests/slow/test_learning_loop.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rich.console import Console

from openforge.loop import LearningLoop, LoopConfig, LoopError
from openforge.loop_recipe import GrpoRecipe


class RecordingSession:
    def __init__(self, passed_greedy: int, passed_sampled: int):
        self.calls: list[dict] = []
        self.passed = {0.0: passed_greedy}
        self.passed_sampled = passed_sampled

    def rollouts(self, tasks, *, purpose, group_size, temperature, name):
        self.calls.append({"purpose": purpose, "group_size": group_size, "temperature": temperature, "name": name})
        n = len(tasks) * group_size
        ok = self.passed.get(temperature, self.passed_sampled)
        return SimpleNamespace(results=[SimpleNamespace(outcome="success" if i < ok else "failure") for i in range(n)],
                               run_id=f"run-{len(self.calls)}")


def _loop(tmp_path, eval_samples: int, temperature: float = 0.7):
    cfg = LoopConfig(out=tmp_path, train_tasks=8, demo_tasks=4, heldout_tasks=4, eval_samples=eval_samples,
                     recipe=GrpoRecipe(temperature=temperature), tag="t")
    loop = LearningLoop(cfg, Console(file=open("/dev/null", "w")))
    loop.session = RecordingSession(passed_greedy=1, passed_sampled=5)
    loop.add_version("v", None, "sft")
    return loop


def test_sampled_evaluation_runs_k_a_task_at_the_grpo_temperature_in_its_own_run(tmp_path):
    loop = _loop(tmp_path, eval_samples=3)
    rate = loop.evaluate("v", ["a", "b", "c", "d"])
    greedy, sampled = loop.session.calls
    assert greedy == {"purpose": "eval", "group_size": 1, "temperature": 0.0, "name": "eval v"}
    assert sampled == {"purpose": "eval", "group_size": 3, "temperature": 0.7, "name": "eval sampled v"}
    row = loop.report.row("v")
    assert (rate.successes, rate.n) == (1, 4) and (row.heldout.successes, row.heldout.n) == (1, 4)
    assert (row.sampled.successes, row.sampled.n) == (5, 12)
    assert loop.report.eval_runs == {"v": "run-1"} and loop.report.sampled_runs == {"v": "run-2"}


def test_without_eval_samples_only_the_greedy_run(tmp_path):
    loop = _loop(tmp_path, eval_samples=0)
    loop.evaluate("v", ["a", "b"])
    assert [c["temperature"] for c in loop.session.calls] == [0.0] and not loop.report.sampled_runs
    assert loop.report.row("v").sampled.n == 0


@pytest.mark.parametrize("k", [1, -2])
def test_one_or_fewer_samples_is_refused_with_the_fix(tmp_path, k):
    with pytest.raises(LoopError, match=rf"--eval-samples {k}: pass 0 \(greedy evaluation only\) or 2 or more"):
        LoopConfig(out=tmp_path, train_tasks=8, demo_tasks=4, heldout_tasks=4, eval_samples=k).check()


def test_a_dead_engine_stops_the_loop_with_the_logs_cause(tmp_path):
    """vLLM exited mid-run: the rollouts were infra errors and every later one would be; the loop says why."""
    import subprocess
    import sys

    from openforge.loop_session import Session
    from proxy.engines.vllm_cpu import VllmServer

    log = tmp_path / "server.log"
    log.write_text("INFO up\nterminate called after throwing an instance of 'std::runtime_error'\n"
                   "  what():  kernel, x.cpp:39, index out of bounds: 0 <= tmp8 < 8192L\n"
                   "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n")
    server = VllmServer(port=1)
    server.log, server.proc = log, subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    server.proc.wait()
    session = Session(SimpleNamespace(teacher=None), None, None, None)
    session.server = server
    summary = SimpleNamespace(results=[SimpleNamespace(outcome="infra_error")] * 3 + [SimpleNamespace(outcome="success")])
    with pytest.raises(RuntimeError, match=r"engine exited with 3; its log .* says: what\(\):  kernel, x.cpp:39, index "
                                           r"out of bounds.* \(during 'eval v': 3 of 4 rollouts were infra errors\)"):
        session._check_run("eval v", summary)
    server.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert server.exit_cause() is None
        session._check_run("eval v", summary)   # still running, and not every rollout failed: nothing to say
    finally:
        server.proc.kill()


def test_a_run_of_nothing_but_infra_errors_stops_the_loop(tmp_path):
    from openforge.loop_session import Session

    session = Session(SimpleNamespace(teacher=None), None, None, None)
    bad = SimpleNamespace(outcome="infra_error", detail="bwrap: Can't find source path /x/proxy.sock\n")
    with pytest.raises(RuntimeError, match=r"every one of the 2 rollouts of 'eval v' was an infra error .* the first: "
                                           r"bwrap: Can't find source path /x/proxy.sock$"):
        session._check_run("eval v", SimpleNamespace(results=[bad, bad]))
    session._check_run("eval v", SimpleNamespace(results=[bad, SimpleNamespace(outcome="failure", detail="")]))
