"""Calls a harness makes for itself (issue 32) are recorded and marked ``metadata.harness_self_call`` where the harness
lets us tell (``proxy/_self_calls.py``): the ``X-OpenForge-Self-Call`` header, Codex CLI's own headers, and the
prompt signatures of Claude Code and Gemini CLI, through the official SDKs; an export leaves them out by default,
each with its exclusion, and keeps them with ``include_self_calls`` (``--include-self-calls``)."""

from __future__ import annotations

import json

import anthropic
import pandas as pd
import typer
from google import genai
from google.genai import types
from typer.testing import CliRunner

from learner import ExportConfig, export
from proxy._exchange import CallHeaders
from proxy._self_calls import from_headers, from_prompt
from proxy.engines.scripted import Text

USER = [{"role": "user", "content": "fix the failing test"}]
CODEX_TURN = {"session_id": "s", "request_kind": "turn", "model": "m"}


def _kinds(px, rollout_id: str) -> list[str | None]:
    return [(c.metadata or {}).get("harness_self_call") for c in px.calls(rollout_id)]


def test_each_way_a_harness_lets_us_tell_marks_the_call(px):
    px.up.double.script.extend([Text("ok")] * 9)
    token = px.register("r1")
    chat = px.client(token)
    chat.chat.completions.create(model="m", messages=USER)   # the harness's own turn: unmarked
    chat.chat.completions.create(model="m", messages=USER, extra_headers={"X-OpenForge-Self-Call": "title"})
    chat.chat.completions.create(model="m", messages=USER, extra_headers={"X-OpenForge-Self-Call": "Not A Kind!"})
    codex = {"x-codex-turn-metadata": json.dumps(CODEX_TURN)}
    chat.responses.create(model="m", input="fix it", extra_headers=codex)   # Codex's turn: unmarked
    chat.responses.create(model="m", input="fix it", extra_headers={
        "x-codex-turn-metadata": json.dumps({**CODEX_TURN, "request_kind": "compaction"})})
    claude = anthropic.Anthropic(base_url=px.url, api_key=token, max_retries=0)
    claude.messages.create(model="claude-haiku", max_tokens=16, messages=USER, system=[
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "Generate a concise, sentence-case title (3-7 words) that captures the main topic "
                                 "or goal of this coding session."}])
    with genai.Client(api_key=token, http_options=types.HttpOptions(base_url=px.url)) as gemini:
        gemini.models.generate_content(model="gemini-2.5-flash", contents=[
            types.Content(role="user", parts=[types.Part(text="list the files")]),
            types.Content(role="model", parts=[types.Part(text="Here they are.")]),
            types.Content(role="user", parts=[types.Part(text="Analyze *only* the content and structure of your "
                                                              "immediately preceding response (your last turn)")])])
        gemini.models.generate_content(model="gemini-2.5-flash", contents="route this", config=types.
                                       GenerateContentConfig(system_instruction="You are a specialized Task Routing "
                                                             "AI. Your sole function is to classify."))
    chat.chat.completions.create(model="m", messages=[  # a signature quoted by the user is not the harness's
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Please explain: 'Generate a concise, sentence-case title'"}])
    assert _kinds(px, "r1") == [None, "title", "other", None, "compaction", "title", "next_speaker", "routing", None]


def test_the_rules_one_by_one():
    assert from_headers(None, None, "compact") == "compaction"
    assert from_headers(None, "not json", None) is None
    assert from_headers(None, json.dumps({"request_kind": "turn"}), None) is None
    assert from_headers(" Summary ", None, None) == "summary"
    assert from_prompt([]) is None
    system = [{"type": "text", "text": "You are a diagnostic agent that determines whether a conversational AI "
                                       "assistant is stuck in an unproductive loop."}]
    assert from_prompt([{"role": "system", "content": system}, *USER]) == "loop_detection"
    far = "x" * 5000 + "Generate a concise, sentence-case title"   # past the head that is read: not a signature
    assert from_prompt([{"role": "system", "content": far}, *USER]) is None
    h = CallHeaders.from_asgi([(b"x-openforge-self-call", b"title"), (b"x-openai-subagent", b"compact")])
    assert (h.self_call, h.subagent, h.codex_turn) == ("title", "compact", None)


def _group(px) -> None:
    st = px.store
    st.register_task("t1")
    st.create_group("g1", task_id="t1", target_size=2)
    for rid, reward in (("r-a", 1.0), ("r-b", 0.0)):
        client = px.client(px.register(rid, group_id="g1", task_id="t1"))
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"task {rid}"}])
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"title for {rid}"}],
                                       extra_headers={"X-OpenForge-Self-Call": "title"})
        px.end(rid, "success" if reward else "failure")
        st.add_reward(rid, reward)
    assert st.flush(30)


def _rows(out) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(f) for f in sorted(out.glob("trajectories-*.parquet"))])


def test_an_export_leaves_self_calls_out_by_default_and_keeps_them_when_asked(px, tmp_path):
    px.up.double.script.extend([Text("ok")] * 4)
    _group(px)
    titled = {c.rollout_id: c.id for rid in ("r-a", "r-b") for c in px.calls(rid)
              if (c.metadata or {}).get("harness_self_call") == "title"}
    assert len(titled) == 2
    m = export(px.store, tmp_path / "default", ExportConfig(format="verl"))
    assert m["exclusions"].get("harness_self_call") == 2, m["exclusions"]
    assert len(_rows(tmp_path / "default")) == 2   # one segment per rollout: its own turn
    assert "include_self_calls" not in m["config"]   # exports that leave them out keep the id they had
    kept = export(px.store, tmp_path / "kept", ExportConfig(format="verl", include_self_calls=True))
    assert "harness_self_call" not in kept["exclusions"] and kept["config"]["include_self_calls"] is True
    assert len(_rows(tmp_path / "kept")) == 4   # the title call is a segment of its own (another prompt)
    from learner._cli import export_app

    app = typer.Typer()
    app.add_typer(export_app, name="export")
    r = CliRunner().invoke(app, ["export", "--include-self-calls", "--store", f"sqlite:///{tmp_path / 'proxy.sqlite'}",
                                 "--out", str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    assert len(_rows(tmp_path / "cli")) == 4
