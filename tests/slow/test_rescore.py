"""Re-scoring stored rollouts under policy versions, end to end on the CPU (issue 34).

Real calls recorded through the proxy from the CPU vLLM engine (float32) under ``base`` (tests/rescore_rig.py);
a second version trained from them by one real GRPO step. Then:

* self-consistency: the Hugging Face scorer re-scoring ``base``'s calls under ``base`` gives ratios in [0.99, 1.01]
  (token-exact end to end), and ``openforge rescore`` says so;
* a re-score killed (SIGKILL) after its first stored batch resumes where it stopped, and a re-score run again
  writes nothing;
* the step's shared start (keys and values of a common start reused across rollouts) gives the logprobs a pass
  from each sequence's first token gives, to float32 rounding;
* the served scorer (``--scorer vllm-served --engine URL``: ``prompt_logprobs`` from the same engine) is
  self-consistent too, and agrees with the Hugging Face scorer token by token;
* under the trained version the KL(behaviour || version) is > 0 and shows in ``openforge analyze``;
* a veRL export carries rollout_is_weights from the re-score (each mode), equal to veRL 0.9.1's own rollout
  correction on the same logprobs (in veRL's venv), and ``openforge train`` trains with them and says so.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from forge_store import Settings, open_store, rescores
from learner import ExportConfig, export, mismatch_pairs, mismatch_tally, rescore, self_consistency, train
from proxy.engines import CACHE_ENV, ensure_env, ensure_model
from tests.rescore_rig import record

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
OPENFORGE = [sys.executable, "-m", "openforge.cli"]


@pytest.fixture(scope="module")
def world(vllm_server, tmp_path_factory):
    cache = os.environ.get(CACHE_ENV)
    python, model = ensure_env(cache, progress=False), ensure_model(cache, progress=False)
    work = tmp_path_factory.mktemp("rescore")
    url = f"sqlite:///{work / 'store.sqlite'}"
    facts = record(vllm_server, work, url, model, groups=3, per_group=2)
    settings = Settings(home=work / "home")
    with open_store(url, settings=settings) as st:
        export(st, work / "shard", ExportConfig(format="verl", keep_truncated=True))
        trained = train(st, work / "shard", work / "ckpt", python=python, lr=1e-4, steps=1, policy_id="trained")
    return {"python": python, "url": url, "work": work, "settings": settings, "calls": facts["calls"],
            "trained": trained.policy_version}


def _cli(world, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*OPENFORGE, *args, "--store", world["url"]], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "OPENFORGE_HOME": str(world["work"] / "home"), "COLUMNS": "200",
                               **(env or {})}, timeout=900)


def test_a_killed_rescore_resumes_and_the_self_rescore_is_token_exact(world):
    cmd = [*OPENFORGE, "rescore", "--version", "base", "--batch", "1", "--python", str(world["python"]),
           "--store", world["url"]]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OPENFORGE_HOME": str(world["work"] / "home")})
    for line in proc.stderr:   # killed (SIGKILL) once the first re-score is stored
        if "stored 1 re-scores" in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with open_store(world["url"], settings=world["settings"]) as st:
        stored = len(rescores(st, policy_version_id="base"))
    assert 1 <= stored < world["calls"], f"the kill landed after {stored} of {world['calls']} re-scores"

    out = _cli(world, "rescore", "--version", "base", "--python", str(world["python"]), "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["already_scored"] == stored and res["written"] == world["calls"] - stored
    own = res["self_consistency"]
    print("self-consistency:", json.dumps(own))
    assert own["calls"] == world["calls"] and own["ok"], own
    assert 0.99 <= own["ratio_mean"] <= 1.01 and abs(own["kl_k3"]) <= 1e-3
    assert res["lineage"]["engine"] == "transformers" and res["lineage"]["dtype"] == "float32"

    again = _cli(world, "rescore", "--version", "base", "--python", str(world["python"]), "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    res2 = json.loads(again.stdout.strip().splitlines()[-1])
    assert res2["written"] == 0 and res2["scored_calls"] == 0 and res2["already_scored"] == world["calls"]
    with open_store(world["url"], settings=world["settings"]) as st:
        rows = rescores(st, policy_version_id="base")
    assert len(rows) == world["calls"] == len({r.call_id for r in rows})


def test_the_shared_start_reuses_a_common_start_and_changes_no_logprob(world, tmp_path):
    from learner._rescore import select
    from learner._rescore_workers import STEP_SCRIPT, write_step_input

    with open_store(world["url"], settings=world["settings"]) as st:
        calls = [c for cs in st.token_calls(select(st).rollout_ids).values() for c in cs]
    path = tmp_path / "calls.jsonl"
    write_step_input(calls, path)   # the input openforge rescore gives the step
    model = ensure_model(os.environ.get(CACHE_ENV), progress=False)
    runs = {}
    for name, extra in (("shared", []), ("plain", ["--no-shared-start"])):
        out = subprocess.run([str(world["python"]), str(STEP_SCRIPT), "--model", str(model), "--calls", str(path),
                              *extra], capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        lines = [json.loads(x) for x in out.stdout.splitlines()]
        assert lines[0]["lineage"]["shared_start"] is (name == "shared")
        runs[name] = ({x["call_id"]: x["logprobs"] for x in lines[1:]}, out.stderr.strip().splitlines()[-1])
    print(runs["shared"][1], "|", runs["plain"][1])
    reused = int(runs["shared"][1].split("(")[1].split()[0])
    assert reused > 0 and "(0 more read" in runs["plain"][1]   # the groups' rollouts share their first prompt
    shared, plain = runs["shared"][0], runs["plain"][0]
    assert set(shared) == set(plain) == {c.id for c in calls}
    diffs = [abs(a - b) for c in plain for a, b in zip(shared[c], plain[c], strict=True)]
    assert max(diffs) <= 1e-3, max(diffs)


def test_two_scoring_workers_give_the_logprobs_one_gives(world, tmp_path):
    import sqlite3

    from learner._rescore_workers import cores

    got = {}
    for workers in (1, 2):   # each on its own copy of the store: a re-score writes a (call, version, scorer) once
        copy = tmp_path / f"w{workers}.sqlite"
        with sqlite3.connect(world["url"].removeprefix("sqlite:///")) as src, sqlite3.connect(copy) as dst:
            src.backup(dst)
            dst.execute("DELETE FROM rescores")   # the copy starts with none (other tests may have scored 'base')
        with open_store(f"sqlite:///{copy}", settings=world["settings"]) as st:
            res = rescore(st, "base", python=world["python"], workers=workers)
            got[workers] = {r.call_id: r.logprobs for r in rescores(st, policy_version_id="base")}
        assert res.scored_calls == world["calls"] and res.lineage["workers"] == workers
        assert res.lineage["threads"] == max(1, cores() // workers)   # the cores shared out
    assert set(got[1]) == set(got[2])
    diffs = [abs(a - b) for c in got[1] for a, b in zip(got[1][c], got[2][c], strict=True)]
    assert max(diffs) <= 1e-3, max(diffs)   # a split changes only which rollouts share a start


def test_the_served_scorer_on_the_same_engine_is_self_consistent_and_agrees_with_hf(world, vllm_server):
    out = _cli(world, "rescore", "--version", "base", "--scorer", "vllm-served", "--engine", vllm_server, "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    own = res["self_consistency"]
    print("served self-consistency:", json.dumps(own), "tokens/s:", res["tokens_per_s"])
    assert res["written"] == world["calls"] and own["calls"] == world["calls"] and own["ok"], own
    assert 0.99 <= own["ratio_mean"] <= 1.01 and abs(own["kl_k3"]) <= 1e-3
    lineage = res["lineage"]
    assert lineage["engine"] == "vllm" and lineage["dtype"] == "float32" and lineage["engine_version"], lineage

    with open_store(world["url"], settings=world["settings"]) as st:
        if not rescores(st, policy_version_id="base", scorer="hf-float32"):
            rescore(st, "base", python=world["python"])
        hf = {r.call_id: r.logprobs for r in rescores(st, policy_version_id="base", scorer="hf-float32")}
        served = {r.call_id: r.logprobs for r in rescores(st, policy_version_id="base", scorer="vllm-served")}
    assert set(hf) == set(served)
    diffs = [abs(a - b) for c in hf for a, b in zip(hf[c], served[c], strict=True)]
    print(f"served vs hf-float32: {len(diffs)} tokens, mean |d| {sum(diffs) / len(diffs):.2e}, max {max(diffs):.2e}")
    assert sum(diffs) / len(diffs) <= 1e-2 and max(diffs) <= 0.1

    again = _cli(world, "rescore", "--version", "base", "--scorer", "vllm-served", "--engine", vllm_server, "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["written"] == 0


def test_the_trained_version_diverges_and_analyze_shows_it(world):
    with open_store(world["url"], settings=world["settings"]) as st:
        res = rescore(st, world["trained"], python=world["python"])
        assert res.written == world["calls"] and res.tokens > 0
        pairs = mismatch_pairs(st, version=world["trained"])
        assert not self_consistency(pairs)["calls"]   # none of these calls was served by the trained version
    kl = mismatch_tally(pairs).row()
    print("base vs trained:", json.dumps(kl))
    assert kl["kl_k3"] > 1e-5 and kl["mismatch_max"] > 1e-3
    out = _cli(world, "analyze")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Logprob mismatch" in out.stdout and world["trained"] in out.stdout


def _export(st, world, mode: str, cap: float, out: Path) -> tuple[dict, list[dict]]:
    cfg = ExportConfig(format="verl", keep_truncated=True, rollout_is=mode, rollout_is_cap=cap,
                       rollout_is_version=world["trained"])
    m = export(st, out, cfg, record=False)
    return m, [r for f in m["files"] if f["path"].startswith("trajectories")
               for r in pq.read_table(out / f["path"]).to_pylist()]


def _case(mode: str, cap: float, rows: list[dict], scored: dict) -> dict:
    """Per row: the trainer's logprobs (the re-scores of its calls laid over the mask), the engine's, the mask and
    the exported weights."""
    case = {"name": mode, "mode": mode, "cap": cap, "old": [], "rollout": [], "mask": [], "ours": []}
    for r in rows:
        flat = iter([x for c in r["call_ids"] for x in scored[c]])
        case["old"].append([next(flat) if k else 0.0 for k in r["response_mask"]])
        case["rollout"].append([x if k else 0.0 for x, k in zip(r["response_logprobs"], r["response_mask"])])
        case["mask"].append(r["response_mask"])
        case["ours"].append(r["rollout_is_weights"])
    return case


def _between(values: list[float]) -> float:
    """A threshold strictly between two distinct values, as near their middle as there is one."""
    v = sorted(values)
    for k in sorted(range(1, len(v)), key=lambda k: abs(k - len(v) // 2)):
        if v[k] - v[k - 1] > 1e-3:
            return (v[k] + v[k - 1]) / 2
    raise AssertionError(f"the samples' sequence log-ratios {v} leave no gap to put a cap in")


@pytest.mark.parametrize("mode", ["token-tis", "sequence-tis", "token-mis", "sequence-mis"])
def test_export_weights_equal_verls_rollout_correction(world, mode, verl_python, tmp_path):
    with open_store(world["url"], settings=world["settings"]) as st:
        if not rescores(st, policy_version_id=world["trained"]):
            rescore(st, world["trained"], python=world["python"])
        scored = {r.call_id: r.logprobs for r in rescores(st, policy_version_id=world["trained"])}
        cap = 1.02
        m, rows = _export(st, world, mode, cap, tmp_path / "first")
        if mode.startswith("sequence"):
            # a cap between the samples' sequence ratios, so that some are kept and some capped / masked (veRL's
            # metrics divide by zero when its mask keeps nothing)
            case = _case(mode, cap, rows, scored)
            sums = [sum(o - e for o, e in zip(old, eng)) for old, eng in zip(case["old"], case["rollout"])]
            cap = math.exp(_between([min(abs(x), 20.0) for x in sums] if "mis" in mode else
                                    [0.0] + [min(x, 20.0) for x in sums if x > 0]))
            m, rows = _export(st, world, mode, cap, tmp_path / "shard")
        else:
            (tmp_path / "first").rename(tmp_path / "shard")
    verl = m["rollout_correction"]["verl"]
    assert verl["rollout_is_threshold"] == (f"{1 / cap!r}_{cap!r}" if "mis" in mode else cap)
    (tmp_path / "case.json").write_text(json.dumps({"cases": [_case(mode, cap, rows, scored)]}))
    out = subprocess.run([str(verl_python), str(ROOT / "learner" / "verl_check.py"), "rollout-corr",
                          str(tmp_path / "case.json")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (entry,) = json.loads(out.stdout)["cases"]
    print(json.dumps(entry))
    assert entry["equal"] and entry["tokens"] > 0
    # the cap bites: some weights are truncated (TIS) or masked (MIS), others not, so both branches are compared
    bitten = entry["masked"] if "mis" in mode else entry["capped"]
    assert 0 < bitten < entry["tokens"], entry

    if mode == "token-tis":   # and `openforge train` trains with them, saying so
        shard = tmp_path / "shard"
        out = _cli(world, "train", "--shard", str(shard), "--steps", "1", "--lr", "1e-6", "--python",
                   str(world["python"]), "--out", str(tmp_path / "ckpt"), "--policy-id", "weighted")
        assert out.returncode == 0, out.stderr[-3000:]
        assert "rollout_is_weights from the shard (token-tis" in out.stderr
        step = json.loads(out.stdout.strip().splitlines()[-1])
        assert step["rollout_is_weighted_samples"] == len(rows) and step["rollout_correction"]["mode"] == mode
        assert "off-policy weights from the shard" in out.stdout
