"""Secrets of every shape the default redaction rules know, sent through the real proxy over HTTP with the official
``openai`` SDK: none is in any text the store keeps (every table, the journal), each call's metadata names the rule
that fired (read back through ``Store.calls``), and ordinary look-alikes (digests, uuids, base64, plain URLs) are
stored untouched. Also: no request header is stored, and the rule set is configurable and checked."""

from __future__ import annotations

import base64
import random

import openai
import pytest
import sqlalchemy as sa

from proxy import ProxySettings
from proxy._auth import TokenSigner
from proxy._redaction import RULES, Redactor
from proxy.engines.scripted import HTTPError, ToolCall, ToolCalls
from tests.proxy_fixtures import running_proxy

# (rule, text holding the secret, the secret: what must not be stored). Distinct values, so a scan finds only these.
SHAPES = [
    ("api_keys", "STRIPE_KEY=sk_live_" + "51HqLyjWDarjtT1zdp7dcQx", "sk_live_51HqLyjWDarjtT1zdp7dcQx"),
    ("api_keys", "restricted: rk_live_" + "9fKq2LmNpRsTuVwXyZa1b2c3", "rk_live_9fKq2LmNpRsTuVwXyZa1b2c3"),
    ("api_keys", "HF_TOKEN=hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNmQwErTyUi", "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"),
    ("api_keys", "OPENAI_API_KEY=sk-proj-" + "Zk3v9Qm2Lx7Rt5Wp8Ns4Hd6F", "sk-proj-Zk3v9Qm2Lx7Rt5Wp8Ns4Hd6F"),
    ("cloud_keys", "[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = "
     "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLE12", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLE12"),
    ("cloud_keys", '{"Credentials": {"SecretAccessKey": "Je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY"}}',
     "Je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY"),
    ("cloud_keys", "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=" + "Qm9ndXNLZXk" * 8 + "==;"
     "EndpointSuffix=core.windows.net", "Qm9ndXNLZXk" * 8 + "=="),
    ("private_keys", '{"type": "service_account", "private_key_id": "1f2e3d4c5b6a79880f1e2d3c4b5a69788f7e6d5c", '
     '"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC' + "Gcp" * 30
     + '\\n-----END PRIVATE KEY-----\\n", "client_email": "sa@p.iam.gserviceaccount.com"}', "Gcp" * 30),
    ("jwts", "Cookie: session=eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ1c2VyLTQyIiwiYWRtaW4iOnRydWV9."
     "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c; Path=/",
     "eyJzdWIiOiJ1c2VyLTQyIiwiYWRtaW4iOnRydWV9.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),
    ("url_passwords", "DATABASE_URL=postgresql://app:Pg-s3cret-9x@db.internal:5432/app", "Pg-s3cret-9x"),
    ("url_passwords", "mysql://root:My5ql-pw-77@127.0.0.1:3306/shop", "My5ql-pw-77"),
    ("url_passwords", "REDIS_URL=redis://:Red1s-pw-k4@cache:6379/0", "Red1s-pw-k4"),
    ("url_passwords", "amqp://guest:Rabb1t-pw-2q@mq:5672//", "Rabb1t-pw-2q"),
    ("url_passwords", "mongodb+srv://admin:M0ngo-pw-8z@cluster0.ab1cd.mongodb.net/?retryWrites=true", "M0ngo-pw-8z"),
    ("url_passwords", "git clone https://bot:ghs-pw-Htt9s@git.example.com/org/repo.git", "ghs-pw-Htt9s"),
]
PLACES = ["system", "user", "tool"]


def _messages(text: str, place: str) -> list[dict]:
    if place == "system":
        return [{"role": "system", "content": f"Deployment notes:\n{text}\n"}, {"role": "user", "content": "Go on."}]
    if place == "user":
        return [{"role": "user", "content": f"Here is my config: {text} - what is wrong?"}]
    call = {"id": "call_1", "type": "function", "function": {"name": "sh", "arguments": '{"cmd": "cat .env"}'}}
    return [{"role": "user", "content": "Look at the env file."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": f"{text}\n"},
            {"role": "user", "content": "Summarise it."}]


def _stored_bytes(px, home) -> bytes:
    """Everything the store keeps: every column of every table, and every file under the proxy's home (journal,
    blobs) but the proxy's own secrets."""
    dump = []
    with px.store.engine.connect() as conn:
        for table in sa.inspect(conn).get_table_names():
            for row in conn.execute(sa.text(f'SELECT * FROM "{table}"')):
                dump.extend(v if isinstance(v, bytes) else str(v).encode() for v in row)
    for f in home.rglob("*"):
        if f.is_file() and f.name not in ("proxy-secret", "proxy-admin-token"):
            dump.append(f.read_bytes())
    return b"\n".join(dump)


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("rule,text,secret", SHAPES, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(SHAPES)])
def test_a_secret_in_the_prompt_is_not_stored_and_the_call_names_the_rule(px, tmp_path, rule, text, secret, place):
    assert rule in ProxySettings().redact
    msgs = _messages(text, place)
    px.client(px.register("r1")).chat.completions.create(model="m", messages=msgs)
    assert px.up.double.requests[-1].json["messages"] == msgs  # forwarded as sent
    (call,) = px.calls("r1")
    assert rule in call.metadata["redacted"]
    assert f"[REDACTED:{rule}]" in str(call.messages)
    assert secret.encode() not in _stored_bytes(px, tmp_path / "proxy-home")


def test_rollout_tokens_are_redacted(px, tmp_path):
    """A harness's API key is its rollout token: one that shows up in the text (``env`` output) is not stored, and
    neither is the calling rollout's own (it came in the Authorization header)."""
    token, other = px.register("r1"), px.register("r2")
    signer_shaped = TokenSigner(b"x" * 32).issue("some-rollout", ttl_s=3600)
    text = f"OPENAI_API_KEY={other}\nOPENFORGE_ROLLOUT_TOKEN={signer_shaped}\nPATH=/usr/bin"
    px.client(token).chat.completions.create(model="m", messages=_messages(text, "tool"))
    (call,) = px.calls("r1")
    assert call.metadata["redacted"] == ["rollout_tokens"]
    dump = _stored_bytes(px, tmp_path / "proxy-home")
    assert token.encode() not in dump and other.encode() not in dump and signer_shaped.encode() not in dump


def test_every_stored_part_of_a_call_is_redacted_and_recorded(px, tmp_path):
    """Tool schemas, parameters, the answer (text and tool-call arguments), a streamed answer and an upstream
    error's detail: each a place a secret can be stored, each redacted, each reported in the call's metadata."""
    key, jwt = "sk_live_" + "Pl4cesK3yAbCdEfGhIjKlMn", "eyJhbGciOiJub25lIn0.eyJwbGFjZSI6InBhcmFtcyJ9.c2lnbmF0dXJl"
    pw = "Tp-pl4ce-5ecret"
    tools = [{"type": "function", "function": {
        "name": "deploy", "description": f"Deploys with postgresql://ops:{pw}@db/prod",
        "parameters": {"type": "object", "properties": {"env": {"type": "string"}}}}}]
    client = px.client(px.register("r1"))
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "deploy"}], tools=tools,
                                   extra_body={"metadata": {"session": jwt}})
    px.up.double.script.extend([ToolCalls([ToolCall("deploy", {"env": f"STRIPE={key}"})])])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}], tools=tools)
    stream = client.chat.completions.create(model="m", stream=True,
                                            messages=[{"role": "user", "content": f"echo {key}"}])
    assert key in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)  # the client gets it
    # drained first: a failed call (no answer message) in one database batch with answered ones trips a store bug
    # (forge_store/_write/db_apply.py: its row lacks the response_message_hash key the others have)
    assert px.store.flush(30)
    px.up.double.script.extend([HTTPError(400, f"bad request: token {jwt} rejected")])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "fail"}])
    first, second, streamed, failed = px.calls("r1")
    assert first.metadata["redacted"] == ["jwts", "url_passwords"]  # the tools' password, the params' JWT
    assert "[REDACTED:url_passwords]" in first.tools[0]["function"]["description"]
    assert first.params["metadata"]["session"] == "[REDACTED:jwts]"
    assert second.metadata["redacted"] == ["api_keys", "url_passwords"]  # the answer's tool-call arguments
    assert "[REDACTED:api_keys]" in second.response_message["tool_calls"][0]["function"]["arguments"]
    assert streamed.streamed and streamed.metadata["redacted"] == ["api_keys"]
    assert "[REDACTED:api_keys]" in str(streamed.response_message)
    assert failed.error_class == "upstream_http_400" and failed.metadata["redacted"] == ["jwts"]
    dump = _stored_bytes(px, tmp_path / "proxy-home")
    assert key.encode() not in dump and jwt.encode() not in dump and pw.encode() not in dump


def test_no_request_header_is_stored(px, tmp_path):
    headers = {"User-Agent": "agent-ua-canary/9.9", "X-Trace": "hdr-canary"}
    client = px.client(px.register("r1"), default_headers=headers)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    (call,) = px.calls("r1")
    assert call.metadata is None
    dump = _stored_bytes(px, tmp_path / "proxy-home")
    assert b"agent-ua-canary" not in dump and b"hdr-canary" not in dump


def test_images_are_never_redacted(px, tmp_path):
    """An image's base64 reaches the blob store byte for byte (it is moved there before any rule runs), even one
    whose base64 spells trigger words; and base64 as text, in a data: URL, passes every default rule untouched."""
    b64 = "iVBORw0KGgo" + "AKIAABCDEFGHIJKLMNOP" + "eyJhbGciOiJIUzI1NiJ9" + "bearer" + "AIza" + "S" * 35 + "AAAA"
    png = base64.b64decode(b64)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]
    px.client(px.register("r1")).chat.completions.create(model="m", messages=msgs)
    (call,) = px.calls("r1")
    assert px.store.get_blob(call.image_hashes[0]) == png and call.metadata is None
    noise = base64.b64encode(random.Random(7).randbytes(48_000)).decode()
    text = f"![shot](data:image/png;base64,{noise}) and {url}"
    hits: set[str] = set()
    assert Redactor(ProxySettings().redact).apply(text, hits) == text and hits == set()


ORDINARY = [
    "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "commit 3b18e512dba79e4c8300dd08aeb37f8e728b8dad (HEAD -> main)",
    "request id 123e4567-e89b-12d3-a456-426614174000", "uuid=8f14e45f-ceea-467a-9ec6-6d4a4c3e2a1b",
    "see https://github.com/openai/openai-python/blob/main/README.md#L10 and http://localhost:8080/v1/models",
    "postgresql://app@db:5432/app (peer auth, no password)", "ssh://git@github.com:22/org/repo.git",
    "git@github.com:org/repo.git", "https://example.com/users/a:b@c", "mailto:someone@example.com",
    "Stripe publishable key pk_live_51HqLyjWDarjtT1zdp7dcQxAbC (public by design)",
    "from huggingface_hub import hf_hub_download; hf_hub_download(repo_id='gpt2', filename='config.json')",
    "session_token = request.cookies.get('session_token')", "aws_secret_access_key = os.environ['AWS_KEY']",
    'if line.startswith("-----BEGIN PRIVATE KEY-----"):', "Authorization: Bearer $TOKEN",
    "task-runner --disk-size 20G --risk-level low", "the header is eyJhbGciOiJIUzI1NiJ9 (base64 of JSON)",
    "AccountName=acct;EndpointSuffix=core.windows.net", "ofr1 is our token format version",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_look_alikes_are_not_redacted(text):
    hits: set[str] = set()
    assert Redactor(ProxySettings().redact).apply(text, hits) == text and hits == set()


def test_the_default_rules_are_every_rule_but_emails():
    assert sorted(ProxySettings().redact) == sorted(set(RULES) - {"emails"})


def test_a_custom_rule_set_is_used_and_an_unknown_rule_fails_with_the_list(up, tmp_path):
    key = "sk-proj-" + "Cust0mRuleSetKeyAbCdEf12"
    with running_proxy(up, tmp_path / "a", proxy_redact=["emails"]) as px:
        px.client(px.register("r1")).chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"mail ops@example.com the key {key}"}])
        (call,) = px.calls("r1")
        assert call.metadata["redacted"] == ["emails"]
        assert call.messages[0]["content"] == f"mail [REDACTED:emails] the key {key}"  # api_keys is not chosen
    with pytest.raises(ValueError, match=r"\['nope'\] unknown: choose from api_keys, .*emails"):
        with running_proxy(up, tmp_path / "b", proxy_redact=["api_keys", "nope"]):
            pass
