"""A call the database refuses does not take its rollout down: the writer re-anchors the later calls, reads return
what the store holds and name what it does not, and an export records ``store_damaged`` and carries on."""

from __future__ import annotations

import pandas as pd
import pytest
import sqlalchemy as sa

from forge_store import StoreError, open_store
from forge_store._write.call_encoder import CallEncoder
from forge_store._write.db_apply import BatchApplier
from learner._export import export
from learner._plan import ExportConfig
from tests.conftest import make_call


def _calls(rid: str, n: int, poison: tuple[int, ...] = ()) -> list:
    """An append-only chain (each prompt = the previous prompt + completion + 2 tokens, the messages likewise);
    the calls at ``poison`` carry logprobs the database side cannot pack (the store refuses them there)."""
    prompt, out = [1, 2, 3], []
    for t in range(n):
        comp = [100 + 10 * t, 101 + 10 * t]
        rec = make_call(f"{rid}-c{t}", rid, t, prompt_ids=list(prompt), completion_ids=comp)
        if t in poison:
            rec.completion_logprobs = ["not", "numbers"]
        out.append(rec)
        prompt = prompt + comp + [50 + t, 60 + t]
    return out


def _rollout(st, rid, group, reward, poison=()):
    st.start_rollout(rid, group_id=group, task_id="t1", policy_version_id="p1")
    for rec in _calls(rid, 4, poison):
        st.record_call(rec)
    st.finish_rollout(rid, "success" if reward else "failure")
    st.add_reward(rid, reward)


def _seed(st):
    st.register_task("t1")
    st.register_policy_version("p1", model_name="m")
    st.create_group("g1", task_id="t1", target_size=2, policy_version_id="p1")


@pytest.mark.parametrize("drain", ["thread", "process"])
def test_a_refused_call_leaves_its_rollout_readable_and_the_export_lists_it(store_url, settings, drain, tmp_path):
    with open_store(store_url, journal=True, settings=settings, drain=drain) as st:
        _seed(st)
        _rollout(st, "r1", "g1", 1.0, poison=(1,))
        _rollout(st, "r2", "g1", 0.0)
        assert st.flush(30)
        assert st.writer_status()["dead_letters"] == 1
    with open_store(store_url, settings=settings) as st:
        damage: dict = {}
        calls = st.calls("r1", damage=damage)
        assert [c.id for c in calls] == ["r1-c0", "r1-c2", "r1-c3"]
        assert [(d["call_id"], d["seq"]) for d in damage["r1"]] == [("r1-c1", 1)]
        assert "refused" in damage["r1"][0]["why"] and "dead-letter" in damage["r1"][0]["why"]
        whole = _calls("r1", 4)
        for got in calls:  # the calls after the refused one were re-anchored: token- and message-exact
            want = whole[int(got.id[-1])]
            assert got.prompt_token_ids == want.prompt_token_ids and got.messages == want.messages
        assert [c.id for c in st.calls("r1")] == ["r1-c0", "r1-c2", "r1-c3"]  # without damage=: logged, not raised

        m = export(st, tmp_path / "x", ExportConfig(format="verl"))
        assert m["exclusions"] == {"store_damaged": 1}
        df = pd.read_parquet(tmp_path / "x" / "trajectories-00000.parquet")
        r1 = df[df["rollout_id"] == "r1"].iloc[0]
        assert list(r1["call_ids"]) == ["r1-c0", "r1-c2", "r1-c3"]
        # the refused call's completion is context (mask 0) of the segment, never trained on
        assert list(r1["response_mask"]) == [1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1]
        assert list(df["advantage"]) == pytest.approx([0.7071, -0.7071], abs=1e-3)  # the group is whole
        with st.engine.connect() as conn:
            row = conn.execute(sa.text("select rollout_id, call_id, detail from exclusions where reason = "
                                       "'store_damaged'")).one()
        assert (row.rollout_id, row.call_id) == ("r1", "r1-c1") and "refused" in str(row.detail)


def test_a_delta_whose_base_is_gone_reads_as_damage_not_an_error(store_url, settings, tmp_path):
    """A store written before re-anchoring (or damaged otherwise): the calls that cannot be resolved are named, the
    rest are read and exported."""
    with open_store(store_url, settings=settings) as st:
        _seed(st)
        _rollout(st, "r1", "g1", 1.0)
        _rollout(st, "r2", "g1", 0.0)
        with st.engine.begin() as conn:
            conn.execute(sa.text("delete from calls where id = 'r1-c1'"))
        damage: dict = {}
        assert [c.id for c in st.calls("r1", damage=damage)] == ["r1-c0"]
        assert [d["call_id"] for d in damage["r1"]] == ["r1-c2", "r1-c3"]
        assert "delta on call r1-c1, which is not in the store" in damage["r1"][0]["why"]
        assert "r1-c2, which cannot be read" in damage["r1"][1]["why"]
        with pytest.raises(StoreError, match="call r1-c3 cannot be read"):
            st.call("r1-c3")
        m = export(st, tmp_path / "x", ExportConfig(format="trl"))
        assert m["exclusions"] == {"store_damaged": 2} and m["counts"]["rows"]["samples"] == 2


def test_a_restarted_writer_re_anchors_past_calls_refused_before_it_started(tmp_path, settings):
    """The refused calls are read back from the dead-letter folder; two refused in a row re-anchor in one go."""
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with open_store(url, settings=settings) as st:
        enc, letters = CallEncoder(), tmp_path / "dead-letter"
        ops = [enc.encode(rec) for rec in _calls("r1", 5, poison=(1, 2))]
        assert BatchApplier(letters, 1.0).apply(st.engine, ops[:3], lambda s: True)
        fresh = BatchApplier(letters, 1.0)
        assert sorted(fresh.refused) == ["r1-c1", "r1-c2"]
        assert fresh.apply(st.engine, ops[3:], lambda s: True) and fresh.dead_letters == 0
        damage: dict = {}
        calls = st.calls("r1", damage=damage)
        whole = _calls("r1", 5)
        assert [c.id for c in calls] == ["r1-c0", "r1-c3", "r1-c4"]
        assert all(c.prompt_token_ids == whole[int(c.id[-1])].prompt_token_ids for c in calls)
        assert all(c.messages == whole[int(c.id[-1])].messages for c in calls)
        assert [d["call_id"] for d in damage["r1"]] == ["r1-c1", "r1-c2"]


@pytest.mark.parametrize("drain", ["thread", "process"])
def test_an_answered_and_a_failed_call_in_one_batch_both_land(store_url, settings, drain):
    """A call without an answer message (an upstream error) batched after answered calls: every row of one
    executemany needs the same keys, so the failed call's row carries ``response_message_hash`` None."""
    with open_store(store_url, journal=True, settings=settings, drain=drain) as st:
        _seed(st)
        st.start_rollout("r1", group_id="g1", task_id="t1", policy_version_id="p1")
        ok = make_call("r1-c0", "r1", 0)
        failed = make_call("r1-c1", "r1", 1, completion_ids=[], error_class="upstream_error",
                           error_detail="engine said 500")
        failed.response, failed.response_message, failed.completion_logprobs = None, None, None
        failed.finish_reason, failed.token_exact = None, False
        for rec in (ok, failed, make_call("r1-c2", "r1", 2)):
            st.record_call(rec)
        assert st.flush(30)
        assert st.writer_status()["dead_letters"] == 0
    with open_store(store_url, settings=settings) as st:
        calls = st.calls("r1")
        assert [c.id for c in calls] == ["r1-c0", "r1-c1", "r1-c2"]
        assert calls[1].response_message is None and calls[1].error_class == "upstream_error"
