"""Off-policy weights in veRL exports (learner._rollout_weights / _rollout_correction), on real SQLite: hand-worked
weights for each mode, a shard whose rows carry them (and whose manifest says how), ``verify`` re-deriving them, the
export id of an export without weights unchanged, and every bad request refused naming the value and the fix.
The equality with veRL's own rollout correction is tests/slow/test_rescore.py's (veRL's venv)."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from forge_store import RescoreRow, Settings, open_store, record_rescores
from forge_store.testing import seed_demo_store
from learner import ExportConfig, ExportError, export, verify
from learner._rollout_weights import rollout_is_weights, verl_settings

OLD, ENG, MASK = [-1.0, -1.0, -2.0, 0.0], [-1.5, -0.5, -2.01, -3.0], [1, 1, 1, 0]


@pytest.mark.parametrize("mode, cap, expect", [
    ("token-tis", 1.5, [1.5, math.exp(-0.5), math.exp(0.01), 0.0]),
    ("token-mis", 1.5, [0.0, 0.0, math.exp(0.01), 0.0]),                   # exp(.5) > 1.5, exp(-.5) < 1/1.5
    ("sequence-tis", 2.0, [math.exp(0.01)] * 3 + [0.0]),                    # sum of log-ratios: 0.5 - 0.5 + 0.01
    ("sequence-mis", 1.005, [0.0] * 4),                                      # exp(0.01) > 1.005: masked
    ("token-tis", 2.0, [math.exp(0.5), math.exp(-0.5), math.exp(0.01), 0.0]),
])
def test_weights_worked_by_hand(mode, cap, expect):
    assert rollout_is_weights(OLD, ENG, MASK, mode, cap) == pytest.approx(expect, rel=1e-12)


def test_log_ratios_are_clamped_as_verl_clamps_them():
    assert rollout_is_weights([0.0], [-50.0], [1], "token-tis", 1e12) == pytest.approx([math.exp(20.0)])
    assert verl_settings("sequence-mis", 2.0)["rollout_is_threshold"] == "0.5_2.0"
    assert verl_settings("token-tis", 2)["rollout_is_threshold"] == 2.0


@pytest.mark.parametrize("mode, cap, match", [
    ("clip", 2.0, "--rollout-is 'clip' unknown: use one of token-tis"),
    ("token-tis", 1.0, "--rollout-is-cap 1.0: the cap .* above 1"),
    ("token-tis", float("inf"), "--rollout-is-cap inf"),
])
def test_bad_mode_or_cap_is_refused(mode, cap, match):
    with pytest.raises(ValueError, match=match):
        rollout_is_weights(OLD, ENG, MASK, mode, cap)


DELTAS = (0.2, -0.2, 0.01)   # the seeded engine logprobs are -0.25: every re-score stays <= 0


@pytest.fixture
def store(tmp_path):
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}", settings=Settings(home=tmp_path / "home")) as st:
        seed_demo_store(st, n_tasks=2, per_task=4)
        yield st


def _rescore_all(st, version: str, skip: int = 0) -> None:
    ids = [r.id for r in st.iter_rollouts()]
    calls = [c for cs in st.token_calls(ids).values() for c in cs if c.logprobs][skip:]
    record_rescores(st, [RescoreRow(c.id, c.rollout_id, version, "hf-float32", None,
                                    [min(x + DELTAS[i % 3], 0.0) for i, x in enumerate(c.completion_logprobs)])
                         for c in calls])


def test_a_shard_carries_the_weights_and_verify_rederives_them(store, tmp_path):
    _rescore_all(store, "policy-v2")
    cfg = ExportConfig(format="verl", min_group_size=1, rollout_is="token-tis", rollout_is_cap=1.1)
    m = export(store, tmp_path / "x", cfg)
    assert m["rollout_correction"] == {"column": "rollout_is_weights", "mode": "token-tis", "cap": 1.1,
                                       "version": "policy-v2", "scorer": "hf-float32",
                                       "verl": {"rollout_is": "token", "rollout_is_threshold": 1.1,
                                                "rollout_is_batch_normalize": False}}
    rows = [r for f in m["files"] if f["path"].startswith("trajectories")
            for r in pq.read_table(tmp_path / "x" / f["path"]).to_pylist()]
    assert rows
    for r in rows:
        w = r["rollout_is_weights"]
        assert len(w) == len(r["response_mask"])
        assert all(x == 0 for x, k in zip(w, r["response_mask"]) if not k)
        live = [x for x, k in zip(w, r["response_mask"]) if k]
        assert live and all(0 < x <= 1.1 + 1e-6 for x in live)
    weights = [x for r in rows for x in r["rollout_is_weights"]]
    assert any(x == pytest.approx(1.1) for x in weights)                                # exp(0.2) = 1.22: capped
    assert any(x == pytest.approx(math.exp(0.01), rel=1e-5) for x in weights)
    assert any(x == pytest.approx(math.exp(-0.2), rel=1e-5) for r in rows for x in r["rollout_is_weights"])
    assert verify(tmp_path / "x" / "manifest.json", store)["ok"]


def test_an_export_without_weights_keeps_its_config_and_id(store, tmp_path):
    plain = ExportConfig(format="verl", min_group_size=1)
    assert "rollout_is" not in plain.to_json() and ExportConfig.from_json(plain.to_json()) == plain
    m = export(store, tmp_path / "x", plain, record=False)
    assert "rollout_correction" not in m
    assert "rollout_is_weights" not in pq.read_schema(tmp_path / "x" / "trajectories-00000.parquet").names


def test_missing_rescores_and_bad_requests_are_refused(store, tmp_path):
    _rescore_all(store, "policy-v2", skip=3)
    cfg = ExportConfig(format="verl", min_group_size=1, rollout_is="token-mis", rollout_is_cap=2.0)
    with pytest.raises(ExportError, match=r"no re-score under policy-v2 by hf-float32 .* `openforge rescore "
                                          r"--version policy-v2"):
        export(store, tmp_path / "a", cfg, record=False)
    with pytest.raises(ExportError, match="--rollout-is-version 'nope' is not a policy version"):
        export(store, tmp_path / "b", ExportConfig(format="verl", rollout_is="token-tis", rollout_is_version="nope"),
               record=False)
    with pytest.raises(ExportError, match="importance weights ride in veRL shards only"):
        export(store, tmp_path / "c", ExportConfig(format="trl", rollout_is="token-tis"), record=False)
