"""The ``rescores`` table on real SQLite and PostgreSQL (append-only, idempotent, pinned by watermark, bad rows
refused) and the mismatch figures computed from it (learner._mismatch), against numbers worked by hand."""

from __future__ import annotations

import math

import pytest

from forge_store import InvalidRecord, RescoreRow, open_store, record_rescores, rescored_call_ids, rescores
from learner import mismatch_by_version, mismatch_pairs, mismatch_per_rollout, mismatch_tally, self_consistency
from tests.conftest import make_call

ENGINE = [-0.5, -1.0, -2.0]


@pytest.fixture
def store(store_url, settings):
    with open_store(store_url, settings=settings) as st:
        st.register_policy_version("v0", model_name="m", global_step=0)
        st.register_policy_version("v1", model_name="m", global_step=3)
        st.start_rollout("r", policy_version_id="v0")
        rec = make_call("c0", "r", 0, prompt_ids=[1, 2, 3], completion_ids=[7, 8, 9])
        rec.completion_logprobs, rec.policy_version_id = ENGINE, "v0"
        st.record_call(rec)
        st.finish_rollout("r", "success")
        yield st


def _row(call="c0", version="v0", scorer="hf-float32", logprobs=ENGINE):
    return RescoreRow(call, "r", version, scorer, {"dtype": "float32"}, list(logprobs))


def test_rescoring_twice_writes_nothing_new_and_rows_are_pinned_by_watermark(store):
    wm0 = store.watermark()
    assert record_rescores(store, [_row()]) == 1
    wm1 = store.watermark()
    assert wm1 == wm0 + 1
    assert record_rescores(store, [_row(), _row(logprobs=[-9.0, -9.0, -9.0])]) == 0   # same key: never overwritten
    assert store.watermark() == wm1
    assert record_rescores(store, [_row(scorer="hf-bfloat16")]) == 1                     # another scorer: kept beside
    (got,) = rescores(store, policy_version_id="v0", scorer="hf-float32")
    assert got.logprobs == pytest.approx(ENGINE) and got.scorer_lineage == {"dtype": "float32"}
    assert got.ingest_seq == wm1
    assert len(rescores(store, policy_version_id="v0")) == 2
    assert len(rescores(store, as_of=wm1)) == 1 and rescores(store, as_of=wm0) == []
    assert rescored_call_ids(store, "v0", "hf-float32", ["c0", "c-other"]) == {"c0"}
    assert rescored_call_ids(store, "v1", "hf-float32", ["c0"]) == set()
    assert [r.call_id for r in rescores(store, call_ids=["c0"])] == ["c0", "c0"]


@pytest.mark.parametrize("row, match", [
    (RescoreRow("", "r", "v0", "s", None, [-1.0]), "call_id ''"),
    (RescoreRow("c0", "r", "v0", "x" * 65, None, [-1.0]), "scorer 'xxx.*at most 64"),
    (RescoreRow("c0", "r", "v0", "s", None, []), "no logprobs"),
    (RescoreRow("c0", "r", "v0", "s", None, [-1.0, 0.5]), "logprob 0.5 is not a number <= 0"),
    (RescoreRow("c0", "r", "v0", "s", None, [float("nan")]), "logprob nan"),
])
def test_a_bad_rescore_is_refused_naming_the_value(store, row, match):
    with pytest.raises(InvalidRecord, match=match):
        record_rescores(store, [row])
    assert rescores(store) == []


def test_mismatch_figures_worked_by_hand(store):
    shifted = [-0.5, -1.0 + 0.1, -2.0 - 0.3]          # d = 0, +0.1, -0.3
    record_rescores(store, [_row(), _row(version="v1", logprobs=shifted)])
    pairs = mismatch_pairs(store)
    own = self_consistency(pairs)
    assert own["ok"] and own["calls"] == 1 and own["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert own["kl_k3"] == pytest.approx(0.0, abs=1e-7)
    other = mismatch_tally([p for p in pairs if p.version == "v1"], eps=0.2).row()
    d = [0.0, 0.1, -0.3]
    assert other["mismatch_mean"] == pytest.approx(sum(map(abs, d)) / 3, abs=1e-6)
    assert other["mismatch_max"] == pytest.approx(0.3, abs=1e-6)
    assert other["kl_k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 3, abs=1e-6)
    assert other["ratio_mean"] == pytest.approx(sum(math.exp(x) for x in d) / 3, abs=1e-6)
    assert other["out_of_band"] == pytest.approx(1 / 3)  # exp(-0.3) = 0.74 < 0.8; exp(0.1) = 1.105 is inside
    rows = {r["rescored_under"]: r for r in mismatch_by_version(store, pairs)}
    assert rows["v1"]["behaviour"] == "v0" and rows["v1"]["behaviour_step"] == 0 and rows["v1"]["rescored_step"] == 3
    assert [r["version"] for r in mismatch_per_rollout(pairs)] == ["v0", "v1"]


def test_self_consistency_names_the_tokens_that_differ(store):
    record_rescores(store, [_row(logprobs=[-0.5, -1.0, -2.5])])
    own = self_consistency(mismatch_pairs(store))
    assert not own["ok"] and own["ratio_mean"] < 0.99
    worst = own["worst_tokens"][0]
    assert (worst["call_id"], worst["position"], worst["token_id"]) == ("c0", 2, 9)
    assert worst["abs_diff"] == pytest.approx(0.5)


@pytest.mark.parametrize("args, match", [
    (["--version", "nope"], "--version 'nope' is not a policy version in the store; known: v0, v1"),
    (["--version", "v0"], "policy version 'v0' has no checkpoint folder on this machine"),
    (["--version", "v0", "--rollout", "zz"], "--rollout 'zz' is not a rollout in the store"),
    (["--version", "v0", "--rollout", "r", "--where", "attempt = 1"], "pick the calls one way"),
    (["--version", "v0", "--scorer", "vllm"], "--scorer 'vllm' unknown: use one of hf-float32, hf-bfloat16"),
    (["--version", "v0", "--limit", "0"], "--limit 0: pass 1 or more"),
    (["--version", "v0", "--batch", "0"], "--batch 0: write at least 1"),
    (["--version", "v0", "--eps", "1.5"], "--eps 1.5: the ratio band"),
])
def test_rescore_command_refuses_bad_input_naming_it(store, store_url, args, match, tmp_path):
    import sys

    from typer.testing import CliRunner

    from openforge.cli import build_app

    if "checkpoint folder" not in match and "--version 'nope'" not in match:
        (tmp_path / "ckpt").mkdir()
        (tmp_path / "ckpt" / "config.json").write_text("{}")
        args = [*args, "--checkpoint", str(tmp_path / "ckpt")]
    r = CliRunner().invoke(build_app(), ["rescore", *args, "--python", sys.executable, "--store", store_url])
    assert r.exit_code == 2, r.output
    assert match in " ".join(r.output.split()), r.output
    assert rescores(store) == []


def _token_call(call_id: str, rollout: str, seq: int, prompt: list[int], completion: list[int]):
    from array import array

    from forge_store import TokenCall

    full = array("I", prompt + completion).tobytes()
    return TokenCall(call_id, rollout, seq, None, "stop", True, None, 200, "v0", None, None, full, len(prompt),
                     array("I", completion).tobytes(), None, seq)


def test_the_scorer_splits_its_calls_into_contiguous_shares_of_whole_rollouts_of_about_equal_cost():
    from learner._rescore_workers import split, step_order

    calls = []
    for r in range(6):   # rollout r: two calls, the second a continuation of the first; r 0-2 start alike
        start = [1, 2, 3] if r < 3 else [9, r]
        calls += [_token_call(f"r{r}c0", f"r{r}", 0, start + [r] * 10, [5] * (r + 1)),
                  _token_call(f"r{r}c1", f"r{r}", 1, start + [r] * 10 + [5] * (r + 1) + [6] * 20, [7] * 4)]
    order = [c.id for c in step_order(calls)]
    for parts in (1, 2, 3, 6, 20):
        shares = split(calls, parts)
        assert [c.id for s in shares for c in s] == order   # the step's order, cut: nothing lost or repeated
        assert len(shares) == min(parts, 6) and all(shares)
        rollouts = [{c.rollout_id for c in s} for s in shares]
        assert sum(map(len, rollouts)) == 6   # no rollout in two shares (its calls share one pass)
    cost = [sum(max(len(c.full) // 4 for c in s if c.rollout_id == r) for r in {c.rollout_id for c in s})
            for s in split(calls, 2)]
    assert max(cost) <= 1.5 * min(cost), cost


def test_a_rescore_with_no_worker_is_refused_before_anything_runs(store):
    from learner import RescoreError, rescore

    with pytest.raises(RescoreError, match="--workers 0: run at least 1"):
        rescore(store, "v0", workers=0)
    assert rescores(store) == []
