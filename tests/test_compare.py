"""Two versions compared on their evaluation rollouts, paired by task (``learner.compare_versions``, ``openforge
analyze --compare``, the dashboard's Behaviour page): the values, the differences, intervals that respect the
pairing, McNemar's exact test, and only evaluation rollouts counted. Real SQLite / PostgreSQL stores."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from forge_store import Settings, Window, open_store
from forge_store.testing import Turn, agent_calls
from learner import compare_tasks, compare_versions, mcnemar_exact
from learner._compare import TaskAgg

ROOT = Path(__file__).resolve().parents[1]
OPENFORGE = str(Path(sys.executable).parent / "openforge")
N_TASKS = 20
WIN_A = set(range(0, 8))              # A solves tasks 0-7
WIN_B = set(range(0, 12)) - {7}       # B solves 0-6 and 8-11: gains 4, loses 1 (net +3 of 20)
SOLVE = [Turn([("write_file", {"path": "a.txt", "content": "x\n"})], ["wrote 2 characters to a.txt"]),
         Turn([("read_file", {"path": "a.txt"})], ["x\n"]), Turn(text="Done.")]
FAIL = [Turn([("bash", {"command": "cat nope.txt"})],
             ["exit code: 1\nstdout:\n\nstderr:\ncat: nope.txt: No such file or directory\n"]),
        Turn([("bash", {"command": "ls"})], ["exit code: 0\nstdout:\na.txt\n\nstderr:\n"]), Turn(text="Gave up.")]


def _seed(st) -> None:
    st.register_policy_version("A", model_name="m", global_step=1)
    st.register_policy_version("B", model_name="m", global_step=2)
    for t in range(N_TASKS):
        st.register_task(f"t{t}", source="taskgen", domain="files" if t % 2 else "check",
                         metadata={"family": "files" if t % 2 else "check", "difficulty": 1 + t % 3,
                                   "required_tools": ["bash"], "reference_steps": 2})
    for version, wins in (("A", WIN_A), ("B", WIN_B)):
        for t in range(N_TASKS):
            rid = f"{version}-{t}"
            st.start_rollout(rid, task_id=f"t{t}", policy_version_id=version, metadata={"purpose": "eval"})
            for rec in agent_calls(rid, SOLVE if t in wins else FAIL, policy_version_id=version):
                st.record_call(rec)
            st.finish_rollout(rid, "success" if t in wins else "failure")
            st.add_reward(rid, 1.0 if t in wins else 0.0)
        # training rollouts of A that all fail: not evaluation, so never in the comparison
        for t in range(3):
            rid = f"{version}-train-{t}"
            st.start_rollout(rid, task_id=f"t{t}", policy_version_id=version, metadata={"purpose": "train"})
            st.finish_rollout(rid, "failure")
            st.add_reward(rid, 0.0)
    st.flush(30)


@pytest.fixture
def seeded(store_url, tmp_path):
    home = tmp_path / "home"
    with open_store(store_url, settings=Settings(home=home)) as st:
        _seed(st)
    return store_url, home


def test_the_comparison_is_paired_by_task_and_counts_only_evaluation(seeded):
    url, home = seeded
    with open_store(url, settings=Settings(home=home)) as st:
        diffs = {d.metric: d for d in compare_versions(st, "A", "B", n_boot=3000)}
    s = diffs["success_rate"]
    assert (s.a, s.b) == (8 / 20, 11 / 20) and s.diff == pytest.approx(3 / 20) and s.paired and s.n_tasks == 20
    assert s.ci95[0] < 3 / 20 < s.ci95[1]
    assert s.p_value == pytest.approx(mcnemar_exact(4, 1))   # 4 tasks won by B alone, 1 by A alone
    fam = diffs["success[files]"]   # odd tasks: A wins 1,3,5,7; B wins 1,3,5,9,11
    assert (fam.a, fam.b) == (4 / 10, 5 / 10)
    assert diffs["success[difficulty 1]"].a is not None
    assert diffs["tool_share[write_file]"].a == pytest.approx(8 / (8 * 2 + 12 * 2))
    assert diffs["self_verification_rate"].a == 1.0          # every write was read back
    assert diffs["failed_tool_calls_per_rollout"].a == pytest.approx(12 / 20)
    assert diffs["recovery_rate"].a == 1.0                   # cat failed, ls (different) succeeded
    # a failing rollout looks first (cat), a solving one writes first: A fails 12 of 20 tasks, B 9
    assert (diffs["inspect_first_rate"].a, diffs["inspect_first_rate"].b) == (12 / 20, 9 / 20)
    look = diffs["inspect_first_rate[check]"]               # even tasks: A fails 6 of 10, B 4
    assert (look.a, look.b) == (6 / 10, 4 / 10) and look.paired and look.n_tasks == 20
    assert diffs["recovery_rate[files]"].a == 1.0 and diffs["recovery_rate[check]"].b == 1.0
    # the instruction names no file: a solve coins a.txt then reads it back (1 of 2 made up), a failure coins nope.txt
    assert (diffs["made_up_name_rate"].a, diffs["made_up_name_rate"].b) == (20 / 28, 20 / 31)
    assert (diffs["made_up_name_rate[check]"].a, diffs["made_up_name_rate[check]"].b) == (10 / 14, 10 / 16)
    assert "pass@2" not in diffs                             # one rollout per task: pass@k for k > 1 is undefined


def test_a_paired_interval_is_narrower_than_unpaired_on_correlated_tasks():
    """Hard tasks stay hard under both versions: pairing removes that shared variance."""
    rng = random.Random(3)
    a, b = {}, {}
    for t in range(60):
        easy = rng.random() < 0.5
        wa = easy and rng.random() < 0.9
        wb = wa or (easy and rng.random() < 0.5)
        a[f"t{t}"] = TaskAgg(n=1, passed=int(wa))
        b[f"t{t}"] = TaskAgg(n=1, passed=int(wb))
    paired = compare_tasks(a, b, n_boot=2000)[0]
    assert not any("rate[" in d.metric for d in compare_tasks(a, b, n_boot=10))  # one family
    unpaired = compare_tasks(a, {f"u{k}": v for k, v in b.items()}, n_boot=2000)[0]
    assert paired.paired and not unpaired.paired and paired.diff == pytest.approx(unpaired.diff)
    width = lambda d: d.ci95[1] - d.ci95[0]  # noqa: E731
    assert width(paired) < 0.7 * width(unpaired), (paired.ci95, unpaired.ci95)
    assert paired.ci95[0] >= 0   # B never loses a task A wins: the paired interval cannot go below 0


def test_stratified_bootstrap_keeps_each_stratum_whole():
    a = {f"s{s}:t{t}": TaskAgg(n=1, passed=int(s == 0)) for s in range(2) for t in range(10)}
    b = {k: TaskAgg(n=1, passed=1) for k in a}
    d = compare_tasks(a, b, n_boot=500, stratum=lambda k: k.split(":")[0])[0]
    assert d.diff == pytest.approx(0.5) and d.ci95 == pytest.approx((0.5, 0.5))   # strata of fixed size


def test_mcnemar_exact():
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(10, 0) == pytest.approx(2 / 1024)
    assert mcnemar_exact(6, 1) == pytest.approx(2 * (1 + 7) / 128)


def _openforge(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "OPENFORGE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([OPENFORGE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_analyze_compare_prints_the_table_and_json_and_refuses_unknown_versions(seeded):
    url, home = seeded
    p = _openforge("analyze", "--compare", "A", "B", "--store", url, home=home)
    assert p.returncode == 0, p.stderr
    assert "B (B) against A (A), eval rollouts, paired by task" in p.stdout
    assert "success[check]" in p.stdout and "tool_share[write_file]" in p.stdout and "McNemar" in p.stdout
    p = _openforge("analyze", "--compare", "A", "B", "--json", "--store", url, home=home)
    doc = json.loads(p.stdout)
    rows = {r["metric"]: r for r in doc["rubrics"]}
    assert rows["success_rate"]["diff"] == pytest.approx(0.15) and rows["success_rate"]["paired"]
    p = _openforge("analyze", "--compare", "A", "nope", "--store", url, home=home)
    assert p.returncode == 2 and "nope is not a policy version" in p.stderr and "known: A, B" in p.stderr
    p = _openforge("analyze", "--compare", "A", "B", "--purpose", "teacher", "--store", url, home=home)
    assert p.returncode == 1 and "has finished teacher rollouts" in p.stderr


def test_compare_restricted_to_runs_leaves_another_evaluation_of_the_same_version_out(seeded):
    """``--run``: a version evaluated twice (greedy, then sampled) is compared on the run asked for only."""
    url, home = seeded
    with open_store(url, settings=Settings(home=home)) as st:
        for run in ("greedy", "sampled"):
            st.create_run(run, name=run)
        for version, wins in (("A", WIN_A), ("B", WIN_B)):
            for t in range(N_TASKS):
                rid = f"{version}-greedy-{t}"
                st.start_rollout(rid, run_id="greedy", task_id=f"t{t}", policy_version_id=version,
                                 metadata={"purpose": "eval"})
                st.finish_rollout(rid, "success" if t in wins else "failure")
                st.add_reward(rid, 1.0 if t in wins else 0.0)
        for t in range(N_TASKS):   # B's sampled evaluation: every rollout fails
            rid = "B-sampled-%d" % t
            st.start_rollout(rid, run_id="sampled", task_id=f"t{t}", policy_version_id="B",
                             metadata={"purpose": "eval"})
            st.finish_rollout(rid, "failure")
            st.add_reward(rid, 0.0)
        st.flush(30)
    p = _openforge("analyze", "--compare", "A", "B", "--run", "greedy", "--json", "--store", url, home=home)
    assert p.returncode == 0, p.stderr
    rows = {r["metric"]: r for r in json.loads(p.stdout)["rubrics"]}
    assert (rows["success_rate"]["a"], rows["success_rate"]["b"]) == (8 / 20, 11 / 20), rows["success_rate"]
    p = _openforge("analyze", "--compare", "A", "B", "--json", "--store", url, home=home)   # every eval rollout
    rows = {r["metric"]: r for r in json.loads(p.stdout)["rubrics"]}
    assert rows["success_rate"]["b"] == pytest.approx(22 / 60), rows["success_rate"]
    p = _openforge("analyze", "--compare", "A", "B", "--run", "nope", "--store", url, home=home)
    assert p.returncode == 1 and "in run(s) nope" in p.stderr and "SELECT DISTINCT run_id" in p.stderr


def test_the_behaviour_page_shows_the_same_comparison(seeded):
    from dashboards._context import Context
    from dashboards._views.behaviour import paired

    url, home = seeded
    with open_store(url, settings=Settings(home=home)) as st:
        table = paired(Context(store=st, window=Window()), "A", "B")
        doc = {d.metric: d for d in compare_versions(st, "A", "B")}
    assert table.loc["success_rate", "B - A"] == f"{doc['success_rate'].diff:+.3f}"
    assert table.loc["success_rate", "tasks"] == 20 and list(table.index) == list(doc)
