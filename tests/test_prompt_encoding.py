"""How the store encodes a call's request side: one prompt-prefix cache (a prompt prepares and hashes only its new
messages), one request hash, and an open list of API surfaces. Real SQLite and PostgreSQL, journal and not."""

from __future__ import annotations

import asyncio
import base64

import pytest

from forge_store import InvalidRecord, json_sha256, open_store
from tests.conftest import make_call

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


def test_a_prompt_prepares_only_the_messages_past_the_previous_prompt(store):
    seen: list[dict] = []

    def prepare(message: dict, marks: set) -> dict:
        seen.append(message)
        if "secret" in str(message.get("content")):
            marks.add("secret")
            return {**message, "content": "[REDACTED]"}
        return message

    first = store.prompt("r1", _conversation(2), TOOLS, prepare=prepare)
    first.prepare()
    assert first.first_new == 0 and len(seen) == 6 and not first.marks
    longer = _conversation(3)
    longer[-1] = {"role": "tool", "content": "a secret observation"}
    second = store.prompt("r1", longer, TOOLS, prepare=prepare)
    assert second.first_new == 6 and not second.holds_images
    second.prepare()
    assert len(seen) == 8 and second.marks == {"secret"} and second.messages[-1]["content"] == "[REDACTED]"
    assert second.messages[:6] == first.messages and second.hashes[:6] == first.hashes
    assert second.tools_hash == first.tools_hash == json_sha256(TOOLS)
    assert second.system_hash == json_sha256("You are a careful agent.")
    third = store.prompt("r1", longer, TOOLS)  # no hook: another kind of copy, nothing reused
    assert third.first_new == 0


def test_images_are_moved_to_blobs_and_an_undecodable_one_is_refused_before_anything_changes(store):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}
    text = [{"role": "user", "content": "look"}]
    store.prompt("r1", text).prepare()
    bad = text + [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,*"}}]}]
    refused = store.prompt("r1", bad)
    assert refused.holds_images
    with pytest.raises(InvalidRecord, match="message 1: image data is not valid base64"):
        refused.prepare()
    good = store.prompt("r1", text + [{"role": "user", "content": [image]}])
    assert good.first_new == 1 and good.holds_images  # compared with the last prompt prepared, not the refused one
    good.prepare()
    (sha,) = good.image_hashes
    assert store.get_blob(sha) == png and "openforge-blob:sha256:" + sha in str(good.messages[1])


def _record(store, rec, prompt):
    """The proxy's path: the record made from the prepared prompt, its request side encoded, then the whole call."""
    prompt.prepare()
    rec.messages = prompt.messages
    part = store.encode_prompt(rec, prompt)
    asyncio.run(store.record_call_async(rec, part))
    return part


def test_concurrent_prompts_of_one_rollout_and_a_base_that_is_the_last_recorded_call(store):
    """Sub-agents: two prompts of one rollout compared with the same previous prompt, prepared in either order, and
    a prompt that was prepared but never recorded. Each call still stores its own whole prompt, and its delta base
    is the rollout's last recorded call (the journal has its bodies), not the last prompt prepared."""
    c0 = make_call("c0", "r1", 1)
    _record(store, c0, store.prompt("r1", c0.messages, c0.tools))
    a_rec = make_call("a", "r1", 2)
    b_rec = make_call("b", "r1", 2, messages=_conversation(1) + [{"role": "user", "content": "a sub-agent's task"}])
    a, b = (store.prompt("r1", r.messages, r.tools) for r in (a_rec, b_rec))
    assert a.first_new == b.first_new == 4
    b.prepare()
    a.prepare()
    assert _record(store, b_rec, b).base_call == "c0"
    assert _record(store, a_rec, a).base_call == "b"
    unrecorded = store.prompt("r1", _conversation(4), TOOLS)
    unrecorded.prepare()  # prepared, then its call failed: never recorded
    last = make_call("c5", "r1", 5)
    prompt = store.prompt("r1", last.messages, last.tools)
    assert prompt.first_new == 10  # the unrecorded prompt's copies are reused...
    part = _record(store, last, prompt)
    assert part.base_call == "a" and part.base_len == 6  # ...but the base is the last recorded call
    assert store.flush(30)
    got = {c.id: c.messages for c in store.calls("r1")}
    assert got == {"c0": _conversation(1), "a": _conversation(2), "b": b_rec.messages, "c5": _conversation(5)}
