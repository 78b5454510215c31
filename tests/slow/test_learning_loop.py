"""The learning loop's mechanics end to end, small: `openforge demo` on two generated families (4 train tasks, 2
demonstrated, 2 held out), SFT in stages of one epoch (at most two) validated on the 2 undemonstrated train tasks,
one GRPO round of two groups, the control (SFT given GRPO's minutes), with its own vLLM on the CPU, then what the store holds of it and the paired comparisons it prints.

The figures (does the policy improve, by how much) are `bench/learning_curve.py`'s; this checks the plumbing: the
purposes of the runs, what each shard may hold, the lineage chain, the policy version every call was recorded under,
and that the commands the demo prints as next steps work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forge_store import RolloutFilter, open_store

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _openforge(home: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENFORGE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([str(BIN / "openforge"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    if os.environ.get("OPENFORGE_SKIP_SLOW") == "1":
        pytest.skip("OPENFORGE_SKIP_SLOW=1")
    home = tmp_path_factory.mktemp("loop-home")
    p = _openforge(home, "demo", "--families", "files,plan", "--train-tasks", "4", "--demo-tasks", "2",
                   "--heldout-tasks", "2", "--rounds", "1", "--tasks-per-round", "2", "--group-size", "4",
                   "--signal-groups", "1", "--max-draws", "2",
                   "--temperature", "1.2", "--sft-epochs", "2", "--sft-stage-epochs", "1", "--sft-val-tasks", "2",
                   "--concurrency", "4", "--eval-samples", "2", "--port", "0")
    assert p.returncode == 0, p.stderr[-6000:]
    return home, json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_the_chain_base_sft_grpo_is_in_the_store(loop):
    home, doc, err = loop
    versions = {v["made_by"]: v for v in doc["versions"]}
    base, sft = versions["base"], versions["sft"]
    # staged SFT: one epoch per stage, validated on the 2 undemonstrated train tasks; the best stage is the SFT
    curve = doc["sft_curve"]
    assert [c["epochs"] for c in curve] in ([1], [1, 2]) and sft["version"] in {c["version"] for c in curve}, doc
    assert all(c["validation"] is not None for c in curve) and sft["samples"] == 2, doc
    stages = {v["version"]: v for v in doc["versions"] if v["made_by"] in ("sft", "sft stage")}
    assert stages[curve[0]["version"]]["parent"] == base["version"] and len(stages) == len(curve), doc
    assert doc["heldout_tasks"] == 2 and doc["recipe"]["group_size"] == 4 and doc["recipe"]["keep_optimizer"], doc
    assert doc["switch_s_p50"] is not None and doc["switch_s_p50"] < 15, doc
    chain = json.loads(_openforge(home, "lineage", doc["final_version"], "--json").stdout)
    names = [c["policy_version"] for c in chain]
    assert names[0] == base["version"] and names[1] == curve[0]["version"] and sft["version"] in names, names
    grpo = versions.get("grpo round 1")
    draws = doc["draws"][0]   # dynamic sampling: a second draw only when the first held no group with signal
    by_draw = draws["spread_by_draw"]
    assert len(by_draw) == draws["draws"] and not any(by_draw[:-1]) and (by_draw[-1] or len(by_draw) == 2), doc
    assert draws["kept_groups"] == min(1, draws["spread_groups"]) == (grpo is not None), doc
    assert sum(draws["kept_by_kind"].values()) == draws["kept_groups"] and "other" not in draws["drawn_by_kind"], doc
    if grpo is None:  # every group got equal rewards: the round trained nothing, and says why
        assert any("round 1: no update" in n for n in doc["notes"]), doc
        assert doc["final_version"] == sft["version"]
    else:
        assert grpo["parent"] == sft["version"] and chain[-1]["policy_version"] == grpo["version"], chain
        assert chain[-1]["algorithm"] == "grpo" and chain[-1]["samples"] == grpo["samples"] > 0
        assert 0.9 < doc["importance_ratio_mean"] < 1.1, doc
        assert 0 <= doc["importance_k3_mean"] < 0.01, doc
        control = versions["sft extended (control)"]   # SFT given the seconds GRPO took, evaluated like the others
        assert control["parent"] == sft["version"] and control["heldout"]["n"] == 2, doc
        assert doc["success_sft_extended"] is not None and doc["final_minus_sft_extended_ci95"] is not None, doc
        assert doc["final_minus_sft_ci95"] is not None and doc["rubrics_sft_to_final"], doc
        assert set(doc["per_task"]) == {"base", "sft", "final", "sft_extended"}, doc
        assert "paired by task" in err and "What GRPO changed" in err, err[-3000:]
        sampled = doc["sampled"]   # --eval-samples 2: two rollouts a held-out task at the GRPO temperature
        assert sampled["samples_per_task"] == 2 and sampled["temperature"] == 1.2, sampled
        assert set(sampled["per_task"]) == {"base", "sft", "final", "sft_extended"}, sampled
        assert sampled["final_minus_sft_ci95"] is not None and sampled["rubrics_sft_to_final"], sampled
        assert sampled["runs"][grpo["version"]] != doc["eval_runs"][grpo["version"]], sampled
        assert "final - SFT (sampled)" in err, err[-3000:]
    for row in versions.values():   # every evaluated version was also sampled, 2 rollouts on each of 2 tasks
        assert (row["sampled"]["n"] == 4) == (row["heldout"]["n"] == 2), row
    for link in chain[1:]:
        assert link["export_id"] and link["watermark"] and Path(link["shard"], "manifest.json").is_file(), link


def test_runs_have_purposes_and_shards_only_what_they_may(loop):
    home, doc, _ = loop
    store = open_store(f"sqlite:///{home / 'store.sqlite'}")
    try:
        by_purpose: dict[str, set[str]] = {}
        for info in store.iter_rollouts(RolloutFilter(finished=True)):
            by_purpose.setdefault((info.metadata or {}).get("purpose"), set()).add(info.policy_version_id)
        assert set(by_purpose) == {"eval", "teacher", "train"}, by_purpose
        assert by_purpose["teacher"] == {"teacher-scripted"}
        assert {v["version"] for v in doc["versions"]} >= by_purpose["eval"]
        for export in store.lineage("exports"):
            manifest = export["manifest"]
            excluded = manifest.get("exclusions") or {}
            if manifest["format"] == "verl":  # GRPO: neither the teacher's nor evaluation rollouts
                assert excluded.get("teacher") and excluded.get("evaluation"), manifest["exclusions"]
            else:  # SFT from the teacher: never evaluation rollouts
                assert manifest["format"] == "sft" and excluded.get("evaluation"), manifest["exclusions"]
        for info in store.iter_rollouts(RolloutFilter(finished=True)):  # every call under its rollout's version
            assert {c.policy_version_id for c in store.calls(info.id)} <= {info.policy_version_id}, info.id
    finally:
        store.close()


def test_the_next_commands_it_prints_work(loop):
    home, doc, err = loop
    nexts = [line.split("#")[0].split() for line in err.split("next")[-1].splitlines() if "openforge" in line]
    assert nexts and all(cmd[0] == "openforge" for cmd in nexts), err[-2000:]
    for cmd in nexts:
        if cmd[1] in ("dashboard", "demo"):  # long-running: their --help must work (the dashboard has its own e2e test)
            cmd = [cmd[0], cmd[1], "--help"]
        p = _openforge(home, *cmd[1:], timeout=300)
        assert p.returncode == 0, (cmd, p.stderr[-2000:])
