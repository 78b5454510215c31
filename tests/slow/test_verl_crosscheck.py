"""Cross-check against veRL itself (issue 7), run in veRL's own environment (`make verl-env`).

Our side (this venv) generates GRPO groups and a small verl export; `learner/verl_check.py compare`, run by the
veRL venv's python, feeds the same rewards to veRL's ``compute_grpo_outcome_advantage`` and builds veRL's
``AgentLoopOutput`` from every exported trajectory row. The script is run by path, not ``-m learner.verl_check``:
``learner/__init__.py`` imports the whole learner (forge_store, ...), which the veRL venv does not have.

The veRL venv is built on first use when missing (~minutes; cached under ~/.cache/openforge/verl), or set
OPENFORGE_VERL_PYTHON to a python that has verl.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from forge_store import Settings, open_store
from learner._export import export
from learner._grpo import GrpoConfig, group_advantages
from learner._plan import ExportConfig
from tests.conftest import make_call

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "learner" / "verl_check.py"
EPS = 1e-6


def _groups() -> list[tuple[str, list[float]]]:
    """Sizes 1..8 with seeded random rewards, plus binary, singleton and all-equal groups (float32-awkward values)."""
    rng = random.Random(7)
    groups = [(f"rand{n}", [round(rng.uniform(-1, 2), 4) for _ in range(n)]) for n in range(1, 9)]
    groups += [(f"bin{n}", [float(rng.random() < 0.5) for _ in range(n)]) for n in (2, 4, 8)]
    groups += [("bin_mixed", [1.0, 0.0, 0.0, 1.0, 1.0])]
    groups += [("one_a", [0.8]), ("one_b", [-0.3]), ("one_zero", [0.0])]
    groups += [("equal_0.7x3", [0.7] * 3), ("equal_0.1x5", [0.1] * 5), ("equal_1x8", [1.0] * 8),
               ("equal_0x2", [0.0] * 2), ("equal_third_x6", [1 / 3] * 6), ("equal_0.3x7", [0.3] * 7)]
    return groups


def _cases() -> list[dict]:
    rng = random.Random(11)
    groups = _groups()
    cases = []
    for norm in (True, False):
        for singleton in ("verl", "zero"):
            uids, rewards, ours, lengths, flat = [], [], [], [], []
            for gid, rs in groups:
                res = group_advantages(rs, GrpoConfig(epsilon=EPS, norm_by_std=norm, singleton=singleton))
                if res.note == "all_equal":
                    flat.append(gid)
                uids += [gid] * len(rs)
                rewards += rs
                ours += res.advantages
                lengths += [rng.randint(1, 12) for _ in rs]
            # groups interleaved in the batch, as veRL sees them after shuffling
            order = list(range(len(uids)))
            rng.shuffle(order)
            cases.append({"name": f"std={norm},singleton={singleton}", "norm_by_std": norm, "singleton": singleton,
                          "uids": [uids[i] for i in order], "rewards": [rewards[i] for i in order],
                          "response_lengths": [lengths[i] for i in order], "ours": [ours[i] for i in order],
                          "all_equal_uids": flat,
                          # our default singleton=zero departs from veRL on purpose (grpo.py, point 2)
                          "expect_equal": singleton == "verl"})
    return cases


def _chain(st, rid, turns, base):
    prompt = list(base)
    for t in range(turns):
        comp = [100 + 10 * t, 101 + 10 * t, 2]
        st.record_call(make_call(f"{rid}-c{t}", rid, t, prompt_ids=prompt, completion_ids=comp))
        prompt = prompt + comp + [50 + t, 60 + t]


def _export(tmp_path: Path, norm: bool) -> Path:
    """A small store: groups of 3, 4 (all equal), 1 and 2, one rollout per segment; exported with singleton=verl."""
    st = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}", settings=Settings(home=tmp_path / "home"))
    try:
        st.register_task("t1", source="swe-gym", verifier_hash="vh")
        st.register_harness("h", "1")
        st.register_policy_version("p1", model_name="m", global_step=1)
        spec = {"g_1": [1.0, 0.0, 0.25], "g2": [0.7, 0.7, 0.7, 0.7], "g3": [0.9], "g4": [0.0, 1.0]}
        for gid, rs in spec.items():
            st.create_group(gid, task_id="t1", target_size=len(rs), policy_version_id="p1")
            for j, r in enumerate(rs):
                rid = f"{gid}-r{j}"
                st.start_rollout(rid, group_id=gid, task_id="t1", policy_version_id="p1", harness_id="h@1",
                                 image_digest="sha256:img")
                _chain(st, rid, turns=1 + j % 3, base=[1, 2, 3 + j])
                st.finish_rollout(rid, "success")
                st.add_reward(rid, r, verifier_version="v1")
        out = tmp_path / f"export-{norm}"
        export(st, out, ExportConfig(format="verl", singleton="verl", norm_by_std=norm, epsilon=EPS))
        return out
    finally:
        st.close()


def test_grpo_and_agent_loop_output_match_verl(tmp_path, verl_python):
    cases = _cases()
    shards = []
    for norm in (True, False):
        out = _export(tmp_path / f"s{norm}", norm)
        files = sorted(out.glob("trajectories-*.parquet"))
        assert files
        shards += [str(f) for f in files]
        rows = [r for f in files for r in pq.read_table(f).to_pylist()]
        assert len({r["session"] for r in rows}) == len(rows)  # one segment per rollout: veRL's weighting agrees
        flat = [u for u in {r["uid"] for r in rows}
                if sum(x["uid"] == u for x in rows) > 1 and len({x["reward_score"] for x in rows if x["uid"] == u}) == 1]
        cases.append({"name": f"export,std={norm}", "norm_by_std": norm, "singleton": "verl",
                      "uids": [r["uid"] for r in rows], "rewards": [r["reward_score"] for r in rows],
                      "response_lengths": [len(r["response_ids"]) for r in rows],
                      "ours": [r["advantage"] for r in rows], "expect_equal": True, "all_equal_uids": flat})
    spec = tmp_path / "crosscheck.json"
    spec.write_text(json.dumps({"eps": EPS, "cases": cases, "shards": shards}))
    proc = subprocess.run([str(verl_python), str(SCRIPT), "compare", str(spec)], check=False, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert proc.stdout, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    print(json.dumps({k: v for k, v in report.items() if k != "cases"}, indent=1))
    for c in report["cases"]:
        f32, f64 = c["float32"], c["float64"]
        print(f"{c['name']:26} n={c['n']:3} max|ours-verl| f32={f32['max_abs_diff']:.3g} f64={f64['max_abs_diff']:.3g}"
              f" equal={c['equal']}; verl f32 all-equal-group |adv| <= {f32['all_equal_groups_max_abs_adv']:.3g}")
    bad = [c["name"] for c in report["cases"] if c["expect_equal"] and not c["equal"]]
    assert not bad, f"advantages differ from veRL's: {bad}\n{proc.stdout[-6000:]}"
    # our default singleton=zero must differ exactly where a group of one has a nonzero reward
    zero = [c for c in report["cases"] if c["name"].endswith("singleton=zero")]
    assert zero and all(not c["equal"] for c in zero)
    for c in report["cases"]:  # veRL's float32 rounding in all-equal groups: tiny, never a ranking signal
        assert c["float32"]["all_equal_groups_max_abs_adv"] < 0.1
    alo = report["agent_loop_output"]
    assert alo["rows"] == sum(pq.read_metadata(s).num_rows for s in shards) and not alo["problems"], alo
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_the_cpu_steps_policy_loss_is_verls(verl_python):
    """learner/_step_losses.py (what ``openforge train`` and the demo's GRPO rounds minimise) equals veRL 0.9.1's
    ``get_policy_loss_fn("vanilla")`` on the same tensors: loss and gradient, every loss_agg_mode, clip-higher,
    dual clip, rollout_is_weights, and micro-batches that carry the mini-batch's totals; and its KL loss
    (``kl_penalty``) equals veRL's for every estimator."""
    proc = subprocess.run([str(verl_python), str(SCRIPT), "policy-loss"], check=False, capture_output=True, text=True,
                          timeout=600)
    assert proc.stdout, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    modes = {c["mode"] for c in report["cases"]}
    assert modes == {"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                     "seq-mean-token-sum-norm"} and len(report["cases"]) == 20
    bad = [c for c in report["cases"] if not c["equal"]]
    assert report["ok"] and not bad, bad
    assert len({round(c["verl"], 9) for c in report["cases"]}) > 10   # the cases differ: the check can fail
    # veRL's KL loss (use_kl_loss): every estimator it names, value, token-mean loss and gradient
    kl = report["kl_cases"]
    assert {c["kind"] for c in kl} >= {"low_var_kl", "k3", "k1", "k2", "abs", "k3+"} and all(c["equal"] for c in kl), kl
    assert len({round(c["verl_loss"], 9) for c in kl}) >= 4   # the estimators differ on these tensors
