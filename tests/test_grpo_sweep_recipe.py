"""bench/grpo_sweep.py's ``--recipe`` language: GrpoRecipe fields as name=value pairs, typed by the field, checked by
the recipe's own rules; an unknown field names the fields there are. The benches' arguments that cannot go together
are refused before anything runs."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from openforge.loop_recipe import GrpoRecipe, RecipeError

_spec = importlib.util.spec_from_file_location("grpo_sweep", Path(__file__).parents[1] / "bench" / "grpo_sweep.py")
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)


def test_fields_take_their_types_and_the_rest_keep_defaults():
    r = sweep.parse_recipe("rounds=1, temperature=0.8,negative_weight=0,call_cost=0.1,batch_size=none,"
                           "keep_optimizer=false")
    assert (r.rounds, r.temperature, r.negative_weight, r.call_cost, r.batch_size, r.keep_optimizer) == \
        (1, 0.8, 0.0, 0.1, None, False)
    assert r.lr == GrpoRecipe().lr and isinstance(r.rounds, int)


def test_unknown_field_and_out_of_range_value_are_refused():
    with pytest.raises(SystemExit, match="unknown field 'temp'.*temperature"):
        sweep.parse_recipe("temp=0.8")
    with pytest.raises(RecipeError, match="--call-cost 1.5"):
        sweep.parse_recipe("call_cost=1.5")


def test_an_anchored_recipe_without_demonstrations_is_refused_before_anything_runs(tmp_path, monkeypatch):
    # a bench/sft_plateau.py folder: a checkpoint, no demonstrations' export; the default recipe anchors on them
    (tmp_path / "checkpoints" / "sft-epoch1").mkdir(parents=True)
    monkeypatch.setenv("OPENFORGE_HOME", str(tmp_path))   # main() sets it: restored after the test
    with pytest.raises(SystemExit, match=r"--recipe 2: sft_anchor > 0 .*add sft_anchor=0"):
        sweep.main(["--from", str(tmp_path), "--epoch", "1", "--recipe", "sft_anchor=0", "--recipe", "rounds=1"])
    assert not (tmp_path / "demo").exists()   # refused before any task was generated


def test_learning_curve_refuses_seed_with_seeds(capsys):
    spec = importlib.util.spec_from_file_location("learning_curve",
                                                  Path(__file__).parents[1] / "bench" / "learning_curve.py")
    curve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(curve)
    for extra in (["--seeds", "2"], ["--first-seed", "1"]):
        with pytest.raises(SystemExit) as exc:
            curve.main(["--seed", "0", *extra])
        assert exc.value.code == 2 and "--seed 0 names the seeds" in capsys.readouterr().err


def test_learning_curve_pools_a_seed_from_its_two_files_without_the_store(tmp_path, capsys):
    """bench/results/ keeps a measured seed as demo-result.json + outcomes.json; the pool reads them back, and a
    seed with neither the store nor the outcomes is refused by name."""
    import json

    from learner import TaskAgg

    spec = importlib.util.spec_from_file_location("learning_curve",
                                                  Path(__file__).parents[1] / "bench" / "learning_curve.py")
    curve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(curve)
    home = tmp_path / "seed7"
    home.mkdir()
    doc = {"roles": {"base": "v0", "sft": "v1", "final": "v2"}, "eval_runs": {"v0": "r0", "v1": "r1", "v2": "r2"},
           "minutes": 12.5, "heldout_tasks": 4}
    (home / "demo-result.json").write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="neither store.sqlite nor outcomes.json"):
        curve.main(["--seed", "7", "--keep", str(tmp_path), "--n-boot", "50"])
    # SFT passes 1 of 4 tasks, the final version 3 of 4, the base none
    agg = lambda passed, tools: TaskAgg(family="files", n=1, passed=passed, tool_calls=sum(tools.values()),  # noqa
                                        tools=Counter(tools), coverage=[0.5], efficiency=[1.0] if passed else [])
    roles = {"base": [0, 0, 0, 0], "sft": [1, 0, 0, 0], "final": [1, 1, 1, 0]}
    saved = {role: {f"s7:t{i}": agg(p, {"bash": 1 + p}).as_dict() for i, p in enumerate(ps)}
             for role, ps in roles.items()}
    assert TaskAgg.from_dict(saved["final"]["s7:t0"]) == agg(1, {"bash": 2})   # the round trip loses nothing
    (home / "outcomes.json").write_text(json.dumps({"seed": 7, "greedy": saved, "sampled": None}))
    assert curve.main(["--seed", "7", "--keep", str(tmp_path), "--n-boot", "50"]) == 0
    pool = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["pooled"]
    assert (pool["success_base"], pool["success_sft"], pool["success_final"]) == (0.0, 0.25, 0.75)
    assert pool["final_minus_sft"] == 0.5 and pool["minutes"] == [12.5]
    with pytest.raises(ValueError, match="unknown fields \\['passes'\\]"):
        TaskAgg.from_dict({"passes": 1})
