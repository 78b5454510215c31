"""How the store encodes a call's request side: one prompt-prefix cache (a prompt prepares and hashes only its new
messages), one request hash, and an open list of API surfaces. Real SQLite and PostgreSQL, journal and not."""

from __future__ import annotations

import asyncio
import base64

import pytest
import sqlalchemy as sa

from forge_store import InvalidRecord, json_sha256, open_store
from forge_store._schema import Call
from forge_store.testing import T0
from tests.conftest import make_call, start_draft

TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]


@pytest.fixture(params=[True, False], ids=["journal", "direct"])
def store(request, store_url, settings):
    st = open_store(store_url, journal=request.param, settings=settings)
    yield st
    st.close()


def _conversation(turns: int) -> list[dict]:
    return make_call("x", "r", turns).messages


def _call(call_id: str, rollout_id: str, turn: int, **fields):
    rec = make_call(call_id, rollout_id, turn)
    for name, value in fields.items():
        setattr(rec, name, value)
    return rec


def test_any_api_surface_name_is_kept_and_a_missing_or_overlong_one_is_refused(store):
    store.record_call(_call("c0", "r1", 0, api_surface="acme.generate"))
    with pytest.raises(InvalidRecord, match="api_surface '' is not a name"):
        store.record_call(_call("c1", "r1", 1, api_surface=""))
    with pytest.raises(InvalidRecord, match="api_surface 'aaa.*is 33 characters; the store holds at most 32"):
        store.record_call(_call("c1", "r1", 1, api_surface="a" * 33))
    store.record_call(make_call("c1", "r1", 1))
    assert store.flush(30)
    assert [c.api_surface for c in store.calls("r1")] == ["acme.generate", "chat.completions"]


def test_equal_requests_hash_equal_and_the_hash_is_made_from_the_stored_request(store):
    store.record_call(make_call("a", "r1", 2))
    store.record_call(make_call("b", "r2", 2))  # the same request in another rollout (no shared cache)
    store.record_call(_call("c", "r3", 2, params={"model": "m", "temperature": 0.5}))
    assert store.flush(30)
    a, b, c = (store.calls(r)[0] for r in ("r1", "r2", "r3"))
    assert a.request_hash == b.request_hash != c.request_hash
    assert a.request_hash == json_sha256({"messages": a.message_hashes, "tools": a.tool_schema_hash,
                                          "params": a.params})


def _start(draft, call_id: str, seq: int, **fields):
    return draft.start(id=call_id, seq=seq, api_surface="chat.completions", started_at=T0, **fields)


def test_a_prompt_prepares_only_the_messages_past_the_previous_prompt(store):
    seen: list = []

    def redact(value, marks: set):
        seen.append(value)
        if isinstance(value, list):  # the tool schemas
            return value
        if "secret" in str(value.get("content")):
            marks.add("secret")
            return {**value, "content": "[REDACTED]"}
        return value

    first = store.begin_call("r1", _conversation(2), TOOLS, redact=redact)
    first.prepare()
    assert first.first_new == 0 and len(seen) == 6 + 1 and not first.marks  # six messages, the tool schemas
    a = _start(first, "a", 0)
    longer = _conversation(3)
    longer[-1] = {"role": "tool", "content": "a secret observation"}
    second = store.begin_call("r1", longer, list(TOOLS), redact=redact)  # equal schemas, another list
    assert second.first_new == 6 and not second.holds_images
    second.prepare()
    assert len(seen) == 7 + 2 and second.marks == {"secret"}  # the two new messages; the schemas: a compare
    b = _start(second, "b", 1)
    assert b.messages[-1]["content"] == "[REDACTED]" and b.messages[:6] == a.messages and b.tools is a.tools
    asyncio.run(first.finish())
    asyncio.run(second.finish())
    assert store.flush(30)
    sa_, sb = store.calls("r1")
    assert sb.message_hashes[:6] == sa_.message_hashes and sb.messages[-1]["content"] == "[REDACTED]"
    assert sb.tool_schema_hash == sa_.tool_schema_hash == json_sha256(TOOLS)
    assert sb.system_prompt_hash == json_sha256("You are a careful agent.")
    assert sb.request_hash == second.request_hash
    third = store.begin_call("r1", longer, TOOLS)  # no redaction: another kind of copy, nothing reused
    assert third.first_new == 0


def test_redaction_of_the_tool_schemas_is_stored_and_reported(store):
    def redact(value, marks: set):
        if isinstance(value, list) and "sk-secret" in str(value):
            marks.add("key")
            return [{"type": "function", "function": {"name": "[REDACTED]"}}]
        return value

    tools = [{"type": "function", "function": {"name": "sk-secret"}}]
    draft = store.begin_call("r1", _conversation(0), tools, redact=redact)
    assert draft.marks == {"key"}
    rec = _start(draft, "c0", 0)
    assert rec.tools == [{"type": "function", "function": {"name": "[REDACTED]"}}]
    again = store.begin_call("r2", _conversation(0), [dict(t) for t in tools], redact=redact)
    assert again.marks == {"key"}  # the kept copy's marks come with it
    asyncio.run(draft.finish())
    assert store.flush(30)
    assert "sk-secret" not in str(store.calls("r1")[0].tools)


def test_images_are_moved_to_blobs_and_an_undecodable_one_is_refused_before_anything_changes(store):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}
    text = [{"role": "user", "content": "look"}]
    store.begin_call("r1", text).prepare()
    bad = text + [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,*"}}]}]
    refused = store.begin_call("r1", bad)
    assert refused.holds_images
    with pytest.raises(InvalidRecord, match="message 1: image data is not valid base64"):
        refused.prepare()
    good = store.begin_call("r1", text + [{"role": "user", "content": [image]}])
    assert good.first_new == 1 and good.holds_images  # compared with the last prompt prepared, not the refused one
    rec = _start(good, "c0", 0)
    (sha,) = rec.image_hashes
    assert store.get_blob(sha) == png and "openforge-blob:sha256:" + sha in str(rec.messages[1])


def test_a_draft_is_started_once_and_finished_after_it_started(store):
    draft = store.begin_call("r1", _conversation(0))
    with pytest.raises(RuntimeError, match="finished after start"):
        asyncio.run(draft.finish())
    _start(draft, "c0", 0)
    with pytest.raises(RuntimeError, match="started twice; a retry is draft.retry"):
        _start(draft, "c1", 1)
    retry = draft.retry()
    _start(retry, "c1", 1, retry_of="c0")
    asyncio.run(draft.finish())
    asyncio.run(retry.finish())
    assert store.flush(30)
    assert [(c.id, c.retry_of) for c in store.calls("r1")] == [("c0", None), ("c1", "c0")]


def _record(store, rec):
    """The proxy's path: a draft begun from the prompt, started (its request side encoded), then finished."""
    draft = start_draft(store, rec)
    asyncio.run(draft.finish())
    return draft


def _base(store, call_id: str) -> tuple[str | None, int]:
    """The call's delta base as its row holds it: (base call, messages shared with it)."""
    assert store.flush(30)
    with store.engine.connect() as conn:
        return tuple(conn.execute(sa.select(Call.prompt_base_call_id, Call.prompt_base_len)
                                  .where(Call.id == call_id)).one())


def test_concurrent_prompts_of_one_rollout_and_a_base_that_is_the_last_recorded_call(store):
    """Sub-agents: two prompts of one rollout compared with the same previous prompt, prepared in either order, and
    a prompt that was prepared but never recorded. Each call still stores its own whole prompt, and its delta base
    is the rollout's last recorded call (the journal has its bodies), not the last prompt prepared."""
    c0 = make_call("c0", "r1", 1)
    _record(store, c0)
    a_rec = make_call("a", "r1", 2)
    b_rec = make_call("b", "r1", 2, messages=_conversation(1) + [{"role": "user", "content": "a sub-agent's task"}])
    a, b = (store.begin_call("r1", r.messages, r.tools) for r in (a_rec, b_rec))
    assert a.first_new == b.first_new == 4
    b.prepare()
    a.prepare()
    for draft, rec in ((b, b_rec), (a, a_rec)):
        draft.start(**{f: getattr(rec, f) for f in ("id", "api_surface", "started_at", "seq", "params",
                                                     "prompt_token_ids", "completion_token_ids",
                                                     "completion_logprobs", "response_message")})
        asyncio.run(draft.finish())
    assert _base(store, "b")[0] == "c0"
    assert _base(store, "a")[0] == "b"
    unrecorded = store.begin_call("r1", _conversation(4), TOOLS)
    unrecorded.prepare()  # prepared, then its call failed: never recorded
    last = make_call("c5", "r1", 5)
    draft = store.begin_call("r1", last.messages, last.tools)
    assert draft.first_new == 10  # the unrecorded prompt's copies are reused...
    _record(store, last)
    assert _base(store, "c5") == ("a", 6)  # ...but the base is the last recorded call
    got = {c.id: c.messages for c in store.calls("r1")}
    assert got == {"c0": _conversation(1), "a": _conversation(2), "b": b_rec.messages, "c5": _conversation(5)}
