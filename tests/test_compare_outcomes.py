"""bench/compare_outcomes.py: two runs' versions paired by held-out task across runs, from their outcomes.json."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from learner import TaskAgg

_spec = importlib.util.spec_from_file_location("compare_outcomes",
                                               Path(__file__).parents[1] / "bench" / "compare_outcomes.py")
cmp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cmp)


def _write(folder: Path, seed: int, role: str, passed: dict[str, int]) -> None:
    aggs = {f"s{seed}:{t}": TaskAgg(family=t.split("-")[0], difficulty="2", n=1, passed=p).as_dict()
            for t, p in passed.items()}
    (folder / f"seed{seed}").mkdir(parents=True)
    (folder / f"seed{seed}" / "outcomes.json").write_text(json.dumps({"seed": seed, "greedy": {role: aggs},
                                                                      "sampled": None}))


def test_pairs_the_same_tasks_across_runs_and_pools_only_shared_seeds(tmp_path, capsys):
    _write(tmp_path / "even", 0, "sft", {"check-1": 0, "check-2": 0, "files-3": 1, "files-4": 1})
    _write(tmp_path / "even", 1, "sft", {"check-1": 1, "files-9": 0})   # a seed the other run lacks
    _write(tmp_path / "mix", 0, "sft", {"check-1": 1, "check-2": 1, "files-3": 1, "files-4": 0})
    assert cmp.main([str(tmp_path / "even"), str(tmp_path / "mix:sft"), "--boot", "200"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    got = {d["metric"]: d for d in doc["diffs"]}
    assert doc["seeds"] == [0] and doc["tasks"] == 4
    assert got["success_rate"]["a"] == 0.5 and got["success_rate"]["b"] == 0.75 and got["success_rate"]["paired"]
    assert got["success[check]"]["diff"] == 1.0 and got["success[files]"]["diff"] == -0.5
    assert got["success_rate"]["p_value"] == 1.0   # McNemar: two tasks won, one lost


def test_a_missing_role_or_no_shared_seed_says_what_to_do(tmp_path):
    _write(tmp_path / "a", 0, "sft", {"check-1": 0})
    _write(tmp_path / "b", 1, "sft", {"check-1": 1})
    with pytest.raises(SystemExit, match="no seed in both: .* has \\[0\\], .* has \\[1\\]"):
        cmp.main([str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(SystemExit, match="holds greedy outcomes of final"):
        cmp.main([str(tmp_path / "a:final"), str(tmp_path / "b")])
    with pytest.raises(SystemExit, match="role 'best' is not one of"):
        cmp.main([str(tmp_path / "a:best"), str(tmp_path / "b")])
