"""Generated tasks in real bubblewrap sandboxes, through the embedded proxy: the oracle and a react harness that
replays solution/actions.json (what a scripted teacher does) both reach 1.0, and the run's purpose and the task's
lineage are in the store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from forge_store import RolloutFilter
from proxy.engines.scripted.script import Text, ToolCall, ToolCalls
from rollout import RunConfig, generate_tasks, load_tasks
from tests.rollout_fixtures import CommandHarness

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def generated(shared_tmp):
    generate_tasks("files", shared_tmp / "gen", train=3, heldout=1, seed=11)
    return shared_tmp / "gen"


def test_oracle_solves_generated_tasks_and_the_store_keeps_purpose_and_lineage(forge, generated):
    tasks = load_tasks(generated / "train")
    summary = forge.run(tasks, "oracle", purpose="teacher", run_name="demos")
    assert [(r.outcome, r.reward) for r in summary.results] == [("success", 1.0)] * 3, \
        [(r.task_id, r.detail[-500:]) for r in summary.results]
    ros = list(forge.store.iter_rollouts(RolloutFilter()))
    assert len(ros) == 3 and all(r.metadata["purpose"] == "teacher" for r in ros)
    (run,) = forge.store.lineage("runs")
    assert run["config"]["purpose"] == "teacher" and run["name"] == "demos"
    rows = {t["id"]: t for t in forge.store.lineage("tasks")}
    for t in tasks:
        lineage = rows[t.id]["metadata"]["metadata"]
        assert {k: lineage[k] for k in ("generator", "family", "split", "difficulty")} == {
            "generator": "openforge.taskgen/1", "family": "files", "split": "train",
            "difficulty": t.config.metadata["difficulty"]}
        assert lineage["seed"] == t.config.metadata["seed"] and rows[t.id]["instruction_hash"] == t.instruction_hash
    for r in ros:
        (reward,) = forge.store.rewards(r.id)
        evidence = json.loads(forge.store.get_blob(reward.evidence_blob))
        assert evidence["verifier"]["checks"] and all(evidence["verifier"]["checks"].values())


def test_react_replaying_actions_reaches_1(forge, generated):
    """The scripted teacher's path: each action becomes the model's tool call, the answer its last message."""
    task = next(t for t in load_tasks(generated / "train") if t.config.metadata["difficulty"] >= 2)
    forge.up.double.script.extend([*(ToolCalls([ToolCall(a["tool"], a["arguments"])])
                                      for a in task.solution_actions[:-1]),
                                    Text(task.solution_actions[-1]["answer"])])
    summary = forge.run([task], "react")
    (res,) = summary.results
    assert res.outcome == "success" and res.reward == 1.0, res.detail[-1500:]
    (ro,) = forge.store.iter_rollouts(RolloutFilter())
    assert ro.metadata["purpose"] == "train"
    calls = forge.store.calls(ro.id)
    assert len(calls) == len(task.solution_actions)
    assert all("exit code: 0" in m["content"] or m["content"].startswith("wrote ")
               for m in calls[-1].messages if m.get("role") == "tool")


def test_purpose_must_be_known():
    with pytest.raises(ValueError, match=r"--purpose 'training': a run is one of train, eval, teacher"):
        RunConfig(harness="react", model="m", purpose="training").check()


def test_run_command_records_purpose(up, shared_tmp, generated):
    env = {**os.environ, "OPENFORGE_HOME": str(shared_tmp / "cli-home"),
           "OPENFORGE_SANDBOX_DIR": str(shared_tmp / "cli-sandboxes"), "COLUMNS": "200"}
    exe = str(Path(sys.executable).parent / "openforge")
    p = subprocess.run([exe, "run", str(generated / "heldout"), "--harness", "oracle", "--upstream", up.url,
                        "--group-size", "2", "--concurrency", "2", "--purpose", "eval", "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert doc["outcomes"] == {"success": 2}
    from forge_store import open_store
    store = open_store(f"sqlite:///{shared_tmp / 'cli-home' / 'store.sqlite'}")
    try:
        assert [r.metadata["purpose"] for r in store.iter_rollouts(RolloutFilter())] == ["eval", "eval"]
        assert [r["config"]["purpose"] for r in store.lineage("runs")] == ["eval"]
    finally:
        store.close()
    p = subprocess.run([exe, "run", str(generated / "heldout"), "--harness", "oracle", "--upstream", up.url,
                        "--purpose", "exam"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 2 and "--purpose 'exam'" in " ".join(p.stderr.split()), p.stderr[-2000:]


@pytest.mark.parametrize("attack", [
    "chmod 000 /workspace",              # the host gives the workspace back readable before the verifier runs
    "for f in *; do rm -f \"$f\"; mkfifo \"$f\"; done",           # would hang one that opens what it finds
    "for f in {names}; do ln -sf /tests/expected.json \"$f\"; done",   # every named file: a link out
])
def test_a_harness_cannot_turn_its_failure_into_an_infra_error(forge, generated, attack):
    task = load_tasks(generated / "train")[0]
    names = " ".join(re.findall(r"\b[a-z]+_\d+\.(?:txt|md|log)\b", task.instruction))
    summary = forge.run([task], CommandHarness("bash", "-c", attack.replace("{names}", names)), max_infra_retries=0)
    (res,) = summary.results
    assert (res.outcome, res.reward) == ("failure", 0.0), (res.outcome, res.detail[-1500:])
