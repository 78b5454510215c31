"""DAPO's dynamic sampling in the loop's GRPO rounds (``openforge.loop_sampling``): which groups count as signal,
how the draws go round the pool, and what the export is told to keep. The slow loop test runs it for real."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pyarrow.parquet as pq
import pytest

from forge_store import Settings, open_store
from learner import ExportConfig, export
from openforge.loop_recipe import GrpoRecipe, RecipeError
from openforge.loop_sampling import RoundDraws, RoundSampler, draw_tasks, spread_groups
from rollout._rollout_runner import RolloutResult
from tests.conftest import make_call

_ids = itertools.count()


def result(group: str, outcome: str, reward: float | None) -> RolloutResult:
    return RolloutResult(rollout_id=f"ro-{next(_ids)}", task_id=group.split("/")[0], group_id=group, outcome=outcome,
                         reward=reward)


def test_only_groups_whose_rewards_differ_are_signal():
    results = [result("a", "success", 1.0), result("a", "failure", 0.0),          # spread
               result("b", "failure", 0.0), result("b", "failure", 0.0),          # all equal
               result("c", "failure", 0.5), result("c", "failure", 0.0),          # partial credit: spread
               result("d", "success", 1.0), result("d", "infra_error", None),     # one graded rollout: no group
               result("e", "failure", None), result("e", "failure", 0.0)]         # no reward counts 0
    assert spread_groups(results) == ["a", "c"]
    assert spread_groups(results, success_only=True) == ["a"]   # as the export sees it then: 0.5 is a failure


def test_draws_go_round_the_pool_from_where_the_last_stopped():
    pool = list("abcde")
    assert draw_tasks(pool, 0, 3) == ["a", "b", "c"]
    assert draw_tasks(pool, 3, 3) == ["d", "e", "a"]
    assert draw_tasks(pool, 7, 2) == ["c", "d"]
    assert draw_tasks(pool, 0, 7) == ["a", "b", "c", "d", "e", "a", "b"]


@dataclass
class FakeRun:
    run_id: str
    results: list = field(default_factory=list)


class Rollouts:
    """Stands in for the session's rollouts: each task's group succeeds on some rollouts or none, as scripted."""

    def __init__(self, mixed: set[str]):
        self.mixed, self.calls = mixed, []

    def __call__(self, tasks, name):
        self.calls.append((list(tasks), name))
        run = FakeRun(f"run-{len(self.calls)}")
        for t in tasks:
            g = f"{t}/{run.run_id}"
            run.results += [result(g, "success", 1.0) if t in self.mixed else result(g, "failure", 0.0),
                            result(g, "failure", 0.0)]
        return run


def test_dynamic_sampling_draws_until_the_round_holds_enough_groups_with_signal_and_keeps_only_those():
    recipe = GrpoRecipe(tasks_per_round=3, group_size=2, signal_groups=3, max_draws=5)
    rollouts = Rollouts(mixed={"t1", "t4", "t5", "t7"})
    sampler = RoundSampler([f"t{i}" for i in range(10)], recipe)
    draws = sampler.draw(rollouts, "grpo round 1")
    assert [c[0] for c in rollouts.calls] == [["t0", "t1", "t2"], ["t3", "t4", "t5"]]   # 1, then 3: stop
    assert [c[1] for c in rollouts.calls] == ["grpo round 1", "grpo round 1 draw 2"]
    assert draws.keep == ["t1/run-1", "t4/run-2", "t5/run-2"] and draws.runs == ["run-1", "run-2"]
    assert draws.where() == "run_id in ('run-1', 'run-2') and group_id in ('t1/run-1', 't4/run-2', 't5/run-2')"
    assert draws.as_dict() | {"runs": None} == {"draws": 2, "rollouts": 12, "groups": 6, "spread_groups": 3,
                                                "spread_by_draw": [1, 2], "kept_groups": 3, "runs": None,
                                                "drawn_by_kind": {"other": 6}, "spread_by_kind": {"other": 3},
                                                "kept_by_kind": {"other": 3}}
    # the next round starts where this one stopped and goes round the pool (t9, t0, t1 in its second draw)
    more = sampler.draw(rollouts, "grpo round 2")
    assert [c[0] for c in rollouts.calls[2:]] == [["t6", "t7", "t8"], ["t9", "t0", "t1"], ["t2", "t3", "t4"]]
    assert more.keep == ["t7/run-3", "t1/run-4", "t4/run-5"]


def test_a_round_stops_at_max_draws_with_what_it_found():
    recipe = GrpoRecipe(tasks_per_round=2, group_size=2, signal_groups=4, max_draws=2)
    rollouts = Rollouts(mixed={"b"})
    draws = RoundSampler(["a", "b", "c", "d", "e"], recipe).draw(rollouts, "r")
    assert len(rollouts.calls) == 2 and draws.keep == ["b/run-1"]
    nothing = RoundSampler(["a", "c"], recipe).draw(Rollouts(mixed=set()), "r")
    assert len(nothing.runs) == 2 and nothing.keep == []   # the loop then skips the update and says why


def test_without_dynamic_sampling_a_round_is_one_draw_trained_whole():
    recipe = GrpoRecipe(tasks_per_round=2, group_size=2, signal_groups=0)
    rollouts = Rollouts(mixed=set())
    draws = RoundSampler(["a", "b", "c"], recipe).draw(rollouts, "r")
    assert len(rollouts.calls) == 1 and draws.keep is None and draws.where() == "run_id = 'run-1'"
    assert draws.kept == [] and draws.kept_text() == "none"   # what the console and the result count: not all drawn


@pytest.mark.parametrize("kw", [{"signal_groups": -1}, {"signal_groups": 4, "max_draws": 0}])
def test_dynamic_sampling_settings_out_of_range_say_the_rule(kw):
    with pytest.raises(RecipeError, match="--signal-groups"):
        GrpoRecipe(**kw).check()


def test_the_export_keeps_exactly_the_groups_the_round_kept(tmp_path):
    """The ``where`` the draws build, through the real export on a real store: the kept groups' rollouts, whole."""
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}", settings=Settings(home=tmp_path / "home"))
    try:
        for run in ("run-a", "run-b"):
            for task in ("t1", "t2"):
                gid = f"{task}-{run}"
                store.create_group(gid, task_id=task, target_size=2, run_id=run, policy_version_id="p1")
                for i, reward in enumerate((1.0, 0.0)):
                    rid = f"{gid}-{i}"
                    store.start_rollout(rid, group_id=gid, run_id=run, task_id=task, policy_version_id="p1")
                    store.record_call(make_call(f"{rid}-c0", rid, 0, prompt_ids=[1, 2, 3], completion_ids=[4 + i, 5]))
                    store.finish_rollout(rid, "success" if reward else "failure")
                    store.add_reward(rid, reward, verifier_version="v1")
        store.flush(30)
        draws = RoundDraws(runs=["run-a", "run-b"], spread=["t1-run-a", "t2-run-a", "t1-run-b", "t2-run-b"],
                           keep=["t2-run-a", "t1-run-b"])
        manifest = export(store, tmp_path / "shard", ExportConfig(format="verl", where=draws.where()))
        assert manifest["counts"]["rows"]["trajectories"] == 4
        table = pq.read_table(next((tmp_path / "shard").rglob("trajectories*.parquet")))
        assert sorted(set(table.column("group_id").to_pylist())) == ["t1-run-b", "t2-run-a"]
    finally:
        store.close()
