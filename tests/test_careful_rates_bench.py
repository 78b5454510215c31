"""bench/careful_rates.py's rules: the per-family rates from per-rollout rows, and
the paired difference by task; a folder without a result is refused before any store opens."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("careful_rates", Path(__file__).parents[1] / "bench" / "careful_rates.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _row(family, passed, looked, failed=0, recovered=0):
    return {"family": family, "passed": passed, "looked": looked, "failed": failed, "recovered": recovered}


def test_family_rates_and_the_paired_difference():
    sft = {"check-1-d1": [_row("check", True, True), _row("check", False, False)],
           "check-2-d1": [_row("check", False, False), _row("check", False, None)],
           "recover-3-d1": [_row("recover", True, False, failed=2, recovered=1)]}
    final = {"check-1-d1": [_row("check", True, True), _row("check", True, True)],
             "check-2-d1": [_row("check", True, True), _row("check", False, False)],
             "recover-3-d1": [_row("recover", True, False)]}
    r = bench.family_rates(sft)
    assert r["check"] == {"rollouts": 4, "success": 0.25, "looked_first": 0.25, "success_looked": 1.0,
                          "success_blind": 0.0, "met_error": 0.0, "recovered": None}
    assert r["recover"]["met_error"] == 1.0 and r["recover"]["recovered"] == 0.5
    d = bench.paired(sft, final, "looked", ("check",), n_boot=200)
    assert d["a"] == pytest.approx(0.25) and d["b"] == pytest.approx(0.75) and d["delta"] == pytest.approx(0.5)
    assert d["ci95"] is not None and d["ci95"][0] <= 0.5 <= d["ci95"][1]


def test_a_folder_without_a_result_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--from", str(tmp_path)])
    assert "no demo-result.json" in capsys.readouterr().err


def test_runs_are_found_by_name_while_the_loop_runs():
    class Store:
        def lineage(self, kind):
            assert kind == "runs"
            return [{"id": "r1", "name": "eval sampled v-sft (12062140)"}, {"id": "r0", "name": "eval v-sft (1)"},
                    {"id": "r2", "name": "teacher (1)"}, {"id": "r3", "name": None}]
    assert bench.sampled_runs(Store(), Path("/nonexistent/demo-result.json")) == {"v-sft": "r1", "roles": {}}
