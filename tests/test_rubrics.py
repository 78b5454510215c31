"""Behaviour rubrics on hand-built trajectories written through the Store API (real SQLite and PostgreSQL)."""

from __future__ import annotations

import itertools
from datetime import timedelta
from fractions import Fraction

import pytest

from forge_store import open_store
from forge_store.testing import T0, Turn, agent_calls
from learner._analysis import analyze, collect, summary_rows
from learner._analysis_config import RubricConfig, RubricConfigError
from learner._rubrics import rollout_rubrics, schema_problem, tool_steps
from learner._stats import pass_at_k, pass_at_k_exact, pass_hat_k_exact, percentile

TRACE = "Traceback (most recent call last):\n  File \"t.py\"\nAssertionError\nexit code 1"

GOOD = [  # fails once, recovers with a different action, verifies its write by reading it back
    Turn([("bash", {"command": "ls"})], ["src\n"]),
    Turn([("read_file", {"path": "src/app.py"})], ["def f(): pass\n"]),
    Turn([("bash", {"command": "python -m pytest -q"})], [TRACE]),
    Turn([("write_file", {"path": "src/app.py", "content": "def f(): return 1\n"})], ["ok"]),
    Turn([("bash", {"command": "cat src/app.py"})], ["def f(): return 1\n"]),
    Turn(text="done"),
]

BAD = [  # malformed arguments, a repeated failure, an undeclared tool, a write never read back
    Turn([("bash", "{not json")], ["Error: could not parse arguments"]),
    Turn([("bash", "{not json")], ["Error: could not parse arguments"]),
    Turn([("read_file", {"path": 5})], ["ok"]),
    Turn([("write_file", {"path": "out.txt"})], ["ok"]),
    Turn([("deploy", {"x": 1})], ["deployed"]),
    Turn([("write_file", {"path": "b.txt", "content": "y"})], ["ok"]),
    Turn([("read_file", {"path": "b.txt"})], ["y"]),
    Turn(text="done"),
]


def _write(st, rid, turns, *, task="t1", outcome="success", reward=1.0, latency_s=10.0, policy="pv1",
           harness=None, start=T0, **kw):
    st.start_rollout(rid, task_id=task, policy_version_id=policy, harness_id=harness, started_at=start)
    for rec in agent_calls(rid, turns, started_at=start, policy_version_id=policy, **kw):
        st.record_call(rec)
    st.finish_rollout(rid, outcome, ended_at=start + timedelta(seconds=latency_s))
    if reward is not None:
        st.add_reward(rid, reward)


@pytest.fixture
def st(store_url, settings):
    with open_store(store_url, settings=settings) as store:
        yield store


def test_every_rubric_on_known_trajectories(st):
    st.register_task("t1", domain="swe", metadata={"required_tools": ["bash", "write_file", "Grep"], "reference_steps": 3})
    st.register_task("t2", domain="swe", metadata={"required_tools": ["shell", "search"], "reference_steps": 10})
    _write(st, "good", GOOD, task="t1")
    _write(st, "bad", BAD, task="t2")
    _write(st, "quiet", [Turn(text="nothing to do")], task="t3")
    tasks = {t["id"]: t["metadata"] for t in st.lineage("tasks")}

    good = rollout_rubrics(st.calls("good"), task_metadata=tasks["t1"])
    assert good.n_calls == 6 and good.n_tool_calls == 5
    assert good.tool_counts == {"bash": 3, "read_file": 1, "write_file": 1}
    assert good.category_counts == {"shell": 3, "read": 1, "write": 1}
    assert good.shell_share == pytest.approx(3 / 5)
    assert good.format_ok == 5 and good.format_rate == 1.0
    assert (good.failed, good.recovered) == (1, 1)
    assert good.wrote and good.self_verified is True
    assert good.coverage == pytest.approx(2 / 3)
    assert good.efficiency == pytest.approx(3 / 6)

    bad = rollout_rubrics(st.calls("bad"), task_metadata=tasks["t2"])
    steps = tool_steps(st.calls("bad"))
    assert [s.format_problem for s in steps] == [
        "arguments are not valid JSON", "arguments are not valid JSON", "arguments.path is int, schema wants string",
        "arguments lacks required key 'content'", "tool 'deploy' is not declared in the call's tool schema", None, None]
    assert bad.format_ok == 2 and bad.n_tool_calls == 7
    assert bad.category_counts["service"] == 1 and bad.shell_share == pytest.approx(2 / 7)
    # the first failure is repeated verbatim (not recovered); the second is followed by a different, working call
    assert (bad.failed, bad.recovered) == (2, 1)
    assert bad.self_verified is False  # out.txt was never read back
    assert bad.coverage == pytest.approx(1 / 2)  # "shell" category called, "search" not
    assert bad.efficiency == 1.0  # 10 reference steps / 8 taken, capped

    # the batched light reads the analysis and dashboards use give the same answers as full Store.calls reads
    light = st.call_summaries(["good", "bad", "quiet"])
    assert rollout_rubrics(light["good"], task_metadata=tasks["t1"]) == good
    assert rollout_rubrics(light["bad"], task_metadata=tasks["t2"]) == bad

    quiet = rollout_rubrics(st.calls("quiet"))
    assert (quiet.n_tool_calls, quiet.shell_share, quiet.self_verified, quiet.coverage, quiet.efficiency,
            quiet.recovery_rate, quiet.format_rate) == (0, None, None, None, None, None, None)


def test_codex_and_claude_code_tools(st):
    codex_tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
                   for n in ("exec_command", "apply_patch")]
    patch = "*** Begin Patch\n*** Update File: src/x.py\n@@\n-a\n+b\n*** End Patch"
    _write(st, "codex", [Turn([("exec_command", {"cmd": ["bash", "-lc", "echo hi > notes.md"]})], [""]),
                         Turn([("apply_patch", {"input": patch})], ["Done"]),
                         Turn([("exec_command", {"cmd": "pytest -q"})], ["1 passed"]), Turn(text="ok")],
           tools=codex_tools)
    cc_tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}}
        for n in ("Write", "Read", "Edit")] + [{"type": "function", "function": {"name": "Grep"}}]
    _write(st, "claude", [Turn([("Write", {"file_path": "/w/a.py", "content": "x"})], ["ok"]),
                          Turn([("Edit", {"file_path": "/w/b.py"})], ["ok"]),
                          Turn([("Read", {"file_path": "/w/a.py"})], ["x"]),
                          Turn([("Grep", {"pattern": "x", "path": "/w/b.py"})], ["b.py:1"]), Turn(text="ok")],
           tools=cc_tools)
    codex = rollout_rubrics(st.calls("codex"))
    assert codex.category_counts == {"shell": 2, "write": 1} and codex.self_verified is True
    steps = tool_steps(st.calls("codex"))
    assert [s.name for s in steps] == ["exec_command", "apply_patch", "exec_command"]
    claude = rollout_rubrics(st.calls("claude"))
    assert claude.category_counts == {"write": 2, "read": 1, "search": 1}
    assert claude.self_verified is True and claude.format_ok == 4
    # without the Grep read-back, b.py stays unverified
    assert rollout_rubrics(st.calls("claude")[:3]).self_verified is False


def test_pass_at_k_and_rates_per_slice(st):
    st.register_task("t1")
    st.register_task("t2")
    runs = [("success", 1.0), ("success", 1.0), ("failure", 0.0), ("policy_timeout", 0.0),
            ("success", 0.5),  # verifier said success but the reward is below the pass threshold
            ("infra_error", None), ("cancelled", None)]
    for i, (outcome, reward) in enumerate(runs):
        _write(st, f"a{i}", [Turn(text="x")], task="t1", outcome=outcome, reward=reward, latency_s=10.0 * (i + 1))
    for i in range(3):
        _write(st, f"b{i}", [Turn(text="x")], task="t2", policy="pv1", latency_s=5.0)
    st.add_exclusion("infra_error", rollout_id="a5")
    st.add_exclusion("no_reward", rollout_id="a6")
    st.add_exclusion("no_reward", rollout_id="a6")  # a second export excluded it again: still one rollout

    report = analyze(st, by="policy_version", ks=(1, 2, 5))
    (row,) = report["summary"]
    assert row["rollouts"] == 10 and row["success_rate"] == pytest.approx(5 / 8)
    # t1: n=5 graded, c=2; t2: n=3, c=3
    assert row["pass@1"] == pytest.approx((Fraction(2, 5) + 1) / 2)
    assert row["pass@2"] == pytest.approx((1 - Fraction(3, 10) + 1) / 2)
    assert row["pass^2"] == pytest.approx((Fraction(1, 10) + 1) / 2)
    assert row["pass@5"] == pytest.approx(1.0)  # only t1 has 5 graded rollouts
    assert row["pass^5"] == pytest.approx(0.0)
    assert row["timeout_rate"] == pytest.approx(1 / 10) and row["infra_error_rate"] == pytest.approx(1 / 10)
    assert row["exclusion_rate"] == pytest.approx(2 / 10)
    assert {(r["reason"], r["rollouts"]) for r in report["exclusions"]} == {("infra_error", 1), ("no_reward", 1)}
    lat = [10.0 * (i + 1) for i in range(7)] + [5.0] * 3
    assert row["latency_p50_s"] == pytest.approx(percentile(lat, 50)) and row["latency_p50_s"] == pytest.approx(25.0)
    assert row["latency_p95_s"] == pytest.approx(60.0 + 0.55 * 10)  # rank 8.55 of 0..9


def test_slices_by_harness_and_domain(st):
    h1, h2 = st.register_harness("react", "1.0"), st.register_harness("codex", "0.5")
    st.register_task("t1", domain="swe")
    st.register_task("t2", domain="web")
    _write(st, "r1", GOOD, harness=h1, task="t1")
    _write(st, "r2", BAD, harness=h2, task="t2", outcome="failure", reward=0.0)
    facts = collect(st)
    by_h = {r["harness"]: r for r in summary_rows(facts, "harness")}
    assert set(by_h) == {"react@1.0", "codex@0.5"} and by_h["react@1.0"]["success_rate"] == 1.0
    by_d = {r["domain"]: r for r in analyze(st, by="domain")["behaviour"]}
    assert by_d["swe"]["recovery_rate"] == 1.0 and by_d["web"]["recovery_rate"] == 0.5
    assert by_d["web"]["format_ok_rate"] == pytest.approx(2 / 7)


@pytest.mark.parametrize("n", range(0, 7))
def test_pass_at_k_matches_enumeration(n):
    """The estimators equal the fraction of k-subsets with at least one (resp. only) passing attempts."""
    for c in range(n + 1):
        attempts = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(attempts, k))
            assert pass_at_k_exact(n, c, k) == Fraction(sum(any(s) for s in subsets), len(subsets))
            assert pass_hat_k_exact(n, c, k) == Fraction(sum(all(s) for s in subsets), len(subsets))
        assert pass_at_k(n, c, n + 1) is None
    assert pass_at_k_exact(10, 3, 4) == 1 - Fraction(35, 210)


def test_bad_inputs_say_what_to_do():
    with pytest.raises(ValueError, match="need k >= 1"):
        pass_at_k(3, 1, 0)
    with pytest.raises(RubricConfigError, match="in categories 'shell' and 'read'"):
        RubricConfig(categories={"shell": ("bash",), "read": ("bash",)})
    with pytest.raises(RubricConfigError, match="keys \\['colour'\\] unknown"):
        RubricConfig.from_dict({"colour": "red"})
    with pytest.raises(RubricConfigError, match="not a valid regex"):
        RubricConfig(error_patterns=("(",))
    assert schema_problem({"a": "x"}, {"type": "object", "properties": {"a": {"enum": ["y"]}}}) == \
        "arguments.a = 'x' is not one of ['y']"


def test_toml_config_moves_tools_between_categories(tmp_path):
    path = tmp_path / "rubrics.toml"
    path.write_text('pass_threshold = 0.5\nerror_patterns = ["FAILED"]\n[categories]\nread = ["Glob", "Read"]\n'
                    'service = ["deploy"]\n')
    cfg = RubricConfig.from_toml(path)
    assert cfg.category("Glob") == "read" and cfg.category("Grep") == "search" and cfg.category("bash") == "shell"
    assert cfg.pass_threshold == 0.5 and cfg.error_patterns == ("FAILED",)
    with pytest.raises(RubricConfigError, match="no such file"):
        RubricConfig.from_toml(tmp_path / "missing.toml")


@pytest.mark.parametrize(("first", "looks"), [
    (("bash", {"command": "tail -c 1 notes.txt | wc -l"}), True),   # the careful teacher's look
    (("bash", {"command": "ls data8 && cat a.txt"}), True),
    (("bash", {"command": "find . -name a.txt"}), True),
    (("bash", {"command": "cat a.txt 2>/dev/null > /dev/null"}), True),
    (("bash", {"command": "wc -l < a.txt > n.txt"}), False),
    (("bash", {"command": "sed -i 's/a/b/' f"}), False),
    (("bash", {"command": "mkdir -p d && cp a d/"}), False),
    (("read_file", {"path": "a.txt"}), True),
    (("Grep", {"pattern": "x"}), True),
    (("bash", {"command": "echo hi >> a.txt"}), False),               # a write the write patterns name
    (("bash", {"command": "mv jungle_49.txt data8/"}), False),        # changes the write patterns do not name
    (("bash", {"command": "mkdir -p data8"}), False),
    (("bash", {"command": "rm -f old.txt"}), False),
    (("bash", {"command": "git commit -am wip"}), False),
    (("bash", {"command": "pip install requests"}), False),
    (("bash", '{"command": "mkdir data8'), False),                   # unparsed arguments: read as written
    (("write_file", {"path": "a.txt", "content": "x"}), False),
    (("deploy", {"to": "prod"}), False),                              # a service tool acts
])
def test_inspect_first_is_what_the_first_tool_call_does(st, first, looks):
    name, args = first
    _write(st, "r", [Turn([(name, args)], ["ok"]), Turn([("bash", {"command": "mv a b"})], [""]), Turn(text="done")])
    assert rollout_rubrics(st.calls("r")).inspected_first is looks


def test_inspect_first_rate_in_the_tables_and_its_patterns_configurable(st, tmp_path):
    _write(st, "look", [Turn([("bash", {"command": "wc -l a.txt"})], ["1"]), Turn(text="done")])
    _write(st, "act", [Turn([("bash", {"command": "cp a b"})], [""]), Turn(text="done")])
    _write(st, "act2", [Turn([("bash", {"command": "echo x > b"})], [""]), Turn(text="done")])
    _write(st, "quiet", [Turn(text="nothing to do")])   # no tool call: not in the rate
    assert rollout_rubrics(st.calls("quiet")).inspected_first is None
    row = analyze(st)["behaviour"][0]
    assert row["inspect_first_rate"] == pytest.approx(1 / 3)
    path = tmp_path / "rubrics.toml"   # a team whose `cp` only ever copies into a scratch folder says so
    path.write_text('shell_change_patterns = ["\\\\bmv\\\\s"]\n')
    cfg = RubricConfig.from_toml(path)
    assert rollout_rubrics(st.calls("act"), config=cfg).inspected_first is True
    assert rollout_rubrics(st.calls("act2"), config=cfg).inspected_first is False   # the write patterns still count
    with pytest.raises(RubricConfigError, match="shell_change_patterns: '\\(' is not a valid regex"):
        RubricConfig(shell_change_patterns=("(",))


def test_made_up_names_are_names_nothing_shown_before_held(st):
    instruction = "Count the lines in rocket_60.txt and write the number to out_1.txt."
    turns = [
        Turn([("bash", {"command": "wc -l < rocket_28.txt > out_1.txt"})], ["bash: rocket_28.txt: No such file"]),
        Turn([("bash", {"command": "ls"})], ["notes.md\nrocket_60.txt\n"]),
        Turn([("read_file", {"path": "misc/notes.md"})], ["x"]),          # named by a tool result: seen
        Turn([("bash", {"command": "cat rocket_28.txt out_1.txt"})], [""]),  # coined before: counted once
        Turn([("bash", '{"command": "cat zz.txt')], ["Error: could not parse arguments"]),  # raw text read
        Turn(text="done with rocket_61.txt"),                               # an answer's text is no tool call
    ]
    _write(st, "r", turns, instruction=instruction)
    full = rollout_rubrics(st.calls("r"))
    assert (full.names, full.made_up) == (6, 2) and full.made_up_rate == pytest.approx(2 / 6)
    assert rollout_rubrics(st.call_summaries(["r"])["r"]) == full   # the light reads see what the prompts showed
    _write(st, "copied", [Turn([("bash", {"command": "wc -l < rocket_60.txt > out_1.txt"})], ["1"]),
                          Turn(text="done")], instruction=instruction)
    _write(st, "quiet", [Turn([("bash", {"command": "ls -la"})], ["total 0"]), Turn(text="done")])
    assert (rollout_rubrics(st.calls("copied")).made_up, rollout_rubrics(st.calls("quiet")).made_up_rate) == (0, None)
    row = analyze(st)["behaviour"][0]
    assert row["made_up_name_rate"] == pytest.approx(2 / 8)


def test_name_patterns_are_configurable(st, tmp_path):
    _write(st, "r", [Turn([("bash", {"command": "cat Makefile data.txt"})], ["x"]), Turn(text="done")])
    assert rollout_rubrics(st.calls("r")).names == 1          # the default pattern wants an extension
    path = tmp_path / "rubrics.toml"
    path.write_text('name_patterns = ["\\\\b(?:Makefile|[\\\\w-]+\\\\.txt)\\\\b"]\n')
    cfg = RubricConfig.from_toml(path)
    assert (lambda r: (r.names, r.made_up))(rollout_rubrics(st.calls("r"), config=cfg)) == (2, 2)
    with pytest.raises(RubricConfigError, match="name_patterns: '\\[' is not a valid regex"):
        RubricConfig(name_patterns=("[",))
