"""Per-rollout budgets (``proxy._budgets``): calls, tokens and wall time, given at registration or by the settings'
defaults. A call over budget never goes upstream, is recorded (``budget_exceeded``) and is answered in its API's
error shape with a 400 the official SDKs raise as a ``BadRequestError`` (no retry) whose message a harness shows."""

from __future__ import annotations

import time

import anthropic
import openai
import pytest

from proxy.engines.scripted import Text
from rollout import AdminClient
from tests.proxy_fixtures import running_proxy

HEADER = "X-OpenForge-Call-Id"
USER = [{"role": "user", "content": "hi"}]


def _call(px, surface: str, token: str, stream: bool = False):
    """One call on ``surface`` through its official SDK, the answer read whole."""
    if surface == "messages":
        c = anthropic.Anthropic(base_url=px.url, api_key=token, max_retries=0)
        answer = c.messages.create(model="m", max_tokens=64, messages=USER, stream=stream)
    elif surface == "responses":
        answer = px.client(token).responses.create(model="m", input="hi", stream=stream)
    elif surface == "completions":
        answer = px.client(token).completions.create(model="m", prompt="The sky is", max_tokens=8, stream=stream)
    else:
        answer = px.client(token).chat.completions.create(model="m", messages=USER, stream=stream)
    return list(answer) if stream else answer


def _refused(px, surface: str, token: str, stream: bool = False) -> tuple[dict, str, str]:
    """The call refused for its budget: the error body as sent, the message the SDK's exception shows, the call id."""
    error = anthropic.BadRequestError if surface == "messages" else openai.BadRequestError
    sent = len(px.up.double.requests)
    with pytest.raises(error) as err:
        _call(px, surface, token, stream)
    assert len(px.up.double.requests) == sent  # never went upstream
    assert err.value.status_code == 400
    return err.value.response.json(), str(err.value), err.value.response.headers[HEADER]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("surface", ["chat.completions", "completions", "responses", "messages"])
def test_max_calls_refuses_in_each_protocols_shape_and_records_the_refusal(px, surface, stream):
    px.up.double.script.extend([Text("one"), Text("two")])
    token = px.register("r1", max_calls=2)
    _call(px, surface, token, stream)
    _call(px, surface, token, stream)
    body, shown, call_id = _refused(px, surface, token, stream)
    if surface == "messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["code"] == "budget_exceeded" and body["error"]["type"] == "invalid_request_error"
    message = body["error"]["message"]
    assert "'r1' has spent its budget" in message and "max_calls of 2" in message and message in shown
    calls = px.calls("r1")
    assert [c.error_class for c in calls] == [None, None, "budget_exceeded"]
    refused = calls[-1]
    assert refused.id == call_id and refused.api_surface == surface and refused.upstream_status is None
    assert refused.error_detail == message and refused.streamed is stream
    assert refused.messages  # the refused request is recorded whole
    _refused(px, surface, token, stream)  # and stays refused; a refusal is not counted as a call
    assert [c.error_class for c in px.calls("r1")][2:] == ["budget_exceeded"] * 2


def test_max_tokens_counts_the_recorded_usage_of_earlier_calls(px):
    px.up.double.script.extend([Text("one two three"), Text("four"), Text("five")])
    client = px.client(px.register("probe"))
    first = client.chat.completions.create(model="m", messages=USER)
    used = first.usage.prompt_tokens + first.usage.completion_tokens
    (recorded,) = px.calls("probe")
    assert recorded.usage["prompt_tokens"] + recorded.usage["completion_tokens"] == used
    # room for one such call and a little more: the second starts under the limit and crosses it, the third is refused
    token = px.register("r1", max_tokens=used + 1)
    _call(px, "chat.completions", token)
    _call(px, "chat.completions", token)
    body, _, _ = _refused(px, "chat.completions", token)
    assert f"its max_tokens of {used + 1:,}" in body["error"]["message"]
    assert [c.error_class for c in px.calls("r1")] == [None, None, "budget_exceeded"]


def test_max_tokens_on_messages_counts_input_and_output_tokens(px):
    px.up.double.script.extend([Text("hello")])
    token = px.register("r1", max_tokens=1)
    _call(px, "messages", token)
    body, shown, _ = _refused(px, "messages", token)
    assert body == {"type": "error", "error": {"type": "invalid_request_error", "message": body["error"]["message"]}}
    assert "tokens (prompt + completion)" in shown


def test_max_wall_s_counts_from_registration(px):
    px.up.double.script.extend([Text("in time")])
    token = px.register("r1", max_wall_s=0.5)
    _call(px, "responses", token)
    time.sleep(0.6)
    body, _, _ = _refused(px, "responses", token, stream=True)
    assert "past its max_wall_s of 0.5s" in body["error"]["message"]
    assert [c.error_class for c in px.calls("r1")] == [None, "budget_exceeded"]


def test_settings_give_the_default_budget_and_a_registration_overrides_it(up, tmp_path):
    with running_proxy(up, tmp_path, proxy_rollout_max_calls=1, proxy_rollout_max_wall_s=600) as px:
        up.double.script.extend([Text("a"), Text("b"), Text("c")])
        r = px.admin("POST", "/admin/rollouts", json={"rollout_id": "d"})
        assert r.json()["budget"] == {"max_calls": 1, "max_tokens": None, "max_wall_s": 600}
        token = r.json()["token"]
        _call(px, "chat.completions", token)
        _refused(px, "chat.completions", token)
        more = px.register("more", max_calls=2, max_tokens=10_000)
        _call(px, "chat.completions", more)
        _call(px, "chat.completions", more)
        _refused(px, "chat.completions", more)


def test_no_budget_by_default(px):
    px.up.double.script.extend([Text(str(i)) for i in range(5)])
    r = px.admin("POST", "/admin/rollouts", json={"rollout_id": "r1"})
    assert r.json()["budget"] == {"max_calls": None, "max_tokens": None, "max_wall_s": None}
    for _ in range(5):
        _call(px, "chat.completions", r.json()["token"])
    assert [c.error_class for c in px.calls("r1")] == [None] * 5


def test_registering_again_keeps_what_was_spent(px):
    """The admin client retries a registration whose answer it lost: the budget's count and clock go on."""
    px.up.double.script.extend([Text("a"), Text("b")])
    token = px.register("r1", max_calls=1)
    _call(px, "chat.completions", token)
    again = px.register("r1", max_calls=1)
    _refused(px, "chat.completions", again)


def test_registration_refuses_an_empty_budget(px):
    for field in ("max_calls", "max_tokens", "max_wall_s"):
        r = px.admin("POST", "/admin/rollouts", json={"rollout_id": "r1", field: 0})
        assert r.status_code == 400 and field in r.text  # the admin API's own 400, naming the field


def test_the_admin_client_sends_the_budget_it_is_given(px):
    px.up.double.script.extend([Text("a")])
    admin = AdminClient(px.url, px.proxy.admin_token)
    try:
        reg = admin.register_rollout(rollout_id="r1", task_id="t1", max_calls=1)
        assert reg["budget"] == {"max_calls": 1, "max_tokens": None, "max_wall_s": None}
        _call(px, "chat.completions", reg["token"])
        _refused(px, "chat.completions", reg["token"])
        # limits not given are not sent (a proxy without budgets refuses unknown fields)
        assert admin.register_rollout(rollout_id="r2", max_tokens=None)["budget"]["max_tokens"] is None
    finally:
        admin.close()
