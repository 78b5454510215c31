"""The model that answers is the model recorded (issue 32): whatever model name a harness asks for, the upstream
receives the active policy version's served model, and the store holds both names and the right version; a name the
operator keeps (``model_map``) is served by its own version and recorded under it. Through the official SDKs of all
five protocols, against the scripted engine."""

from __future__ import annotations


import anthropic
import pytest
from google import genai
from google.genai import types
from typer.testing import CliRunner

from openforge.cli import build_app
from proxy.engines.scripted import Text
from tests.proxy_fixtures import running_proxy

USER = [{"role": "user", "content": "hi"}]


def _ask(px, token: str, protocol: str, model: str) -> str:
    """One call through ``protocol`` asking for ``model``; the model name the answer gives back."""
    if protocol == "messages":
        msg = anthropic.Anthropic(base_url=px.url, api_key=token, max_retries=0).messages.create(
            model=model, max_tokens=16, messages=USER)
        return msg.model
    if protocol == "gemini":
        with genai.Client(api_key=token, http_options=types.HttpOptions(base_url=px.url)) as gemini:
            return gemini.models.generate_content(model=model, contents="hi").model_version
    client = px.client(token)
    if protocol == "chat":
        return client.chat.completions.create(model=model, messages=USER).model
    if protocol == "completions":
        return client.completions.create(model=model, prompt="hi", max_tokens=8).model
    return client.responses.create(model=model, input="hi").model


def _policy(px, version: str, model: str, activate: bool = True) -> None:
    r = px.admin("POST", "/admin/policy_versions", json={"id": version, "model_name": model, "activate": activate})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("protocol", ["chat", "completions", "responses", "messages", "gemini"])
def test_another_model_asked_for_is_served_by_the_active_versions_model(up, tmp_path, protocol):
    with running_proxy(up, tmp_path) as px:
        _policy(px, "policy-a-v1", "policy-a")
        up.double.script.extend([Text("ok")])
        _ask(px, px.register("r1"), protocol, "teacher-big")
        assert up.double.requests[-1].json["model"] == "policy-a"
        (call,) = px.calls("r1")
        assert call.policy_version_id == "policy-a-v1" and call.model == "policy-a", call
        assert call.metadata["model_requested"] == "teacher-big", call.metadata


def test_the_served_name_asked_for_leaves_no_mark(up, tmp_path):
    with running_proxy(up, tmp_path) as px:
        _policy(px, "v1", "policy-a")
        up.double.script.extend([Text("ok")])
        px.client(px.register("r1")).chat.completions.create(model="policy-a", messages=USER)
        (call,) = px.calls("r1")
        assert call.model == "policy-a" and "model_requested" not in (call.metadata or {})


def test_a_kept_name_is_served_by_its_own_version_and_recorded_under_it(up, tmp_path):
    with running_proxy(up, tmp_path, proxy_model_map={"teacher-big": "teacher-v1"}) as px:
        _policy(px, "teacher-v1", "teacher-big", activate=False)
        _policy(px, "policy-v1", "policy-a")
        up.double.script.extend([Text("a"), Text("b")])
        client = px.client(px.register("r1"))
        client.chat.completions.create(model="teacher-big", messages=USER)
        assert up.double.requests[-1].json["model"] == "teacher-big"
        client.chat.completions.create(model="gpt-5-mini", messages=USER + [{"role": "user", "content": "title"}])
        assert up.double.requests[-1].json["model"] == "policy-a"
        teacher, titled = px.calls("r1")
        assert (teacher.policy_version_id, teacher.model) == ("teacher-v1", "teacher-big")   # never the active one
        assert "model_requested" not in (teacher.metadata or {})
        assert (titled.policy_version_id, titled.model) == ("policy-v1", "policy-a")
        assert titled.metadata["model_requested"] == "gpt-5-mini"


def test_a_version_activated_from_the_store_is_pinned_too(up, tmp_path):
    """A version the learner registered in the store (not through this proxy): activation reads its model name."""
    with running_proxy(up, tmp_path) as px:
        px.store.register_policy_version("trained-v2", model_name="policy-b")
        assert px.store.flush(30)
        assert px.admin("POST", "/admin/policy_versions/trained-v2/activate").status_code == 200
        up.double.script.extend([Text("ok")])
        px.client(px.register("r1")).chat.completions.create(model="whatever", messages=USER)
        assert up.double.requests[-1].json["model"] == "policy-b"
        (call,) = px.calls("r1")
        assert call.policy_version_id == "trained-v2" and call.metadata["model_requested"] == "whatever"


def test_pinning_off_or_no_active_version_forwards_the_name_as_asked(up, tmp_path):
    with running_proxy(up, tmp_path, proxy_pin_model=False) as px:
        _policy(px, "v1", "policy-a")
        up.double.script.extend([Text("ok")])
        px.client(px.register("r1")).chat.completions.create(model="teacher-big", messages=USER)
        assert up.double.requests[-1].json["model"] == "teacher-big"
        (call,) = px.calls("r1")
        assert call.policy_version_id == "v1" and call.model == "teacher-big"
    with running_proxy(up, tmp_path / "none") as px:   # nothing activated: nothing to pin to
        up.double.script.extend([Text("ok")])
        px.client(px.register("r2")).chat.completions.create(model="teacher-big", messages=USER)
        assert up.double.requests[-1].json["model"] == "teacher-big"


def test_model_map_on_the_command_line_is_checked(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENFORGE_PROXY_MODEL_MAP", raising=False)
    r = CliRunner().invoke(build_app(), ["proxy", "--upstream", "http://127.0.0.1:9", "--port", "0",
                                         "--model-map", "teacher-big"])
    assert r.exit_code == 2 and "--model-map 'teacher-big': write NAME=VERSION" in r.output, r.output


def test_model_map_and_pinning_from_the_environment(monkeypatch):
    from proxy import ProxySettings

    monkeypatch.setenv("OPENFORGE_PROXY_MODEL_MAP", '{"teacher-big": "teacher-v1"}')
    monkeypatch.setenv("OPENFORGE_PROXY_PIN_MODEL", "false")
    ps = ProxySettings()
    assert ps.model_map == {"teacher-big": "teacher-v1"} and ps.pin_model is False
