"""The batched export (``Store.token_calls``, byte-level reconstruction, columnar shard writes) writes the same
bytes as the reference path (every call read in full, reconstructed from Python lists) and the same rows as the
export before it existed (golden digests), on SQLite and PostgreSQL, over a corpus that takes every path."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from forge_store import Settings, open_store
from learner import ExportConfig, ExportError, export, reconstruct_rollout
from learner import _plan as plan_module
from learner._reconstruct import reconstruct_tokens
from tests.conftest import make_call
from tests.export_corpus import CONFIGS, build_corpus, damage_corpus

# Row digests (see _rows_digest) of the corpus's shards, exclusions and counts as exported by commit 2b0b9d5, the
# export before the batched one: the batched path must keep every row of every format. Rows are compared on the
# columns each shard had then (a column added since is not part of the pin).
GOLDEN_COLUMNS = {
    "conversations": ("call_ids group_id harness_id image_digest image_hashes messages policy_version_id purpose "
        "reward reward_id reward_source rollout_id segment_index task_id token_exact tool_schema_hashes tools "
        "verifier_version").split(),
    "rl_prompts": ("agent_name data_source extra_info prompt reward_model ").split(),
    "samples": ("advantage call_ids completion_ids env_mask group_id harness_id image_digest image_hashes logprobs "
        "policy_version_id prompt_ids reward reward_id reward_source rollout_id segment_index task_id "
        "tool_schema_hashes verifier_version").split(),
    "trajectories": ("advantage call_ids group_id harness_id image_digest image_hashes index key num_turns "
        "policy_version_id prompt_ids response_ids response_logprobs response_mask reward_id reward_score "
        "reward_source rollout_id session task_id tool_schema_hashes uid verifier_version").split(),
}
GOLDEN = {
    "sft": {
        "conversations": "52216bfa782cb2b45475e870e113ac10ceeba068cecf329faec2ba2690a744ed",
        "counts": {"all_equal_groups": 0, "calls": 421, "groups": 28, "merged_calls": 0, "rollouts_exported": 100,
                   "rollouts_seen": 127, "singleton_groups": 0, "unfinished": 1},
        "exclusions": {"evaluation": 6, "infra_error": 14, "missing_data": 302, "no_reward": 1, "redacted": 12,
                       "store_damaged": 8, "truncated": 4},
    },
    "trl_group_where": {
        "counts": {"all_equal_groups": 2, "calls": 316, "groups": 19, "merged_calls": 201, "rollouts_exported": 76,
                   "rollouts_seen": 127, "singleton_groups": 0, "unfinished": 1},
        "exclusions": {"evaluation": 6, "filtered": 17, "incomplete_group": 2, "infra_error": 14, "logprob_mismatch":
                       10, "no_reward": 3, "not_token_exact": 5, "redacted": 11, "store_damaged": 8, "teacher": 4,
                       "truncated": 4},
        "samples": "83a3eff1c4f77ee50a654e1ba29c905dfc478d2b13d5d77fe76e8e57dcaedf94",
    },
    "trl_partial": {
        "counts": {"all_equal_groups": 2, "calls": 151, "groups": 15, "merged_calls": 92, "rollouts_exported": 35,
                   "rollouts_seen": 127, "singleton_groups": 2, "unfinished": 1},
        "exclusions": {"evaluation": 6, "filtered": 52, "incomplete_group": 14, "infra_error": 12, "logprob_mismatch":
                       4, "no_reward": 3, "not_token_exact": 4, "redacted": 5, "store_damaged": 2, "teacher": 4,
                       "truncated": 2},
        "samples": "6307ef06373d36964bae2150ad689b4537760c94963f290480e4dc4b991c4826",
    },
    "verl": {
        "counts": {"all_equal_groups": 2, "calls": 277, "groups": 19, "merged_calls": 172, "rollouts_exported": 67,
                   "rollouts_seen": 127, "singleton_groups": 5, "unfinished": 1},
        "exclusions": {"evaluation": 6, "incomplete_group": 28, "infra_error": 14, "logprob_mismatch": 9, "no_reward":
                       3, "not_token_exact": 6, "redacted": 11, "store_damaged": 8, "teacher": 4, "truncated": 3},
        "rl_prompts": "65f90b08c228b6300d12a8a1d74373a495f39f51480c1b6decc7e1e2d6c3a7b9",
        "trajectories": "073b0688f01ed479f3a6e2b6d3a014b6864d536c81e90a648dd8721e45b514ce",
    },
    "verl_lag_truncated": {
        "counts": {"all_equal_groups": 1, "calls": 160, "groups": 13, "merged_calls": 100, "rollouts_exported": 40,
                   "rollouts_seen": 127, "singleton_groups": 5, "unfinished": 1},
        "exclusions": {"evaluation": 6, "incomplete_group": 40, "infra_error": 10, "logprob_mismatch": 6, "no_reward":
                       3, "not_token_exact": 2, "redacted": 10, "stale_policy": 16, "store_damaged": 2, "teacher": 4},
        "rl_prompts": "890c9bb60cb8801b233355c6e72c2e717609a9dccdd1aa8bb2e3c9147607ee87",
        "trajectories": "dec2b07f967c67c3a6d91e6a6d94a651f97fcaa78b01cd9a16d9a7b3ff2467a7",
    },
    "verl_small_shards": {
        "counts": {"all_equal_groups": 2, "calls": 318, "groups": 19, "merged_calls": 198, "rollouts_exported": 75,
                   "rollouts_seen": 127, "singleton_groups": 5, "unfinished": 1},
        "exclusions": {"evaluation": 6, "incomplete_group": 31, "infra_error": 15, "logprob_mismatch": 9, "no_reward":
                       3, "not_token_exact": 6, "store_damaged": 8, "teacher": 4, "truncated": 6},
        "rl_prompts": "2a4ab001b3d4379c9b8b43d65d860f93563efad980cfa06e9dd6749f149c34f3",
        "trajectories": "9325c40a93beec6f20af40658b82b190f6940ce9c2777aa18749baf375d39730",
    },
}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def corpus(request, tmp_path_factory):
    """The corpus, built once per backend for this module (the tests only read it: exports with record=False)."""
    tmp = tmp_path_factory.mktemp("corpus")
    name = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'store.sqlite'}"
    else:
        admin = request.getfixturevalue("pg_admin_url")
        name = f"of_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = sa.engine.make_url(admin).set(drivername="postgresql+psycopg", database=name)
        url = url.render_as_string(hide_password=False)
    st = open_store(url, settings=Settings(home=tmp / "home"))
    build_corpus(st)
    damage_corpus(st)
    yield st
    st.close()
    if name:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _rows_digest(folder: Path, manifest: dict) -> dict:
    """Shard set (file prefix) -> sha256 of its rows as canonical JSON, plus the exclusions and counts: what the
    export says, independent of the Parquet writer's version."""
    out: dict[str, str] = {}
    for prefix in sorted({f["path"].rsplit("-", 1)[0] for f in manifest["files"] if f["path"].endswith(".parquet")}):
        rows = [{c: r[c] for c in GOLDEN_COLUMNS[prefix]} for p in sorted(folder.glob(f"{prefix}-*.parquet"))
                for r in pq.read_table(p).to_pylist()]
        out[prefix] = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
    out["exclusions"] = manifest["exclusions"]
    out["counts"] = {k: v for k, v in manifest["counts"].items() if k != "rows"}
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_batched_export_writes_the_reference_bytes_and_the_rows_of_the_export_before_it(corpus, tmp_path, name):
    cfg = ExportConfig(**CONFIGS[name])
    wm = corpus.watermark()
    fast = export(corpus, tmp_path / "fast", cfg, as_of=wm, record=False)
    slow = export(corpus, tmp_path / "slow", cfg, as_of=wm, record=False, batched=False)
    assert _files(tmp_path / "fast") == _files(tmp_path / "slow")
    assert fast == slow
    assert _rows_digest(tmp_path / "fast", fast) == GOLDEN[name]
    assert sum(fast["counts"]["rows"].values()) > 0
    if cfg.format != "sft" and not cfg.keep_truncated:  # the corpus takes every path: each call-level reason shows
        assert {"store_damaged", "truncated", "infra_error", "not_token_exact", "logprob_mismatch"} <= set(
            fast["exclusions"])


def test_token_calls_read_what_calls_by_rollout_reads(corpus):
    ids = sorted({r.id for r in corpus.iter_rollouts()})
    full_damage: dict = {}
    token_damage: dict = {}
    full = corpus.calls_by_rollout(ids, damage=full_damage)
    token = corpus.token_calls(ids, damage=token_damage)
    assert full_damage == token_damage and len(full_damage) == 2
    assert full.keys() == token.keys()
    for rid in ids:
        assert [c.id for c in full[rid]] == [c.id for c in token[rid]]
        for a, b in zip(full[rid], token[rid]):
            assert (a.prompt_token_ids, a.completion_token_ids, a.completion_logprobs) == (
                b.prompt_token_ids, b.completion_token_ids, b.completion_logprobs)
            assert (a.metadata, a.image_hashes, a.policy_version_id, a.finish_reason) == (
                b.metadata, b.image_hashes, b.policy_version_id, b.finish_reason)
        if token[rid]:  # the first call carries its prompt (a group's prompt row), the others do not
            assert token[rid][0].messages == full[rid][0].messages and token[rid][0].tools == full[rid][0].tools
            assert all(c.messages is None for c in token[rid][1:])
        slow, fast = reconstruct_rollout(full[rid]), reconstruct_tokens(token[rid])
        assert (slow.merged, slow.n_calls, slow.excluded) == (fast.merged, fast.n_calls, fast.excluded)
        for s, f in zip(slow.segments, fast.segments, strict=True):
            assert f.prompt_ids == s.prompt_ids and f.response_ids == s.response_ids
            assert f.response_mask == s.response_mask and f.response_logprobs == s.response_logprobs
            assert f.full_ids() == s.full_ids() and f.call_ids == s.call_ids


def test_a_token_id_past_int32_is_an_error_naming_the_column(store_url, settings, tmp_path):
    with open_store(store_url, settings=settings) as st:
        st.register_task("t1")
        st.start_rollout("r1", task_id="t1")
        st.record_call(make_call("r1-c0", "r1", 0, prompt_ids=[1, 2 ** 31 + 5], completion_ids=[3]))
        st.finish_rollout("r1", "success")
        st.add_reward("r1", 1.0)
        with pytest.raises(ExportError, match=r"prompt_ids: a token id is 2\*\*31 or more"):
            export(st, tmp_path / "x", ExportConfig(format="trl", min_group_size=1))


def test_calls_of_equal_seq_come_in_id_order_as_calls_by_rollout_reads_them(store_url, settings):
    """SQLite's read orders by (rollout, seq) and puts equal seqs in id order itself: the same order as the
    database's ``ORDER BY rollout_id, seq, id`` of calls_by_rollout, whatever order the calls were written in."""
    with open_store(store_url, settings=settings) as st:
        st.register_task("t1")
        for rid in ("r1", "r2"):
            st.start_rollout(rid, task_id="t1")
            for cid, seq in (("z", 0), ("m", 1), ("b", 1), ("k", 1), ("a", 2)):
                st.record_call(make_call(f"{rid}-{cid}", rid, seq, prompt_ids=[1, 2, seq], completion_ids=[3]))
        token = st.token_calls(["r1", "r2"])
        full = st.calls_by_rollout(["r1", "r2"])
    for rid in ("r1", "r2"):
        assert [c.id for c in token[rid]] == [c.id for c in full[rid]] == [
            f"{rid}-{c}" for c in ("z", "b", "k", "m", "a")]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_export_workers_write_the_bytes_one_process_writes(corpus, tmp_path, name, monkeypatch):
    """Runs of 8 rollouts planned by 3 forked workers (every third run each, out of step with the row groups and
    shards) give the same files, manifest and exclusions as one process."""
    monkeypatch.setattr(plan_module, "RUN_ROLLOUTS", 8)
    cfg = ExportConfig(**CONFIGS[name])
    wm = corpus.watermark()
    found: dict[str, list] = {"one": [], "workers": []}
    for how, workers in (("one", 1), ("workers", 3)):
        monkeypatch.setattr(corpus, "add_exclusion", lambda reason, _how=how, **kw: found[_how].append((reason, kw)))
        export(corpus, tmp_path / how, cfg, as_of=wm, workers=workers)
    one = json.loads((tmp_path / "one" / "manifest.json").read_text())
    many = json.loads((tmp_path / "workers" / "manifest.json").read_text())
    assert _files(tmp_path / "workers") == _files(tmp_path / "one")
    assert one == many and one["counts"]["groups"] > 3
    assert found["workers"] == found["one"] and len(found["one"]) == sum(one["exclusions"].values())


def test_an_export_worker_s_error_is_raised_in_the_exporting_process(store_url, settings, tmp_path, monkeypatch):
    monkeypatch.setattr(plan_module, "RUN_ROLLOUTS", 1)
    with open_store(store_url, settings=settings) as st:
        st.register_task("t1")
        for rid, ids in (("r1", [1, 2]), ("r2", [1, 2 ** 31 + 5])):
            st.start_rollout(rid, task_id="t1")
            st.record_call(make_call(f"{rid}-c0", rid, 0, prompt_ids=ids, completion_ids=[3]))
            st.finish_rollout(rid, "success")
            st.add_reward(rid, 1.0)
        with pytest.raises(ExportError, match=r"prompt_ids: a token id is 2\*\*31 or more") as err:
            export(st, tmp_path / "x", ExportConfig(format="trl", min_group_size=1), workers=2)
        assert "export worker 1 failed on run 1" in str(err.value.__cause__)

