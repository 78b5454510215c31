"""``openforge analyze``'s fast path (batched light reads, cached verdicts, streaming tables, worker processes) pinned
to the straightforward one (``Store.calls`` of each rollout, ``rollout_rubrics``, lists of facts grouped per slice)
on a varied store, on real SQLite and PostgreSQL."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from datetime import timedelta

import pytest

from forge_store import RolloutFilter, open_store
from forge_store._call_summaries import call_summaries
from forge_store.testing import REACT_TOOLS, T0, Turn, agent_calls
from learner._analysis import SLICES, analyze, collect
from learner._analysis_config import CATEGORIES, RubricConfig
from learner._rubric_cache import RubricCache
from learner._rubrics import rollout_rubrics
from learner._stats import pass_at_k, pass_hat_k, percentile

CODEX_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
               for n in ("exec_command", "apply_patch", "shell")]
CLAUDE_TOOLS = [{"name": "Edit", "input_schema": {"type": "object", "required": ["file_path"],
                                                   "properties": {"file_path": {"type": "string"}}}},
                {"name": "Grep", "input_schema": {"type": "object"}}, {"name": "Read"}]
CALLS = [("bash", {"command": "ls -la"}), ("bash", {"command": "python -m pytest -q"}),
         ("bash", {"command": "cat src/a.py"}), ("bash", {"command": "echo x > src/b.py && wc -l src/b.py"}),
         ("bash", {"command": "sed -i 's/a/b/' src/a.py"}), ("bash", {"command": "grep -n b src/a.py"}),
         ("bash", {"command": ["tee", "-a", "log.txt"]}), ("bash", "{not json"), ("bash", "[1, 2]"), ("bash", ""),
         ("read_file", {"path": "src/a.py"}), ("read_file", {"path": 5}), ("write_file", {"path": "src/a.py"}),
         ("write_file", {"path": "./src/a.py", "content": "x"}), ("deploy", {"x": 1}),
         ("exec_command", {"cmd": "make test"}), ("shell", {"command": "touch notes.md"}),
         ("apply_patch", {"input": "*** Begin Patch\n*** Update File: src/a.py\n*** Move to: src/c.py\n*** End Patch"}),
         ("apply_patch", "*** Begin Patch\n*** Add File: new.py\n*** End Patch"),
         ("Edit", {"file_path": "src/a.py"}), ("Edit", {}), ("Grep", {"path": "src/c.py"}), ("Read", {"file_path": "x"})]
RESULTS = ["ok", "src\ntests\n", "Traceback (most recent call last):\n  ValueError: bad\nexit code 1",
           "Error: no such thing", "error\nmore", "bash: foo: command not found", "EXİT CODE 2", "Return Code: 0",
           "ſtatus fine", "KeyError: 'x'", "all 3 passed", "permission denied (lowercase)", "Permission denied",
           "a.py b.py notes.md\n"]
INSTRUCTIONS = ["Fix the bug.", "Fix src/a.py; keep log.txt as it is."]  # names a tool call may take from the prompt


UNPARSED = '<tool_call>{"name": "bash", "arguments": {"command": "sed -i \'s/a/b/g" x.md"}}</tool_call>'


def _turns(rng: random.Random) -> list[Turn]:
    turns = []
    for _ in range(rng.randint(0, 9)):
        calls = [rng.choice(CALLS) for _ in range(rng.choice((1, 1, 1, 2, 3)))]
        results = [rng.choice(RESULTS) for _ in range(len(calls) - (rng.random() < 0.15))]
        turns.append(Turn(calls, results))
    # the last answer: text, or a tool call the server's parser could not read (it came back as text)
    return turns + [Turn(text=rng.choice(["done", UNPARSED]))] if turns or rng.random() < 0.5 else turns


def _varied(st, n: int = 60, seed: int = 7) -> None:
    rng = random.Random(seed)
    harnesses = [st.register_harness("react", "1.0"), st.register_harness("codex", "0.5"), st.register_harness("cc")]
    for pv in ("pv1", "pv2"):
        st.register_policy_version(pv, model_name="m")
    st.register_task("t0", domain="swe", metadata={"required_tools": ["bash", "write", "Grep"], "reference_steps": 4})
    st.register_task("t1", domain="web", metadata={"reference_steps": 30})
    st.register_task("t2")
    for r in range(n):
        rid, start = f"r{r:03d}", T0 + timedelta(minutes=r)
        task, h = f"t{r % 4}", rng.choice(harnesses + [None])
        tools = rng.choice([REACT_TOOLS, CODEX_TOOLS, CLAUDE_TOOLS, [], None])
        st.start_rollout(rid, task_id=task, policy_version_id=rng.choice(["pv1", "pv2", None]), harness_id=h,
                         started_at=start)
        for rec in agent_calls(rid, _turns(rng), tools=tools if tools is not None else [], started_at=start,
                               instruction=rng.choice(INSTRUCTIONS)):
            st.record_call(rec)
        if r % 17 == 5:
            continue  # still running: not analyzed
        outcome = rng.choice(["success", "failure", "policy_timeout", "harness_error", "infra_error", "cancelled"])
        st.finish_rollout(rid, outcome, ended_at=start + timedelta(seconds=rng.randint(1, 900)))
        if rng.random() < 0.8:
            st.add_reward(rid, rng.choice([0.0, 0.5, 1.0]), source=rng.choice(["verifier", "judge"]))
        if rng.random() < 0.2:
            st.add_exclusion(rng.choice(["infra_error", "no_reward", "filtered"]), rollout_id=rid)
    assert st.flush(30)


@pytest.fixture
def st(store_url, settings):
    with open_store(store_url, settings=settings) as store:
        _varied(store)
        yield store


# ---- the straightforward path ----------------------------------------------------------------------------------
def _reference_facts(st, config: RubricConfig, sources=None) -> list[dict]:
    tasks = {t["id"]: t for t in st.lineage("tasks")}
    harnesses = {h["id"]: h for h in st.lineage("harnesses")}
    infos = [i for i in st.iter_rollouts(RolloutFilter(finished=True)) if i.status == "finished"]
    rewards = st.latest_rewards([i.id for i in infos], sources=sources)
    out = []
    for info in infos:
        task, h = tasks.get(info.task_id) or {}, harnesses.get(info.harness_id)
        value = rewards[info.id].value if info.id in rewards else None
        out.append({"info": info, "reward": value, "domain": task.get("domain") or "(none)",
                    "harness": f"{h['name']}@{h['version']}" if h and h.get("version") else (h["name"] if h else "(none)"),
                    "passed": value >= config.pass_threshold if value is not None else info.outcome == "success",
                    "latency_s": (info.ended_at - info.started_at).total_seconds(),
                    "rubrics": rollout_rubrics(st.calls(info.id), task_metadata=task.get("metadata"), config=config,
                                               rollout_id=info.id)})
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _reference_tables(facts: list[dict], by: str, excluded: dict, config: RubricConfig, ks=(1, 5)) -> dict:
    groups = defaultdict(list)
    for f in facts:
        groups[(f["info"].policy_version_id or "(none)") if by == "policy_version" else f[by]].append(f)
    out = {"summary": [], "behaviour": [], "categories": [], "tools": [], "exclusions": []}
    for key, fs in sorted(groups.items()):
        graded = [f for f in fs if f["info"].outcome in config.graded_outcomes]
        row = {by: key, "rollouts": len(fs),
               "success_rate": sum(f["passed"] for f in graded) / len(graded) if graded else None}
        for k in ks:
            per = defaultdict(lambda: [0, 0])
            for f in graded:
                per[f["info"].task_id or "(none)"][0] += 1
                per[f["info"].task_id or "(none)"][1] += f["passed"]
            row[f"pass@{k}"] = _mean(pass_at_k(n, c, k) for _, (n, c) in sorted(per.items()))
            row[f"pass^{k}"] = _mean(pass_hat_k(n, c, k) for _, (n, c) in sorted(per.items()))
        outcomes, lat = Counter(f["info"].outcome for f in fs), [f["latency_s"] for f in fs]
        row.update({"latency_p50_s": percentile(lat, 50), "latency_p95_s": percentile(lat, 95),
                    "timeout_rate": outcomes["policy_timeout"] / len(fs),
                    "infra_error_rate": outcomes["infra_error"] / len(fs),
                    "exclusion_rate": sum(f["info"].id in excluded for f in fs) / len(fs)})
        out["summary"].append(row)
        rs = [f["rubrics"] for f in fs]
        calls, wrote = sum(r.n_tool_calls for r in rs), [r for r in rs if r.wrote]
        failed = sum(r.failed for r in rs)
        out["behaviour"].append({
            by: key, "rollouts": len(rs), "tool_calls": calls, "tool_calls_per_rollout": calls / len(rs),
            "shell_share": sum(r.category_counts.get("shell", 0) for r in rs) / calls if calls else None,
            "format_ok_rate": sum(r.format_ok for r in rs) / calls if calls else None, "failed_tool_calls": failed,
            "recovery_rate": sum(r.recovered for r in rs) / failed if failed else None,
            "self_verification_rate": sum(bool(r.self_verified) for r in wrote) / len(wrote) if wrote else None,
            "inspect_first_rate": _mean(float(r.inspected_first) for r in rs if r.inspected_first is not None),
            "made_up_name_rate": (sum(r.made_up for r in rs) / sum(r.names for r in rs)
                                  if sum(r.names for r in rs) else None),
            "tool_coverage": _mean(r.coverage for r in rs),
            "step_efficiency": _mean(f["rubrics"].efficiency for f in fs if f["passed"])})
        tools, cats = Counter(), Counter()
        for r in rs:
            tools.update(r.tool_counts)
            cats.update(r.category_counts)
        out["categories"].append({by: key, **{c: cats[c] / sum(cats.values()) if cats else None for c in CATEGORIES}})
        out["tools"] += [{by: key, "tool": t, "category": RubricConfig().category(t), "calls": n,
                          "share": n / sum(tools.values())} for t, n in tools.most_common()]
        reasons = Counter(x for f in fs for x in excluded.get(f["info"].id, ()))
        out["exclusions"] += [{by: key, "reason": x, "rollouts": n, "rate": n / len(fs)} for x, n in sorted(reasons.items())]
    return out


# ---- the pins --------------------------------------------------------------------------------------------------
def test_cached_rubrics_are_those_of_full_reads(st):
    config = RubricConfig()
    ref = _reference_facts(st, config)
    assert len(ref) > 40 and sum(f["rubrics"].n_tool_calls for f in ref) > 150
    assert {f["rubrics"].failed > 0 for f in ref} == {True, False}  # the store exercises every rule
    assert {f["rubrics"].self_verified for f in ref} == {True, False, None}
    assert {f["rubrics"].unparsed for f in ref} == {0, 1}
    assert {f["rubrics"].inspected_first for f in ref} == {True, False, None}
    assert {(f["rubrics"].made_up > 0, f["rubrics"].names > f["rubrics"].made_up) for f in ref} >= {
        (True, True), (False, True), (True, False)}   # made-up names, names seen before, and both
    light = st.call_summaries([f["info"].id for f in ref])
    for cache in (RubricCache(config), RubricCache(config, max_entries=7, max_chars=400)):  # tiny: often cleared
        for f in ref:
            rid = f["info"].id
            assert cache.rubrics(light[rid], task_metadata=_meta(st, f), rollout_id=rid) == f["rubrics"], rid
    for f in ref:
        rid = f["info"].id
        assert rollout_rubrics(light[rid], task_metadata=_meta(st, f), config=config, rollout_id=rid) == f["rubrics"]


def _meta(st, f):
    return ({t["id"]: t for t in st.lineage("tasks")}.get(f["info"].task_id) or {}).get("metadata")


def test_range_scan_reads_what_key_lookups_read(st):
    ids = [i.id for i in st.iter_rollouts()]
    with st.engine.connect() as conn:
        by_range = call_summaries(conn, ids, chunk=9)
        by_key = call_summaries(conn, ids, chunk=9, margin=0, width=0)  # every range skipped: look-ups only
        tight = call_summaries(conn, ids, chunk=9, margin=0)  # messages just before a chunk's calls: looked up
    assert by_range == by_key == tight
    assert by_range == st.call_summaries(ids)


@pytest.mark.parametrize("workers", [1, 2])
def test_facts_and_tables_match_the_straightforward_path(st, workers):
    config = RubricConfig()
    ref = _reference_facts(st, config)
    facts = collect(st, batch_size=4, workers=workers)
    assert [(f.info, f.reward, f.passed, f.harness, f.domain, f.latency_s, f.rubrics) for f in facts] == \
        [(f["info"], f["reward"], f["passed"], f["harness"], f["domain"], f["latency_s"], f["rubrics"]) for f in ref]
    excluded = st.exclusion_reasons()
    for by in SLICES:
        assert analyze(st, by=by, ks=(1, 2, 5), workers=workers) == _reference_tables(ref, by, excluded, config,
                                                                                     ks=(1, 2, 5)), by
    judged = _reference_facts(st, config, sources=("judge",))
    assert analyze(st, reward_sources=["judge"], workers=workers) == _reference_tables(judged, "policy_version",
                                                                                       excluded, config)


def test_pattern_prefilters_never_change_a_verdict():
    rng = random.Random(3)
    pieces = ["exit", "EXIT", "Exİt", "exıt", "code", " ", "_", "1", "0", "Error", "error: ", "ValueError: ", "Re",
              "turn", "ſ", "K", "\n", "Traceback (most recent call last)", "denied", "not found", "x", "é", "Σ"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for _ in range(20000)]
    config = RubricConfig(error_patterns=RubricConfig().error_patterns + (
        r"(?i)status|KELVIN", r"(?i:sign)al \d", r"(?x) exit \s+ now", r"(Re|re)turn(?=ed)", r"a{2,}|b+c"))
    for attr in ("error_patterns", "readback_patterns", "test_run_patterns", "shell_write_patterns"):
        pats = config.patterns(attr)
        for t in texts + RESULTS + [json.dumps(c[1]) for c in CALLS]:
            assert config.matches_any(attr, t) == any(p.search(t) for p in pats), (attr, t)
