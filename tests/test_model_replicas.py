"""A kept model name is served by the replica that serves it (issue 32): two scripted engines behind one proxy, one
serving the policy's model and one a teacher's; a name ``--model-map`` keeps goes to the teacher's replica and is
recorded under the teacher's version, any other name to the policy's, each with rollout affinity; a chosen model no
replica serves is refused with the value, the rule and the fix. Through the official SDKs of all four protocols
(openai: chat completions and Responses, anthropic, google-genai) over loopback."""

from __future__ import annotations

import contextlib

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types

from proxy import build_proxy
from proxy.engines.scripted import ChatTokenizer, ScriptedUpstream, Text, UpstreamServer
from tests.proxy_fixtures import ProxyHarness, ServeInThread, split_settings

USER = [{"role": "user", "content": "hi"}]


# The teacher's own chat template: its replica counts the same prompt as another number of tokens than the policy's.
TEACHER_TEMPLATE = ("{% for m in messages %}### {{ m['role'] | upper }} SAYS:\n{{ m['content'] }}\n{% endfor %}"
                    "{% if add_generation_prompt %}### ASSISTANT SAYS:\n{% endif %}")


@pytest.fixture
def engines(tokenizer):
    """(policy engine, teacher engine): each answers only its own model (``strict_model``), so a call routed to the
    wrong one would fail, and counts tokens with its own chat template, so a count from the wrong one would differ."""
    started = []
    teacher_tokenizer = ChatTokenizer(tokenizer.tokenizer, {**tokenizer.config, "chat_template": TEACHER_TEMPLATE})
    for model, tok in (("policy-a", tokenizer), ("teacher-big", teacher_tokenizer)):
        double = ScriptedUpstream(tokenizer=tok, model=model, strict_model=True)
        server = UpstreamServer(double)
        started.append((double, server, server.start()))
    yield started
    for _, server, _ in started:
        server.stop()


@contextlib.contextmanager
def _proxy(urls, tmp_path, kept: dict[str, tuple[str, str]] | None = None):
    """A proxy over ``urls``; ``kept``: requested name -> (its version, that version's model name), each registered,
    and ``policy-v1`` (model ``policy-a``) activated when any is kept."""
    s, ps = split_settings(tmp_path / "home", {"proxy_model_map": {k: v for k, (v, _) in (kept or {}).items()}})
    proxy = build_proxy(urls, settings=s, store_url=f"sqlite:///{tmp_path / 'proxy.sqlite'}", proxy_settings=ps)
    serve = ServeInThread(proxy.app)
    px = ProxyHarness(proxy, serve.start(), up=None)
    try:
        for version, model in (kept or {}).values():
            _policy(px, version, model, activate=False)
        if kept:
            _policy(px, "policy-v1", "policy-a")
        yield px
    finally:
        serve.stop()
        proxy.store.close()


def _policy(px, version: str, model: str, activate: bool = True) -> None:
    r = px.admin("POST", "/admin/policy_versions", json={"id": version, "model_name": model, "activate": activate})
    assert r.status_code == 200, r.text


def _models_asked(double) -> list[str]:
    return [r.json["model"] for r in double.requests if r.path == "/v1/chat/completions"]


def _counted(double) -> list[str | None]:
    """The model each token count this engine was asked for named (None: it named none)."""
    return [r.json.get("model") for r in double.requests if r.path == "/tokenize"]


def _tokens(double, messages) -> int:
    """What ``double``'s own tokenizer counts for ``messages`` with its chat template."""
    tok = double.tokenizer
    return len(tok.encode(tok.apply_chat_template(messages, None, True), add_special_tokens=False))


def _counts(px, token: str, models: list[str]) -> list[int]:
    """Each of ``models`` counts USER through both token-counting routes: Anthropic's, then Gemini's."""
    messages = anthropic.Anthropic(base_url=px.url, api_key=token, max_retries=0).messages
    with genai.Client(api_key=token, http_options=types.HttpOptions(base_url=px.url)) as gemini:
        return [n for m in models for n in (messages.count_tokens(model=m, messages=USER).input_tokens,
                                            gemini.models.count_tokens(model=m, contents="hi").total_tokens)]


def test_a_kept_name_goes_to_the_replica_that_serves_it_and_is_recorded_under_its_version(engines, tmp_path):
    (policy, _, policy_url), (teacher, _, teacher_url) = engines
    with _proxy([policy_url, teacher_url], tmp_path, {"teacher-big": ("teacher-v1", "teacher-big")}) as px:
        policy.script.extend([Text(f"p{i}") for i in range(1, 5)])
        teacher.script.extend([Text(f"t{i}") for i in range(1, 5)])
        token = px.register("r1")
        chat = px.client(token)
        messages = anthropic.Anthropic(base_url=px.url, api_key=token, max_retries=0).messages
        with genai.Client(api_key=token, http_options=types.HttpOptions(base_url=px.url)) as gemini:
            answers = [chat.chat.completions.create(model="gpt-5-mini", messages=USER).choices[0].message.content,
                       chat.chat.completions.create(model="teacher-big", messages=USER).choices[0].message.content,
                       messages.create(model="claude-haiku", max_tokens=16, messages=USER).content[0].text,
                       messages.create(model="teacher-big", max_tokens=16, messages=USER).content[0].text,
                       chat.responses.create(model="teacher-big", input="hi").output_text,
                       gemini.models.generate_content(model="gemini-2.5-flash", contents="hi").text,
                       gemini.models.generate_content(model="teacher-big", contents="hi").text,
                       chat.chat.completions.create(model="policy-a", messages=USER).choices[0].message.content]
        assert answers == ["p1", "t1", "p2", "t2", "t3", "p3", "t4", "p4"]
        assert _models_asked(policy) == ["policy-a"] * 4 and _models_asked(teacher) == ["teacher-big"] * 4
        calls = px.calls("r1")
        got = [(c.metadata["upstream"], c.policy_version_id, c.model, (c.metadata or {}).get("model_requested"))
               for c in calls]
        assert got == [(policy_url, "policy-v1", "policy-a", "gpt-5-mini"),
                       (teacher_url, "teacher-v1", "teacher-big", None),
                       (policy_url, "policy-v1", "policy-a", "claude-haiku"),
                       (teacher_url, "teacher-v1", "teacher-big", None),
                       (teacher_url, "teacher-v1", "teacher-big", None),
                       (policy_url, "policy-v1", "policy-a", "gemini-2.5-flash"),
                       (teacher_url, "teacher-v1", "teacher-big", None),
                       (policy_url, "policy-v1", "policy-a", None)]
        listing = {u["url"]: u for u in px.admin("GET", "/admin/upstreams").json()["upstreams"]}
        assert listing[policy_url]["models"] == ["policy-a"] and listing[teacher_url]["models"] == ["teacher-big"]
        assert {u["state"] for u in listing.values()} == {"up"}


def test_a_token_count_comes_from_the_replica_that_serves_its_model(engines, tmp_path):
    """Token counts go where a call naming the same model goes, and tell the engine the model it counts for: a name
    the operator keeps to its replica, any other (pinned to the active version's model) to the policy's."""
    (policy, _, policy_url), (teacher, _, teacher_url) = engines
    p, t = _tokens(policy, USER), _tokens(teacher, USER)
    assert p != t  # else a count from the wrong replica would pass unseen
    with _proxy([policy_url, teacher_url], tmp_path, {"teacher-big": ("teacher-v1", "teacher-big")}) as px:
        token = px.register("r1")
        assert _counts(px, token, ["claude-haiku", "teacher-big", "gemini-2.5-flash"]) == [p, p, t, t, p, p]
        assert _counted(policy) == ["policy-a"] * 4 and _counted(teacher) == ["teacher-big"] * 2
        assert px.calls("r1") == []  # counting is not a model call


def test_a_chosen_model_no_replica_serves_is_refused_naming_it(engines, tmp_path):
    (_, _, policy_url), (teacher, _, teacher_url) = engines
    with _proxy([policy_url, teacher_url], tmp_path, {"judge-xl": ("judge-v1", "judge-xl")}) as px:
        chat = px.client(px.register("r1"))
        with pytest.raises(openai.InternalServerError) as refused:
            chat.chat.completions.create(model="judge-xl", messages=USER)
        assert refused.value.status_code == 503
        err = refused.value.body
        assert err["code"] == "model_not_served", err
        for part in ("'judge-xl'", policy_url, teacher_url, "['teacher-big']", "--model-map NAME=VERSION"):
            assert part in err["message"], (part, err["message"])
        with pytest.raises(anthropic.InternalServerError) as count:  # a token count for it: the same refusal
            anthropic.Anthropic(base_url=px.url, api_key=px.register("r2"), max_retries=0).messages.count_tokens(
                model="judge-xl", messages=USER)
        assert count.value.status_code == 503 and "'judge-xl'" in count.value.body["error"]["message"]
        r = httpx.post(f"{px.url}/v1beta/models/judge-xl:countTokens", headers={"x-goog-api-key": px.register("r3")},
                       json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
        assert r.status_code == 503 and r.json()["error"]["details"][0]["reason"] == "model_not_served", r.text
        assert not teacher.requests or all(r.path == "/v1/models" for r in teacher.requests)


def test_a_name_the_harness_chose_goes_to_a_replica_that_lists_it_else_anywhere(engines, tmp_path):
    """Without an active version nothing is pinned: a name one replica lists goes there; one none lists goes where
    any call goes (the engine answers: here a 404 from a strict engine, recorded)."""
    (policy, _, policy_url), (teacher, _, teacher_url) = engines
    with _proxy([policy_url, teacher_url], tmp_path) as px:
        teacher.script.extend([Text("t")] * 3)
        chat = px.client(px.register("r1"))
        for _ in range(3):
            assert chat.chat.completions.create(model="teacher-big", messages=USER).choices[0].message.content == "t"
        assert _models_asked(teacher) == ["teacher-big"] * 3 and _models_asked(policy) == []
        with pytest.raises(openai.NotFoundError):
            chat.chat.completions.create(model="unknown-model", messages=USER)
        failed = px.calls("r1")[-1]
        assert failed.error_class == "upstream_http_404" and failed.metadata["upstream"] in (policy_url, teacher_url)
        # counts likewise: to the replica that lists the name, the name as asked (Gemini's /tokenize names none)
        assert _counts(px, px.register("r2"), ["teacher-big"]) == [_tokens(teacher, USER)] * 2
        assert _counted(teacher) == ["teacher-big", None] and _counted(policy) == []
        assert len(_counts(px, px.register("r3"), ["unknown-model"])) == 2  # anywhere, answered
        assert len(_counted(policy) + _counted(teacher)) == 4


def test_one_replica_counts_every_model_as_before(engines, tmp_path):
    """A single upstream takes every count, as every call, whatever the model (no replica is asked what it serves);
    a name the proxy chose is still the one the engine counts for."""
    (policy, _, policy_url), _ = engines
    with _proxy([policy_url], tmp_path, {"judge-xl": ("judge-v1", "judge-xl")}) as px:
        token = px.register("r1")
        assert _counts(px, token, ["judge-xl", "claude-haiku"]) == [_tokens(policy, USER)] * 4
        assert _counted(policy) == ["judge-xl", "judge-xl", "policy-a", "policy-a"]
