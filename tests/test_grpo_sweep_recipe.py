"""bench/grpo_sweep.py's ``--recipe`` language: GrpoRecipe fields as name=value pairs, typed by the field, checked by
the recipe's own rules; an unknown field names the fields there are. Arguments that cannot go together are refused
before anything runs."""

from __future__ import annotations

import importlib.util
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



def test_the_sft_runs_come_from_the_seed_folder_unless_named(tmp_path):
    import json

    assert sweep._sft_runs(tmp_path, "sft-v", None, False) == (None, None)   # no file: every evaluation counts
    (tmp_path / "demo-result.json").write_text(json.dumps({"eval_runs": {"sft-v": "run-g"},
                                                           "sampled": {"runs": {"sft-v": "run-s"}}}))
    assert sweep._sft_runs(tmp_path, "sft-v", None, True) == ("run-g", "run-s")
    assert sweep._sft_runs(tmp_path, "sft-v", "run-x", False) == ("run-x", None)
    with pytest.raises(SystemExit, match="names no sampled evaluation run of other"):
        sweep._sft_runs(tmp_path, "other", None, True)
