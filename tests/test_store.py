"""The Store API on real SQLite and real PostgreSQL: idempotency, order, deltas, watermarks, append-only rows.

One job, the contract of ``Store``'s own reads and writes, over one fixture (each backend, written directly and
through the journal); over 400 lines because that contract is wide. Parts with a job of their own have their own
files (damage: test_store_damage.py, token reads: test_export_batched.py, replicas: test_proxy_replicas.py)."""

from __future__ import annotations

from collections import defaultdict

import pytest
import sqlalchemy as sa

from forge_store import InvalidRecord, NotFound, RolloutFilter, open_store
from forge_store._schema import Call, Message
from tests.conftest import make_call, start_draft


@pytest.fixture(params=[False, True], ids=["direct", "journal"])
def store(request, store_url, settings):
    st = open_store(store_url, journal=request.param, settings=settings)
    yield st
    st.close()


def _seed_rollout(st, rid="r1", turns=5):
    st.register_task("t1", domain="files", metadata={"reference_steps": 3})
    st.register_policy_version("p1", model_name="smollm2")
    st.create_group("g1", task_id="t1", target_size=2, policy_version_id="p1")
    st.start_rollout(rid, group_id="g1", task_id="t1", policy_version_id="p1", backend="local")
    for turn in range(turns):
        st.record_call(make_call(f"{rid}-c{turn}", rid, turn, policy_version_id="p1"))
    st.flush()


def test_calls_round_trip_in_order_with_full_prompts(store):
    _seed_rollout(store, turns=4)
    calls = store.calls("r1")
    assert [c.id for c in calls] == ["r1-c0", "r1-c1", "r1-c2", "r1-c3"]
    for turn, c in enumerate(calls):
        expected = make_call("x", "r1", turn)
        assert c.messages == expected.messages
        assert c.prompt_token_ids == expected.prompt_token_ids
        assert c.completion_token_ids == expected.completion_token_ids
        assert c.completion_logprobs == pytest.approx([-0.5] * 3)
        assert c.tools == expected.tools
        assert c.params == {"model": "m", "temperature": 1.0}
        assert c.token_exact and c.policy_version_id == "p1" and c.finish_reason == "stop"
        assert c.response_message == {"role": "assistant", "content": f"action {turn}"}
        assert c.started_at.tzinfo is not None


def test_recording_the_same_call_twice_leaves_one_row(store):
    _seed_rollout(store, turns=2)
    store.record_call(make_call("r1-c1", "r1", 1))
    store.flush()
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(Call)).scalar_one() == 2


def test_same_call_from_a_second_writer_is_one_row(store_url, settings):
    """Two processes' stores (fresh encoders) recording one id: still one row."""
    with open_store(store_url, settings=settings) as a, open_store(store_url, settings=settings) as b:
        a.record_call(make_call("c", "r", 0))
        b.record_call(make_call("c", "r", 0))
        assert len(a.calls("r")) == 1


def test_prompts_are_stored_as_deltas(store):
    _seed_rollout(store, turns=6)
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(Call.__table__).order_by(Call.seq)).all()
        n_messages = conn.execute(sa.select(sa.func.count()).select_from(Message)).scalar_one()
    # each later call stores only its new messages and tokens
    assert rows[0].prompt_base_call_id is None and len(rows[0].prompt_tail) == 2
    for prev, row in zip(rows, rows[1:]):
        assert row.prompt_base_call_id == prev.id
        assert len(row.prompt_tail) == 2  # the assistant turn + the new observation
        assert row.prompt_ids_base_call_id == prev.id
        assert row.prompt_ids_prefix_len == len(make_call("x", "r", prev.seq).prompt_token_ids)
    distinct = {m["content"] for t in range(6) for m in make_call("x", "r", t).messages}
    distinct.add("action 5")  # the last answer, not yet in any prompt; earlier answers share their prompt hashes
    assert n_messages == len(distinct)


def test_prompt_that_does_not_extend_starts_fresh(store):
    """Context compaction: a prompt that is not a prefix extension is stored whole and reads back exactly."""
    store.record_call(make_call("a", "r", 0))
    compacted = [{"role": "system", "content": "summary of earlier work"}, {"role": "user", "content": "go on"}]
    store.record_call(make_call("b", "r", 1, messages=compacted, prompt_ids=[900, 901, 902]))
    store.flush()
    a, b = store.calls("r")
    assert b.messages == compacted and b.prompt_token_ids == [900, 901, 902]
    with store.engine.connect() as conn:
        row = conn.execute(sa.select(Call.__table__).where(Call.id == "b")).one()
    assert row.prompt_ids_base_call_id is None and row.prompt_ids_prefix_len == 0


def test_partial_token_prefix(store):
    """A template that drops the previous completion's tail: the shared prefix is reused, the rest stored."""
    store.record_call(make_call("a", "r", 0, prompt_ids=[1, 2, 3, 4], completion_ids=[5, 6, 7]))
    store.record_call(make_call("b", "r", 1, prompt_ids=[1, 2, 3, 4, 5, 99, 100]))
    store.flush()
    assert store.calls("r")[1].prompt_token_ids == [1, 2, 3, 4, 5, 99, 100]
    assert store.call("b").prompt_token_ids == [1, 2, 3, 4, 5, 99, 100]


def test_calls_without_ids_and_without_rollout(store):
    rec = make_call("hosted", None, 0, prompt_ids=None, completion_ids=None)
    rec.prompt_token_ids = rec.completion_token_ids = rec.completion_logprobs = None
    rec.token_exact = False
    store.record_call(rec)
    store.flush()
    c = store.call("hosted")
    assert c.prompt_token_ids is None and c.completion_token_ids is None and not c.token_exact


def test_watermark_is_monotonic_and_pins_reads(store):
    w0 = store.watermark()
    _seed_rollout(store, turns=2)
    w1 = store.watermark()
    assert w1 > w0
    store.record_call(make_call("r1-c2", "r1", 2))
    store.finish_rollout("r1", "success")
    store.add_reward("r1", 1.0, verifier_version="v1")
    store.flush()
    w2 = store.watermark()
    assert w2 > w1
    assert [c.id for c in store.calls("r1", as_of=w1)] == ["r1-c0", "r1-c1"]
    assert store.rollout("r1", as_of=w1).status == "running"
    assert store.rollout("r1", as_of=w1).outcome is None
    assert store.rollout("r1").outcome == "success"
    assert store.rewards("r1", as_of=w1) == []
    traj = store.trajectory("r1")
    assert len(traj.calls) == 3 and traj.rewards[0].value == 1.0 and traj.rollout.status == "finished"


def test_rewards_and_events_are_append_only(store):
    _seed_rollout(store, turns=1)
    first = store.add_reward("r1", 0.0)
    store.add_reward("r1", 1.0, source="judge")
    store.add_reward("r1", 0.0, id=first)  # replay of the first: no new row, no overwrite
    store.add_event("sandbox.started", source="local", rollout_id="r1", detail={"pid": 1})
    store.add_event("sandbox.started", source="local", rollout_id="r1", detail={"pid": 1})
    store.flush()
    assert [(r.value, r.source) for r in store.rewards("r1")] == [(0.0, "verifier"), (1.0, "judge")]
    assert len(store.events("r1")) == 2


def test_first_finish_wins(store):
    _seed_rollout(store, turns=1)
    store.finish_rollout("r1", "infra_error", detail="sandbox lost")
    store.finish_rollout("r1", "success")
    store.flush()
    r = store.rollout("r1")
    assert (r.outcome, r.outcome_detail, r.status) == ("infra_error", "sandbox lost", "finished")


def test_finish_without_start_creates_the_row(store):
    store.finish_rollout("orphan", "cancelled")
    store.flush()
    assert store.rollout("orphan").outcome == "cancelled"


def test_iter_rollouts_filters(store):
    _seed_rollout(store, "r1", turns=1)
    store.start_rollout("r2", task_id="t2")
    store.finish_rollout("r1", "failure")
    store.flush()
    assert [r.id for r in store.iter_rollouts()] == ["r1", "r2"]
    assert [r.id for r in store.iter_rollouts(RolloutFilter(task_id="t2"))] == ["r2"]
    assert [r.id for r in store.iter_rollouts(RolloutFilter(outcome="failure"))] == ["r1"]
    assert [r.id for r in store.iter_rollouts(RolloutFilter(finished=False))] == ["r2"]


def test_blobs_are_content_addressed_and_stored_once(store):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 10
    a = store.put_blob(png, "image/png")
    b = store.put_blob(png, "image/png")
    store.flush()
    assert a == b and store.get_blob(a) == png
    assert store.counts()["blobs"] == 1
    assert len(list(store.blobs.root.rglob(a))) == 1


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda st: st.finish_rollout("r", "exploded"), "rollout outcome 'exploded' is not one of"),
        (lambda st: st.add_exclusion("bored", rollout_id="r"), "exclusion reason 'bored'"),
        (lambda st: st.add_exclusion("filtered"), "pass rollout_id, call_id"),
        (lambda st: st.add_reward("r", float("nan")), "NaN"),
        (lambda st: st.add_reward("r", float("inf")), "is inf: a reward is a finite number"),
        (lambda st: st.add_reward("r", float("-inf")), "is -inf: a reward is a finite number"),
        (lambda st: st.add_reward("r", 1.0, source="vibes"), "reward source 'vibes'"),
        (lambda st: st.create_group(task_id="t", target_size=0), "at least 1"),
    ],
)
def test_invalid_records_are_rejected_with_the_rule(store, call, message):
    with pytest.raises(InvalidRecord, match=message):
        call(store)


def test_logprob_count_must_match_tokens(store):
    rec = make_call("c", "r", 0)
    rec.completion_logprobs = [-1.0]
    with pytest.raises(InvalidRecord, match="1 logprobs for 3 completion tokens"):
        store.record_call(rec)


def test_unknown_reads_say_not_found(store):
    with pytest.raises(NotFound, match="rollout 'nope'"):
        store.rollout("nope")
    with pytest.raises(NotFound, match="call 'nope'"):
        store.call("nope")


async def _record_async(store):
    import asyncio

    await asyncio.gather(*(start_draft(store, make_call(f"c{i}", f"r{i % 3}", i)).finish() for i in range(30)))


def test_call_drafts_finish_concurrently(store):
    import asyncio

    asyncio.run(_record_async(store))
    store.flush()
    assert sum(len(store.calls(f"r{k}")) for k in range(3)) == 30


def test_prompt_ids_as_text_store_the_same_ids_and_deltas_as_lists(store):
    """The proxy hands prompt ids over as the engine's JSON text (IdsText): same ids read back, same deltas."""
    import random

    from forge_store._tokens import IdsText

    rng = random.Random(3)
    prompt, expected = [], []
    for turn in range(12):
        # extend the previous prompt + completion, cut it back (a template dropping the completion's tail), or
        # start over (context compaction); ids of every width, so that text prefixes end mid-id
        kind = rng.choice(["extend", "extend", "cut", "fresh"])
        if kind == "fresh" or not expected:
            prompt = [rng.randrange(0, 50_000) for _ in range(rng.randrange(1, 40))]
        else:
            base = expected[-1][0] + expected[-1][1]
            keep = len(base) if kind == "extend" else rng.randrange(0, len(base))
            prompt = base[:keep] + [rng.choice([1, 12, 123, 1234, 12345, rng.randrange(50_000)])
                                    for _ in range(rng.randrange(0, 6))]
        completion = [rng.randrange(0, 50_000) for _ in range(rng.randrange(0, 4))]
        rec = make_call(f"c{turn}", "r", turn, prompt_ids=prompt, completion_ids=completion)
        rec.completion_logprobs = [-0.5] * len(completion)
        if turn % 3:  # mix both forms in one rollout
            rec.prompt_token_ids = IdsText(",".join(map(str, prompt)).encode())
        store.record_call(rec)
        expected.append((prompt, completion))
    store.flush()
    got = [(c.prompt_token_ids, c.completion_token_ids) for c in store.calls("r")]
    assert got == expected
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(Call.__table__).order_by(Call.seq)).all()
    assert [r.n_prompt_tokens for r in rows] == [len(p) for p, _ in expected]
    assert any(r.prompt_ids_prefix_len for r in rows[1:] if int(r.id[1:]) % 3)  # text calls got deltas too


@pytest.mark.parametrize("drain", ["thread", "process"])
def test_message_bodies_are_journaled_once_ahead_of_their_calls(store_url, settings, monkeypatch, drain):
    """The proxy's path (``draft.start`` while the upstream works, then ``draft.finish``): a prompt's new
    message and tool bodies go into the journal ahead of the call, each body once over the whole rollout (the
    previous answer, now in the history, is not repeated), and the call's own record carries only the answer's
    side. Everything reads back as recorded, on both databases."""
    import asyncio

    from forge_store._write import journaling_writer

    ops = []
    real_pack = journaling_writer.pack_op
    monkeypatch.setattr(journaling_writer, "pack_op", lambda op: (ops.append(op), real_pack(op))[1])
    settings = settings.model_copy(update={"journal_fsync": False})
    recs = [make_call(f"c{t}", "r", t) for t in range(5)]

    async def run(st):
        for rec in recs:
            await start_draft(st, rec).finish()

    with open_store(store_url, journal=True, settings=settings, drain=drain) as st:
        asyncio.run(run(st))
        st.flush()
        got = st.calls("r")
    assert [(c.messages, c.response_message, c.tools) for c in got] == [
        (r.messages, r.response_message, r.tools) for r in recs]
    kinds = [op["k"] for op in ops]
    assert kinds[0] == "msgs" and kinds.count("call") == 5
    bodies = [body for op in ops for _, body in (op.get("msgs") or {}).values()]
    answers = [op["resp"] for op in ops if op["k"] == "call"]
    assert len(bodies) == len(set(bodies)) and not any("msgs" in op for op in ops if op["k"] == "call")
    assert {"role": "assistant", "content": "action 0"} in answers  # journaled with its call...
    assert '{"content":"action 0","role":"assistant"}' not in bodies  # ...and not again as the next prompt's
    assert sum(1 for op in ops if op.get("tools")) == 1


def test_a_previous_answer_spelled_differently_in_the_next_prompt_is_stored_as_sent(store):
    """The next prompt repeats the previous answer; where it is equal in Python but not in JSON (1 against 1.0) it
    is a different message and is stored as the harness sent it."""
    first = make_call("c0", "r", 0)
    first.response_message = {"role": "assistant", "content": "action 0", "n": 1}
    second = make_call("c1", "r", 1)
    second.messages[2] = {"role": "assistant", "content": "action 0", "n": 1.0}
    store.record_call(first)
    store.record_call(second)
    store.flush()
    a, b = store.calls("r")
    assert a.response_message == {"role": "assistant", "content": "action 0", "n": 1}
    assert isinstance(a.response_message["n"], int) and isinstance(b.messages[2]["n"], float)


def test_nul_characters_are_stored_and_the_rollout_stays_readable(store, store_url, tmp_path):
    """PostgreSQL refuses U+0000 in jsonb and text (SQLite keeps it). A model's answer, a sampling parameter, tool
    call arguments, metadata, an error text and a model name with one in them: the call lands (not a dead letter),
    JSON comes back exactly, and the next call, whose prompt is a delta on it, is readable. Free text is the one
    change on PostgreSQL: U+0000 becomes U+FFFD there. A JSON value shaped like the store's own wrapper (and a
    text with a backslash-u0000 that is not U+0000) come back as written."""
    from forge_store._schema import JSON_WRAP

    pg = store_url.startswith("postgresql")
    answer = {"role": "assistant", "content": "bytes: \x00\x01",
              "tool_calls": [{"id": "t", "type": "function", "function": {"name": "w", "arguments": '{"b": "\\u0000"}'}}]}
    odd = make_call("c1", "r1", 1, model="m\x00x", error_class="upstream_http_500", error_detail="body \x00 here",
                    metadata={"user_agent": "ua", "note": {JSON_WRAP: "not the store's"}, "k\x00": "v"})
    odd.params = {"model": "m", "stop": ["\x00"], "logit_bias": {"\x00": 1}}
    odd.response, odd.response_message = {"text": answer["content"], "tool_calls": answer["tool_calls"]}, answer
    shaped = make_call("c2", "r1", 2)
    shaped.params, shaped.response = {JSON_WRAP: "{}"}, {"text": "a literal \\u0000, no NUL"}
    for call in (make_call("c0", "r1", 0), odd, shaped, make_call("c3", "r1", 3)):
        store.record_call(call)
    assert store.flush(30)
    assert store.writer_status().get("dead_letters", 0) == 0
    calls = {c.id: c for c in store.calls("r1")}
    assert list(calls) == ["c0", "c1", "c2", "c3"]
    got = calls["c1"]
    assert got.response == odd.response and got.response_message == answer
    assert got.params == odd.params and got.metadata == odd.metadata
    assert (got.model, got.error_detail) == (("m\ufffdx", "body \ufffd here") if pg else ("m\x00x", "body \x00 here"))
    assert calls["c2"].params == {JSON_WRAP: "{}"} and calls["c2"].response == shaped.response
    assert calls["c3"].messages == make_call("x", "r1", 3).messages  # its prompt is a delta on c2, on c1

    light = {c.id: c for c in store.call_summaries(["r1"])["r1"]}
    assert light["c1"].response == odd.response and light["c2"].response == shaped.response

    import json

    import pyarrow.parquet as pq

    from forge_store._snapshot import snapshot

    snapshot(store.engine, tmp_path / "snap")  # what SQL over a snapshot reads: the values themselves, unwrapped
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "snap" / "calls.parquet").to_pylist()}
    assert json.loads(rows["c1"]["response"]) == odd.response
    assert json.loads(rows["c2"]["request_params"]) == {JSON_WRAP: "{}"}


@pytest.mark.parametrize("field, value, rule", [
    ("finish_reason", "f" * 33, "finish_reason 'fff.*is 33 characters; the store holds at most 32"),
    ("rollout_id", "r" * 129, "rollout_id 'rrr.*' is 129 characters; the store holds at most 128"),
    ("error_class", {"not": "text"}, r"error_class .* is not a string"),
    ("seq", 2**63, r"seq 9223372036854775808 is outside the store's range for it"),
    ("response", {"text": "half a pair: \ud800 here"},
     r"call record holds text that is not valid Unicode \('\\ud800' in "),
])
def test_a_call_the_store_cannot_keep_is_refused_up_front_and_the_rollout_goes_on(store, field, value, rule):
    """PostgreSQL refuses a value past its column's length or range (SQLite does not); UTF-8 (the journal, both
    databases) cannot hold a lone surrogate, which a Python string can. Refused by ``record_call`` at once, journal
    or not, on both databases, rather than dead-lettered later; the refused call changes nothing."""
    store.record_call(make_call("c0", "r1", 0))
    bad = make_call("c1", "r1", 1)
    setattr(bad, field, value)
    with pytest.raises(InvalidRecord, match=rule):
        store.record_call(bad)
    store.record_call(make_call("c1", "r1", 1))
    store.record_call(make_call("c2", "r1", 2))
    assert store.flush(30)
    assert [c.id for c in store.calls("r1")] == ["c0", "c1", "c2"]
    assert store.calls("r1")[2].messages == make_call("x", "r1", 2).messages


def test_other_rows_past_a_column_length_are_refused_up_front(store):
    with pytest.raises(InvalidRecord, match="rollout id 'xxx.*is 200 characters; the store holds at most 128"):
        store.start_rollout("x" * 200)
    with pytest.raises(InvalidRecord, match="task id .* is 129 characters"):
        store.register_task("t" * 129)
    with pytest.raises(InvalidRecord, match=r"rollout attempt 4294967296 is outside the store's range for it "
                                            r"\(-2147483648 to 2147483647\)"):
        store.start_rollout("r1", attempt=2**32)
    assert store.counts()["rollouts"] == store.counts()["tasks"] == 0


def test_nan_and_infinity_in_json_fields_are_stored_and_snapshotted(store, tmp_path):
    """JSON has no NaN or Infinity, Python's json writes them, SQLite keeps them and PostgreSQL's jsonb refuses them:
    a metric in a call's or a rollout's metadata holding one lands on both (not a dead letter), reads back, and a
    snapshot holds it as written."""
    import json
    import math

    import pyarrow.parquet as pq

    from forge_store._snapshot import snapshot

    store.start_rollout("r1", metadata={"wall_s": float("inf")})
    for turn in range(3):
        call = make_call(f"c{turn}", "r1", turn)
        if turn == 1:
            call.metadata = {"score": float("nan"), "bound": float("-inf")}
        store.record_call(call)
    assert store.flush(30)
    calls = store.calls("r1")
    assert [c.id for c in calls] == ["c0", "c1", "c2"] and calls[2].messages == make_call("x", "r1", 2).messages
    assert math.isnan(calls[1].metadata["score"]) and calls[1].metadata["bound"] == float("-inf")
    assert store.rollout("r1").metadata == {"wall_s": float("inf")}
    snapshot(store.engine, tmp_path / "snap")
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "snap" / "calls.parquet").to_pylist()}
    assert rows["c1"]["metadata"] == '{"bound":-Infinity,"score":NaN}'
    assert json.loads(pq.read_table(tmp_path / "snap" / "rollouts.parquet").to_pylist()[0]["metadata"]) == {
        "wall_s": float("inf")}


def test_group_index_counts_what_iter_rollouts_reads(store):
    store.register_task("t1")
    store.create_group("g1", task_id="t1", target_size=2)
    store.start_rollout("r1", task_id="t1", group_id="g1")
    store.start_rollout("r2", task_id="t1")
    store.start_rollout("r4", task_id="t1", group_id="")  # an empty group id: no group, as the planner reads it
    store.finish_rollout("r1", "success")
    store.flush()
    wm = store.watermark()
    store.start_rollout("r3", task_id="t1", group_id="g1")
    store.finish_rollout("r2", "failure")  # after the watermark: not finished as of it
    store.finish_rollout("r4", "failure")
    store.flush()
    for as_of in (None, wm):
        expected = defaultdict(lambda: [0, 0])
        for r in store.iter_rollouts(as_of=as_of):
            key = (r.group_id, None) if r.group_id else (None, r.id)
            expected[key][0] += r.status == "finished"
            expected[key][1] += 1
        assert sorted(store.group_index(as_of=as_of), key=repr) == sorted(
            ((g, rid, n, seen) for (g, rid), (n, seen) in expected.items()), key=repr)
    assert sorted(store.group_index(as_of=wm), key=repr) == [
        ("g1", None, 1, 1), (None, "r2", 0, 1), (None, "r4", 0, 1)]
    assert {g: [i.id for i in infos] for g, infos in store.group_rollouts(["g1", "nope"]).items()} == {
        "g1": ["r1", "r3"]}
    assert [i.status for i in store.group_rollouts(["g1"], as_of=wm)["g1"]] == ["finished"]
    assert [g["id"] for g in store.lineage("rollout_groups", ids=["g1", "g9"])] == ["g1"]
    assert store.lineage("rollout_groups", ids=[]) == []
