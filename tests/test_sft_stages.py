"""Staged SFT (``openforge demo --sft-stage-epochs``): stages until validation success stops rising, the best stage
is the SFT version, the engine serves it again when the last stage overshot, and the control continues from its
optimizer state. The engine, trainer and rollouts are a scripted session here (the real loop runs in
tests/slow/test_learning_loop.py); what is checked is the loop's own choice."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from openforge.loop import LearningLoop, LoopConfig, LoopError
from openforge.loop_session import BASE_POLICY


@dataclass
class _Res:
    policy_version: str
    checkpoint: Path
    step: dict


class ScriptedSession:
    """Trains by writing the optimizer state, serves what it is switched to, validates by a scripted curve."""

    def __init__(self, curve: list[int], n_val: int):
        self.curve, self.n_val = list(curve), n_val
        self.served: list[str] = []
        self.trained: list[tuple[str, str, int]] = []

    def train(self, shard, version, *, parent, algorithm, lr, epochs, optimizer_state, train_layers=None):
        Path(optimizer_state).write_text(version)   # the state after this stage
        self.trained.append((version, parent, epochs))
        return _Res(version, Path("/nowhere") / version, {"samples": 4})

    def switch(self, res) -> float:
        self.served.append(res.policy_version)
        return 0.1

    def rollouts(self, tasks, *, purpose, group_size, temperature, name):
        assert purpose == "eval" and temperature == 0.0 and len(tasks) == self.n_val
        ok = self.curve.pop(0)
        results = [SimpleNamespace(outcome="success" if i < ok else "failure") for i in range(self.n_val)]
        return SimpleNamespace(results=results, run_id=f"run-{name}")


def _loop(tmp_path, curve, *, epochs, stage, n_val=4):
    cfg = LoopConfig(out=tmp_path, sft_epochs=epochs, sft_stage_epochs=stage, sft_val_tasks=n_val,
                     train_tasks=8, demo_tasks=4, heldout_tasks=4, tag="t")
    loop = LearningLoop(cfg, Console(file=open("/dev/null", "w")))
    loop.session = ScriptedSession(curve, n_val)
    loop.optimizer.mkdir(parents=True)
    loop.add_version(BASE_POLICY, None, "base")
    return loop


def test_stops_at_the_first_stage_that_does_not_rise_and_serves_the_best_again(tmp_path):
    loop = _loop(tmp_path, [1, 3, 2, 4], epochs=8, stage=2)
    best = loop._sft_stages(tmp_path / "shard", 4, ["v"] * 4)
    assert best == "smollm2-t-sft-e4"
    s = loop.session
    assert [(v, p, e) for v, p, e in s.trained] == [("smollm2-t-sft-e2", BASE_POLICY, 2),
                                                    ("smollm2-t-sft-e4", "smollm2-t-sft-e2", 2),
                                                    ("smollm2-t-sft-e6", "smollm2-t-sft-e4", 2)]
    assert s.served == ["smollm2-t-sft-e2", "smollm2-t-sft-e4", "smollm2-t-sft-e6", "smollm2-t-sft-e4"]
    assert {r.version: r.made_by for r in loop.report.rows[1:]} == {
        "smollm2-t-sft-e2": "sft stage", "smollm2-t-sft-e4": "sft", "smollm2-t-sft-e6": "sft stage"}
    assert [c["validation"] for c in loop.report.sft_curve] == [0.25, 0.75, 0.5]
    assert (loop.optimizer / "sft.pt").read_text() == "smollm2-t-sft-e4"   # the control continues from here
    assert loop.report.made_by("sft").validation.successes == 3


def test_a_tie_stops_too_and_keeps_the_earlier_stage(tmp_path):
    loop = _loop(tmp_path, [2, 2], epochs=6, stage=3)
    assert loop._sft_stages(tmp_path / "shard", 4, ["v"] * 4) == "smollm2-t-sft-e3"
    assert loop.session.served[-1] == "smollm2-t-sft-e3"


def test_still_rising_at_the_cap_ends_at_the_cap_with_a_short_last_stage(tmp_path):
    loop = _loop(tmp_path, [0, 1, 2], epochs=5, stage=2)
    assert loop._sft_stages(tmp_path / "shard", 4, ["v"] * 4) == "smollm2-t-sft-e5"
    assert [e for _, _, e in loop.session.trained] == [2, 2, 1]
    assert loop.session.served == ["smollm2-t-sft-e2", "smollm2-t-sft-e4", "smollm2-t-sft-e5"]  # no switch back


@pytest.mark.parametrize("kw, says", [
    ({"sft_epochs": 3, "sft_stage_epochs": 4}, "--sft-stage-epochs 4: pass 0 (one go) or 1 to --sft-epochs (3)"),
    ({"sft_stage_epochs": 1, "sft_val_tasks": 9}, "--sft-val-tasks 9: staged SFT validates on train tasks the "
                                                   "teacher did not demonstrate, of which there are 4"),
])
def test_bad_stage_settings_are_refused(tmp_path, kw, says):
    with pytest.raises(LoopError) as exc:
        LoopConfig(out=tmp_path, train_tasks=8, demo_tasks=4, heldout_tasks=4, **kw).check()
    assert says in str(exc.value)


def test_grpo_rounds_draw_undemonstrated_tasks_first_then_go_round():
    from openforge.loop_tasks import grpo_pool
    from openforge.loop_sampling import draw_tasks

    train = [f"{fam}{i}" for i in range(3) for fam in "abcd"]   # interleaved families, as the loop builds them
    demos = [t for t in train if t.endswith("0")]                # the teacher showed the first of each family
    pool = grpo_pool(train, demos)
    assert pool[:8] == [t for t in train if not t.endswith("0")] and pool[8:] == demos
    assert draw_tasks(pool, 0, 4) == ["a1", "b1", "c1", "d1"]   # every family in a round, none demonstrated
    assert draw_tasks(pool, 8, 4) == demos
    assert draw_tasks(pool, 10, 5) == ["c0", "d0", "a1", "b1", "c1"]   # past the end: round the pool again
