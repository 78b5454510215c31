"""Judge rewards and human labels (issue 24): a rubric judge (the scripted engine behind the real recording proxy)
scores rollouts as their own recorded rollouts; its reward row names the judge's policy version, the prompt hash and
the judge's calls; a human label on the same rollout sits beside it (append-only); the export takes the source
asked for (API and ``openforge export --reward-source``); analyze's judge / verifier agreement."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from dashboards._labels import LabelError, add_label, labels
from forge_store import open_store
from forge_store.testing import Turn, agent_calls
from learner import ExportConfig, export
from learner._cli import analyze_command, export_app
from learner._judge import agreement, judge_agreement
from openforge.judge import JudgeError, Rubric, parse_score, run_judge
from proxy.engines.scripted import Conversations, ScriptedUpstream, Text, UpstreamServer, load_smollm2_tokenizer

RUBRIC = Rubric("lists-files", "Score 1 when the agent listed the files before answering, else 0.")
SCORES = {"ra": 1.0, "rb": 1.0, "rc": 0.0}   # the verifier gave ra 1, rb 0, rc 0


def _seed(tmp_path, settings) -> str:
    url = f"sqlite:///{tmp_path / 'judge.sqlite'}"
    with open_store(url, settings=settings) as st:
        st.register_task("t", domain="swe")
        st.register_policy_version("p", model_name="m")
        st.create_group("g", task_id="t", target_size=3, policy_version_id="p")
        for rid, v in (("ra", 1.0), ("rb", 0.0), ("rc", 0.0)):
            st.start_rollout(rid, group_id="g", task_id="t", policy_version_id="p")
            for rec in agent_calls(rid, [Turn([("bash", {"command": "ls"})], ["ok"]), Turn(text=f"done {rid}")],
                                   policy_version_id="p"):
                st.record_call(rec)
            st.finish_rollout(rid, "success" if v else "failure")
            st.add_reward(rid, v)
    return url


def _judge_server() -> UpstreamServer:
    conv = Conversations()
    for rid, score in SCORES.items():
        conv.add(f"Transcript of rollout {rid}:", [Text(json.dumps({"score": score, "reason": f"graded {rid}"}))])
    return UpstreamServer(ScriptedUpstream(tokenizer=load_smollm2_tokenizer(), conversations=conv))


@pytest.fixture
def judged(tmp_path, settings):
    url = _seed(tmp_path, settings)
    server = _judge_server()
    upstream = server.start()
    try:
        results = run_judge(list(SCORES), upstream=upstream, rubric=RUBRIC, store_url=url, settings=settings,
                            dialect="vllm")
    finally:
        server.stop()
    return url, {r.rollout_id: r for r in results}


def test_judge_rewards_name_policy_prompt_and_calls(judged, settings):
    url, results = judged
    with open_store(url, settings=settings) as st:
        for rid, score in SCORES.items():
            res = results[rid]
            assert res.score == score
            (row,) = [r for r in st.rewards(rid) if r.source == "judge"]
            assert row.id == res.reward_id and row.value == score
            version = row.detail["policy_version"]
            assert version.startswith("judge:") and row.verifier_version == version
            assert row.detail["prompt_hash"] == RUBRIC.prompt_hash() and row.detail["rubric"] == RUBRIC.name
            # the judge's call is stored under its own rollout, token-exact, and mentions the judged rollout
            judge_ro = st.rollout(row.detail["judge_rollout_id"])
            assert judge_ro.metadata["purpose"] == "judge" and judge_ro.metadata["judged_rollout"] == rid
            (call,) = st.calls(judge_ro.id)
            assert row.detail["judge_call_ids"] == [call.id]
            assert call.policy_version_id == version and call.token_exact
            assert f"Transcript of rollout {rid}:" in call.messages[-1]["content"]
            assert {p["id"] for p in st.lineage("policy_versions")} >= {version}


def test_judge_and_human_coexist_and_export_picks_the_source(judged, settings, tmp_path):
    url, results = judged
    with open_store(url, settings=settings) as st:
        hid = add_label(st, "ra", value=0.0, annotator="ann", tags="needs-review, shell", comment="ls only")
        with pytest.raises(LabelError, match="not a call of rollout ra"):
            add_label(st, "ra", value=1.0, annotator="ann", call_id="rb-c0")
        assert st.flush(10)
        rows = st.rewards("ra")
        assert [r.source for r in rows] == ["verifier", "judge", "human"]   # append-only: all three stay
        (lb,) = labels(rows)
        assert (lb.reward_id, lb.annotator, lb.tags, lb.comment, lb.call_id) == (hid, "ann", ("needs-review", "shell"),
                                                                                   "ls only", None)
        want = {"verifier": {"ra": 1.0, "rb": 0.0, "rc": 0.0}, "judge": SCORES,
                "human": {"ra": 0.0}}
        for source, values in want.items():
            out = tmp_path / source
            export(st, out, ExportConfig(format="verl", reward_sources=(source,), min_group_size=1), record=False)
            got = {r["rollout_id"]: (r["reward_score"], r["reward_source"])
                   for r in pq.read_table(out / "trajectories-00000.parquet").to_pylist()}
            assert got == {rid: (v, source) for rid, v in values.items()}
        # --where on the human labels' tags: any tag matches; no label is null
        for where, want_ids in (("tag = 'needs-review'", {"ra"}), ("tag in ('shell', 'x')", {"ra"}),
                                ("tag like 'needs%'", {"ra"}), ("tag is null", {"rb", "rc"}),
                                ("not tag = 'shell'", {"rb", "rc"})):
            out = tmp_path / f"where-{len(list(tmp_path.iterdir()))}"
            export(st, out, ExportConfig(format="verl", where=where, allow_partial_groups=True, min_group_size=1),
                   record=False)
            got = {r["rollout_id"] for r in pq.read_table(out / "trajectories-00000.parquet").to_pylist()}
            assert got == want_ids, where
    r = CliRunner().invoke(export_app, ["--format", "verl", "--reward-source", "judge", "--store", url,
                                        "--out", str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert manifest["config"]["reward_sources"] == ["judge"]
    got = {r["rollout_id"]: r["reward_source"] for r in
           pq.read_table(tmp_path / "cli" / "trajectories-00000.parquet").to_pylist()}
    assert got == {"ra": "judge", "rb": "judge", "rc": "judge"}
    r = CliRunner().invoke(export_app, ["--reward-source", "jduge", "--store", url, "--out", str(tmp_path / "bad")])
    assert r.exit_code == 2 and "--reward-source 'jduge'" in r.output


def test_agreement_between_judge_and_verifier(judged, settings):
    url, _ = judged
    with open_store(url, settings=settings) as st:
        a = judge_agreement(st, ["ra", "rb", "rc"])
    # ra agree (1, 1), rb disagree (0, 1), rc agree (0, 0)
    assert a["n"] == 3 and a["agreement"] == pytest.approx(2 / 3)
    assert a["mean_abs_diff"] == pytest.approx(1 / 3) and a["pearson"] == pytest.approx(0.5)
    assert a["kappa"] == pytest.approx(0.4)
    app = typer.Typer()
    app.command()(analyze_command)
    r = CliRunner().invoke(app, ["--store", url], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "Judge vs verifier agreement" in r.output and "│ 3 │     0.667 │         0.333 │   0.500 │ 0.400" in r.output
    assert agreement([])["agreement"] is None and agreement([(1.0, 1.0), (1.0, 0.0)])["pearson"] is None


def test_an_unreadable_judgement_is_an_error():
    assert parse_score('```json\n{"score": 0.5, "reason": "half"}\n```') == (0.5, "half")
    with pytest.raises(JudgeError, match="expected a JSON object"):
        parse_score("I think it is fine")
    with pytest.raises(JudgeError, match="outside 0..1"):
        parse_score('{"score": 7}')


def test_an_unreadable_judgement_writes_no_reward_and_ends_the_judge_rollout_failed(tmp_path, settings):
    url = _seed(tmp_path, settings)
    conv = Conversations()
    conv.add("Transcript of rollout ra:", [Text("Looks fine to me.")])
    server = UpstreamServer(ScriptedUpstream(tokenizer=load_smollm2_tokenizer(), conversations=conv))
    upstream = server.start()
    try:
        with pytest.raises(JudgeError, match="expected a JSON object"):
            run_judge(["ra"], upstream=upstream, rubric=RUBRIC, store_url=url, settings=settings, dialect="vllm")
    finally:
        server.stop()
    with open_store(url, settings=settings) as st:
        assert [r.source for r in st.rewards("ra")] == ["verifier"]
        (judge_ro,) = [r for r in st.iter_rollouts() if (r.metadata or {}).get("judged_rollout") == "ra"]
        assert judge_ro.outcome == "failure" and "Looks fine to me." in judge_ro.outcome_detail
        assert len(st.calls(judge_ro.id)) == 1   # the unreadable answer is recorded all the same


def test_judge_command(tmp_path, settings):
    from openforge.judge_cli import judge_command

    url = _seed(tmp_path, settings)
    with open_store(url, settings=settings) as st:   # a synthesis teacher's call: a rollout without a task
        st.start_rollout("teacher-call", policy_version_id="p", metadata={"purpose": "synth"})
        for rec in agent_calls("teacher-call", [Turn(text="[...]")], policy_version_id="p"):
            st.record_call(rec)
        st.finish_rollout("teacher-call", "success")
    rubric = tmp_path / "lists-files.txt"
    rubric.write_text(RUBRIC.text)
    server = _judge_server()
    upstream = server.start()
    app = typer.Typer()
    app.command()(judge_command)
    try:
        r = CliRunner().invoke(app, ["--judge", upstream, "--rubric", str(rubric), "--where", "id in ('ra', 'rc')",
                                     "--dialect", "vllm", "--store", url],
                               env={"OPENFORGE_HOME": str(tmp_path / "home")})
        # with neither --rollout nor --where: every finished rollout of a task (not the teacher's, nor the judge
        # rollouts just made)
        everything = CliRunner().invoke(app, ["--judge", upstream, "--rubric", str(rubric), "--dialect", "vllm",
                                              "--store", url], env={"OPENFORGE_HOME": str(tmp_path / "home")})
    finally:
        server.stop()
    assert r.exit_code == 0, r.output
    assert "ra: 1 (graded ra)" in r.output and "rc: 0 (graded rc)" in r.output and "rb:" not in r.output
    assert everything.exit_code == 0, everything.output
    assert sorted(line.split(":")[0] for line in everything.output.splitlines() if ": " in line) == ["ra", "rb", "rc"]
    with open_store(url, settings=settings) as st:
        rows = [x for x in st.rewards("ra") if x.source == "judge"]
        assert len(rows) == 2   # judged twice, two rows
        assert {(x.detail["rubric"], x.detail["prompt_hash"]) for x in rows} == {("lists-files", RUBRIC.prompt_hash())}
        assert st.rewards("teacher-call") == []
    r = CliRunner().invoke(app, ["--judge", "http://127.0.0.1:9", "--rubric", str(tmp_path / "nope.txt"),
                                 "--store", url])
    assert r.exit_code == 2 and "no such file" in " ".join(r.output.split())
