"""Task synthesis (issue 24) with the scripted engine as the teacher, behind the real recording proxy, validating in
real bubblewrap sandboxes: an accepted task passes validation; a duplicate, an infeasible idea and a task whose
verifier accepts an empty workspace are pruned with their reasons stored; a failed build is refined with its failures
fed back; the lineage of an accepted task reaches the teacher's recorded calls."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from forge_store import Settings, open_store
from openforge.synth import SynthConfig
from openforge.synth_prompts import build_key, propose_key, refine_key
from openforge.synth_run import run_synth
from proxy.engines.scripted import Conversations, ScriptedUpstream, Text, UpstreamServer, load_smollm2_tokenizer
from rollout import load_task, task_version, validate_task
from rollout._backends.local import LocalBackend
from tests.rollout_fixtures import require_bwrap, shared_tmp  # noqa: F401  (fixture)

REWARD = "/logs/verifier/reward.txt"
TOPIC = "counting and rewriting text files"


def _check(path: str, want: str) -> str:
    return (f'if [ "$(cat {path} 2>/dev/null)" = "{want}" ]; then echo 1 > {REWARD}; else echo 0 > {REWARD}; fi\n')


COUNT = {"instruction": "Count the lines of /workspace/notes.txt and write the number to /workspace/count.txt.",
         "files": {"environment/workspace/notes.txt": "a\nb\nc\n",
                   "tests/test.sh": _check("/workspace/count.txt", "3"),
                   "solution/solve.sh": "wc -l < /workspace/notes.txt | tr -d ' ' > /workspace/count.txt\n"}}
GREET_LENIENT = {"instruction": "Write hello to /workspace/greeting.txt.",
                 "files": {"tests/test.sh": f"echo 1 > {REWARD}\n",
                           "solution/solve.sh": "echo hello > /workspace/greeting.txt\n"}}
UPPER_WRONG = {"instruction": "Write the contents of /workspace/word.txt in upper case to /workspace/upper.txt.",
               "files": {"environment/workspace/word.txt": "forge\n",
                         "tests/test.sh": _check("/workspace/upper.txt", "FORGE"),
                         "solution/solve.sh": "cp /workspace/word.txt /workspace/upper.txt\n"}}
UPPER_FIXED = {**UPPER_WRONG, "files": {**UPPER_WRONG["files"], "solution/solve.sh":
                                        "tr a-z A-Z < /workspace/word.txt > /workspace/upper.txt\n"}}
COUNT_SUMMARY = "Count the lines of a text file in the workspace and write the number of lines to count.txt."
IDEAS = [
    {"name": "count-lines", "summary": COUNT_SUMMARY, "needs": []},
    {"name": "count-the-lines", "summary": COUNT_SUMMARY.replace("count.txt", "lines.txt"), "needs": []},
    {"name": "fetch-weather", "summary": "Download today's weather for Paris and save it as weather.json.",
     "needs": ["internet"]},
    {"name": "greet", "summary": "Write a greeting into greeting.txt.", "needs": []},
    {"name": "upper-case", "summary": "Turn the word in word.txt into upper case in upper.txt.", "needs": []},
]


def _teacher() -> Conversations:
    conv = Conversations()
    conv.add(propose_key(TOPIC, len(IDEAS)), [Text("```json\n" + json.dumps(IDEAS) + "\n```")])
    conv.add(build_key("count-lines"), [Text(json.dumps(COUNT))])
    conv.add(build_key("greet"), [Text(json.dumps(GREET_LENIENT))])
    conv.add(refine_key("greet", 2), [Text(json.dumps(GREET_LENIENT))])
    conv.add(build_key("upper-case"), [Text(json.dumps(UPPER_WRONG))])
    conv.add(refine_key("upper-case", 2), [Text(json.dumps(UPPER_FIXED))])
    return conv


@pytest.fixture(scope="module")
def synth_run():
    """One synthesis run (about fifteen sandboxed validation rollouts) shared by the tests of this module."""
    require_bwrap()
    shared_tmp = Path(tempfile.mkdtemp(prefix="openforge-synth-", dir="/tmp"))
    os.chmod(shared_tmp, 0o755)
    server = UpstreamServer(ScriptedUpstream(tokenizer=load_smollm2_tokenizer(), conversations=_teacher()))
    url = server.start()
    settings = Settings(home=shared_tmp / "home", sandbox_dir=shared_tmp / "sandboxes", journal_fsync=False)
    store_url = f"sqlite:///{shared_tmp / 'synth.sqlite'}"
    out = shared_tmp / "tasks"
    try:
        report = run_synth(SynthConfig(topics=[TOPIC], out=out, model="", ideas_per_topic=len(IDEAS),
                                       max_attempts=2), teacher=url, dialect="vllm", store_url=store_url,
                           settings=settings)
    finally:
        server.stop()
    with open_store(store_url, settings=settings) as st:
        yield report, st, out, shared_tmp
    shutil.rmtree(shared_tmp, ignore_errors=True)


def test_synthesis_accepts_prunes_and_refines_with_reasons_stored(synth_run):
    report, st, out, shared_tmp = synth_run
    assert sorted(a["name"] for a in report.accepted) == ["count-lines", "upper-case"]
    assert {a["name"]: a["attempts"] for a in report.accepted} == {"count-lines": 1, "upper-case": 2}
    pruned = {p["name"]: p for p in report.pruned}
    assert set(pruned) == {"count-the-lines", "fetch-weather", "greet"}
    assert pruned["count-the-lines"]["reason"].startswith("near-duplicate of 'count-lines'")
    assert pruned["fetch-weather"]["reason"] == "infeasible: needs internet (sandboxes have no network access)"
    assert pruned["greet"]["stage"] == "test"
    assert "empty_fails: a harness that does nothing got reward 1.0" in pruned["greet"]["reason"]
    assert len(pruned["greet"]["attempts"]) == 2
    for name, p in pruned.items():   # the reason is stored, on the teacher rollout whose answer was judged
        events = [e for e in st.events(p["rollout_id"]) if e.kind == "synth.pruned" and e.detail["name"] == name]
        assert [e.detail["reason"] for e in events] == [p["reason"]]
        assert events[0].detail["run_id"] == report.run_id
    assert json.loads((out / "synth.json").read_text()) == json.loads(json.dumps(report.as_dict()))
    assert sorted(p.name for p in out.iterdir()) == ["count-lines", "synth.json", "upper-case"]


def test_an_accepted_task_passes_validation_again(synth_run):
    report, st, out, shared_tmp = synth_run
    for a in report.accepted:
        task = load_task(a["path"])
        assert task_version(task).id == a["version"]
        v = validate_task(task, store=st, backend=LocalBackend(shared_tmp / "sandboxes"))
        assert v.passed, v.as_dict()


def test_refinement_feeds_the_failures_back(synth_run):
    report, st, out, shared_tmp = synth_run
    row = next(r for r in st.lineage("task_versions") if r["task_id"] == "upper-case")
    first, second = row["lineage"]["generator"]["attempts"]
    assert first["validation"]["passed"] is False and second["validation"]["passed"] is True
    assert any(f.startswith("oracle_solves:") for f in first["failures"])
    refine_call = st.calls(second["rollout_id"])[0]
    prompt = refine_call.messages[-1]["content"]
    assert prompt.startswith(refine_key("upper-case", 2))
    assert all(f in prompt for f in first["failures"])


def test_lineage_of_an_accepted_task_reaches_the_teacher_calls(synth_run):
    report, st, out, shared_tmp = synth_run
    rows = {r["task_id"]: r for r in st.lineage("task_versions")}
    assert set(rows) == {"count-lines", "upper-case"}   # only accepted tasks are task versions
    row = rows["count-lines"]
    gen = row["lineage"]["generator"]
    assert gen["run_id"] == report.run_id and gen["teacher_policy_version"] == "teacher:" + gen["teacher_model"]
    assert row["id"] == next(a["version"] for a in report.accepted if a["name"] == "count-lines")
    assert len(gen["teacher_rollouts"]) == 2 and len(gen["teacher_calls"]) == 2   # propose, build
    for rid, call_id in zip(gen["teacher_rollouts"], gen["teacher_calls"]):
        info = st.rollout(rid)
        assert info.metadata["purpose"] == "synth" and info.run_id == report.run_id
        assert info.policy_version_id == gen["teacher_policy_version"]
        calls = st.calls(rid)
        assert [c.id for c in calls] == [call_id]
    build = st.calls(gen["teacher_rollouts"][1])[0]
    assert json.loads(build.response_message["content"]) == COUNT   # the task was built from this answer
    assert build.messages[-1]["content"].startswith(build_key("count-lines"))
    validation = gen["validation_rollouts"]
    assert len(validation) == 3
    for rid in validation:
        assert st.rollout(rid).task_version_id == row["id"]
    assert gen["attempts"][0]["validation"]["passed"] is True


def test_the_synth_command_end_to_end(shared_tmp, monkeypatch):  # noqa: F811
    from typer.testing import CliRunner

    from openforge.cli import build_app

    conv = Conversations({propose_key("gpus", 2): [Text(json.dumps([
        {"name": "train-a-model", "summary": "Train a small network on the GPU.", "needs": ["gpu"]},
        {"name": "Bad Name!", "summary": "x", "needs": []}]))]})
    server = UpstreamServer(ScriptedUpstream(tokenizer=load_smollm2_tokenizer(), conversations=conv))
    url = server.start()
    monkeypatch.setenv("OPENFORGE_HOME", str(shared_tmp / "home"))
    monkeypatch.setenv("OPENFORGE_SANDBOX_DIR", str(shared_tmp / "sandboxes"))
    store_url = f"sqlite:///{shared_tmp / 'cli.sqlite'}"
    try:
        res = CliRunner().invoke(build_app(), ["tasks", "synth", "--topic", "gpus", "--ideas", "2", "--teacher", url,
                                               "--dialect", "vllm", "--out", str(shared_tmp / "out"),
                                               "--store", store_url, "--json"])
    finally:
        server.stop()
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["accepted"] == []
    reasons = {p["name"]: p["reason"] for p in report["pruned"]}
    assert reasons["train-a-model"] == "infeasible: needs gpu (sandboxes have no GPU)"
    assert reasons["Bad Name!"].startswith("malformed idea: name 'Bad Name!'")
    with open_store(store_url, settings=Settings(home=shared_tmp / "home")) as st:
        rid = report["pruned"][0]["rollout_id"]
        assert [e.detail["name"] for e in st.events(rid) if e.kind == "synth.pruned"] == ["train-a-model", "Bad Name!"]
        assert st.calls(rid)[0].messages[-1]["content"].startswith(propose_key("gpus", 2))


def test_the_synth_command_says_what_is_wrong(shared_tmp, monkeypatch):  # noqa: F811
    from typer.testing import CliRunner

    from openforge.cli import build_app

    monkeypatch.setenv("OPENFORGE_HOME", str(shared_tmp / "home"))
    res = CliRunner().invoke(build_app(), ["tasks", "synth", "--topic", "t", "--teacher", "http://127.0.0.1:9",
                                           "--out", str(shared_tmp / "out")])
    assert res.exit_code == 2 and "/v1/models did not answer" in res.output
    res = CliRunner().invoke(build_app(), ["tasks", "synth", "--topic", "t", "--teacher", "http://127.0.0.1:9",
                                           "--out", str(shared_tmp / "out"), "--attempts", "0"])
    assert res.exit_code == 2 and "--attempts 0" in res.output


def test_a_teacher_task_toml_naming_another_task_is_refused(tmp_path):
    from openforge.synth_prompts import TeacherAnswerError, write_task

    spec = {"instruction": "x", "files": {"tests/test.sh": "exit 0\n", "task.toml": '[task]\nid = "other"\n'}}
    with pytest.raises(TeacherAnswerError, match="names the task 'other', but the idea is 'mine'"):
        write_task(tmp_path / "mine", "mine", spec, domain="files")
    assert not (tmp_path / "mine").exists()
    spec["files"]["task.toml"] = '[task]\nid = "mine"\n'
    assert (write_task(tmp_path / "mine", "mine", spec, domain="files") / "task.toml").exists()
