"""bench/learning_curve.py without running a loop: arguments that cannot go together are refused, and a measured seed
pools from its two small files (``demo-result.json`` + ``outcomes.json``, what ``bench/results/`` keeps) without its
store."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from learner import TaskAgg

_spec = importlib.util.spec_from_file_location("learning_curve",
                                               Path(__file__).parents[1] / "bench" / "learning_curve.py")
curve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(curve)


def test_seed_with_seeds_is_refused(capsys):
    for extra in (["--seeds", "2"], ["--first-seed", "1"]):
        with pytest.raises(SystemExit) as exc:
            curve.main(["--seed", "0", *extra])
        assert exc.value.code == 2 and "--seed 0 names the seeds" in capsys.readouterr().err


def _agg(passed: int, tools: dict[str, int]) -> TaskAgg:
    return TaskAgg(family="files", n=1, passed=passed, tool_calls=sum(tools.values()), tools=Counter(tools),
                   coverage=[0.5], efficiency=[1.0] if passed else [])


def test_task_aggregate_round_trips_through_json_and_refuses_unknown_fields():
    agg = _agg(1, {"bash": 2, "write_file": 1})
    assert TaskAgg.from_dict(json.loads(json.dumps(agg.as_dict()))) == agg
    with pytest.raises(ValueError, match=r"unknown fields \['passes'\]"):
        TaskAgg.from_dict({"passes": 1})


def test_a_seed_pools_from_its_two_files_and_one_without_outcomes_is_refused_by_name(tmp_path, capsys):
    home = tmp_path / "seed7"
    home.mkdir()
    doc = {"roles": {"base": "v0", "sft": "v1", "final": "v2"}, "eval_runs": {"v0": "r0", "v1": "r1", "v2": "r2"},
           "minutes": 12.5, "heldout_tasks": 4}
    (home / "demo-result.json").write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="neither store.sqlite nor outcomes.json"):
        curve.main(["--seed", "7", "--keep", str(tmp_path), "--n-boot", "50"])
    # the base passes none of 4 tasks, SFT 1, the final version 3
    roles = {"base": [0, 0, 0, 0], "sft": [1, 0, 0, 0], "final": [1, 1, 1, 0]}
    saved = {role: {f"s7:t{i}": _agg(p, {"bash": 1 + p}).as_dict() for i, p in enumerate(ps)}
             for role, ps in roles.items()}
    (home / "outcomes.json").write_text(json.dumps({"seed": 7, "greedy": saved, "sampled": None}))
    assert curve.main(["--seed", "7", "--keep", str(tmp_path), "--n-boot", "50"]) == 0
    pool = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["pooled"]
    assert (pool["success_base"], pool["success_sft"], pool["success_final"]) == (0.0, 0.25, 0.75)
    assert pool["final_minus_sft"] == 0.5 and pool["minutes"] == [12.5]
    assert sorted(p.name for p in home.iterdir()) == ["demo-result.json", "outcomes.json"]   # read, nothing written
