"""The scripted teacher: `proxy.engines.scripted.Conversations` answers each conversation's next step, picked by its first user
message (the task instruction) and its number of assistant turns; `steps_from_actions` turns a task's reference
solution (``solution/actions.json``) into those steps. Real loopback HTTP, the official SDK, a real proxy."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from learner import reconstruct
from proxy.engines.scripted import Conversations, HTTPError, ScriptedUpstream, Text, ToolCalls, run_upstream, steps_from_actions
from tests.proxy_fixtures import Up, running_proxy

REACT = Path(__file__).resolve().parents[1] / "rollout" / "_harnesses" / "react_agent.py"
SYSTEM = {"role": "system", "content": "You are an agent in a Linux shell."}
BASH = {"type": "function", "function": {"name": "bash", "description": "Run a bash command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
TASKS = {
    "Rename a.txt to b.txt.": [{"tool": "bash", "arguments": {"command": "mv a.txt b.txt"}}, {"answer": "Done."}],
    "Count the lines of data.csv into n.txt.": [
        {"tool": "bash", "arguments": {"command": "wc -l < data.csv > n.txt"}},
        {"tool": "bash", "arguments": {"command": "cat n.txt"}},
        {"answer": "n.txt holds the count."}],
}


def teacher() -> Conversations:
    return Conversations({instruction: steps_from_actions(actions) for instruction, actions in TASKS.items()})


def play(client: openai.OpenAI, instruction: str, *, stream: bool = False, limit: int = 6) -> list:
    """A react-style harness: call, run each tool call (here: a fixed result), until an answer without a tool call."""
    messages = [SYSTEM, {"role": "user", "content": instruction}]
    answers = []
    for _ in range(limit):
        if stream:
            chunks = list(client.chat.completions.create(model="m", messages=messages, tools=[BASH], stream=True))
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [tc.model_dump() for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
            calls = [{"id": tc["id"], "type": "function", "function": tc["function"]} for tc in calls]
            msg = {"role": "assistant", "content": content or None, "tool_calls": calls or None}
        else:
            m = client.chat.completions.create(model="m", messages=messages, tools=[BASH]).choices[0].message
            msg = m.model_dump(include={"role", "content", "tool_calls"})
        answers.append(msg)
        messages.append({k: v for k, v in msg.items() if v is not None})
        if not msg.get("tool_calls"):
            return answers
        for call in msg["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "exit code: 0"})
    raise AssertionError(f"no final answer in {limit} turns")


def test_actions_become_one_tool_call_per_turn_then_the_answer():
    steps = steps_from_actions(TASKS["Count the lines of data.csv into n.txt."])
    assert [type(s) for s in steps] == [ToolCalls, ToolCalls, Text]
    assert steps[0].calls[0].name == "bash" and steps[0].calls[0].arguments == {"command": "wc -l < data.csv > n.txt"}
    assert steps[2].text == "n.txt holds the count."


@pytest.mark.parametrize("actions, says", [
    ([], "at least the final answer"),
    ([{"tool": "bash", "arguments": {"command": "ls"}}], "end the list with the final answer"),
    ([{"answer": "Done."}, {"tool": "bash", "arguments": {}}], "goes last"),
    ([{"tool": "bash", "answer": "x"}], "either"),
    ([{"tool": "bash", "args": {}}, {"answer": "ok"}], "either"),
    ([{"tool": "bash", "arguments": "ls"}, {"answer": "ok"}], "arguments a dict"),
    (["ls", {"answer": "ok"}], "each action is a dict"),
])
def test_a_malformed_actions_list_says_what_is_wrong(actions, says):
    with pytest.raises(ValueError, match=says):
        steps_from_actions(actions)


def test_each_conversation_gets_its_own_next_step_in_any_interleaving(tokenizer):
    with run_upstream(ScriptedUpstream(tokenizer=tokenizer, conversations=teacher())) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        sync = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)

        async def main():
            plays = [asyncio.to_thread(play, sync, instruction, stream=i % 2 == 1)
                     for i in range(6) for instruction in TASKS]
            return await asyncio.gather(*plays)

        results = asyncio.run(main())
        for i, answers in enumerate(results):
            actions = TASKS[list(TASKS)[i % 2]]
            assert len(answers) == len(actions)
            for answer, action in zip(answers, actions, strict=True):
                if "answer" in action:
                    assert answer["content"] == action["answer"] and not answer.get("tool_calls")
                else:
                    (call,) = answer["tool_calls"]
                    assert call["function"]["name"] == action["tool"]
                    assert json.loads(call["function"]["arguments"]) == action["arguments"]
        # a retried request (same prompt) gets the same step again: the step follows the prompt, not a counter
        messages = [SYSTEM, {"role": "user", "content": "Rename a.txt to b.txt."}]
        again = [sync.chat.completions.create(model="m", messages=messages, tools=[BASH]) for _ in range(2)]
        assert {a.choices[0].message.tool_calls[0].function.arguments for a in again} == {'{"command": "mv a.txt b.txt"}'}
        asyncio.run(client.close())


def test_token_ids_are_what_the_template_writes_for_the_turn(tokenizer):
    """The completion ids are the served template's rendering of the step: the next turn's prompt (this answer and
    the tool result appended) starts with this prompt's ids followed by them, as with a real engine."""
    with run_upstream(ScriptedUpstream(tokenizer=tokenizer, conversations=teacher())) as url:
        body = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": "Rename a.txt to b.txt."}],
                "tools": [BASH], "return_token_ids": True}
        ans = httpx.post(url + "/v1/chat/completions", json=body).json()
    assert ans["prompt_token_ids"] == tokenizer.encode_chat(body["messages"], body["tools"])
    message = {k: v for k, v in ans["choices"][0]["message"].items() if k in ("role", "content", "tool_calls") and v}
    following = body["messages"] + [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                                              "content": "exit code: 0"}]
    ids = ans["prompt_token_ids"] + ans["choices"][0]["token_ids"]
    assert tokenizer.encode_chat(following, body["tools"])[:len(ids)] == ids
    assert ans["choices"][0]["token_ids"][-1] == tokenizer.eos_token_id


def test_an_unknown_instruction_or_a_conversation_past_its_script_is_an_error_the_harness_sees(tokenizer):
    with run_upstream(ScriptedUpstream(tokenizer=tokenizer, conversations=teacher())) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.NotFoundError, match="no script for this conversation.*Write a poem"):
            client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "Write a poem."}])
        past = [SYSTEM, {"role": "user", "content": "Rename a.txt to b.txt."},
                {"role": "assistant", "content": "Done."}, {"role": "user", "content": "And now?"}]
        with pytest.raises(openai.NotFoundError, match="has 2 step"):
            client.chat.completions.create(model="m", messages=past + [{"role": "assistant", "content": "x"},
                                                                       {"role": "user", "content": "more"}])
        with pytest.raises(openai.NotFoundError, match="no script"):  # a stream says so before its first chunk
            list(client.chat.completions.create(model="m", stream=True,
                                                messages=[{"role": "user", "content": "Unknown task"}]))


def test_an_instruction_wrapped_in_the_harness_words_finds_its_script_and_the_longest_key_wins(tokenizer):
    conv = Conversations({"Rename a.txt": [Text("short")], "Rename a.txt to b.txt.": [Text("long")]})
    with run_upstream(ScriptedUpstream(tokenizer=tokenizer, conversations=conv)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)

        def ask(text):
            return client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}]).choices[
                0].message.content

        assert ask("Task:\nRename a.txt to b.txt.\nWork in /workspace.") == "long"
        assert ask("  Rename a.txt  ") == "short"  # exact (stripped) first


def test_a_harness_that_sends_its_own_context_first_gets_the_script_of_the_message_with_the_task(tokenizer):
    """Codex sends its environment context as a user message before the task: the message that names a script wins."""
    with run_upstream(ScriptedUpstream(tokenizer=tokenizer, conversations=teacher())) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        messages = [SYSTEM, {"role": "user", "content": "<environment_context>cwd: /workspace</environment_context>"},
                    {"role": "user", "content": [{"type": "text", "text": "Count the lines of data.csv into n.txt."}]}]
        call = client.chat.completions.create(model="m", messages=messages, tools=[BASH]).choices[0].message
        assert json.loads(call.tool_calls[0].function.arguments) == {"command": "wc -l < data.csv > n.txt"}


def test_the_react_harness_solves_a_task_with_the_teacher_through_the_proxy(tokenizer, tmp_path):
    """The project's own harness, run for real (its tools run in a folder), driven by the teacher through the proxy."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("hello\n")
    instruction = tmp_path / "instruction.md"
    instruction.write_text("Rename a.txt to b.txt.\n")
    up = ScriptedUpstream(tokenizer=tokenizer, conversations=teacher())
    with run_upstream(up) as url, running_proxy(Up(up, url, None), tmp_path / "proxy") as px:
        token = px.register("r1")
        env = {**os.environ, "OPENAI_API_KEY": token, "OPENAI_BASE_URL": px.url + "/v1"}
        proc = subprocess.run([sys.executable, str(REACT), "--model", "teacher", "--instruction-file",
                               str(instruction)], cwd=work, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.splitlines()[-1]) == {"finished": True, "turns": 2, "answer": "Done."}
        assert (work / "b.txt").read_text() == "hello\n" and not (work / "a.txt").exists()
        calls = px.calls("r1")
    assert len(calls) == 2 and all(c.token_exact for c in calls)
    assert "exit code: 0" in json.dumps(calls[1].messages[-1])  # the harness's own tool result, in the next prompt
    assert len(reconstruct(calls)) == 1


def test_the_flat_script_is_asked_first_so_faults_can_be_injected_into_a_teacher(tokenizer):
    up = ScriptedUpstream(tokenizer=tokenizer, conversations=teacher(), script=[HTTPError(503, "engine busy")])
    with run_upstream(up) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        messages = [SYSTEM, {"role": "user", "content": "Rename a.txt to b.txt."}]
        with pytest.raises(openai.InternalServerError, match="engine busy"):
            client.chat.completions.create(model="m", messages=messages)
        assert client.chat.completions.create(model="m", messages=messages).choices[0].message.tool_calls


def test_conversations_added_over_the_control_route(tokenizer):
    up = ScriptedUpstream(tokenizer=tokenizer)
    with run_upstream(up) as url:
        r = httpx.post(url + "/_scripted/conversations", json={
            "Rename a.txt to b.txt.": TASKS["Rename a.txt to b.txt."],  # actions.json's form
            "Say hi.": [{"text": "hi"}]})  # a script's form
        assert r.json() == {"conversations": 2}
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        assert play(client, "Say hi.")[0]["content"] == "hi"
        assert len(play(client, "Rename a.txt to b.txt.")) == 2
        httpx.post(url + "/_scripted/reset")
        assert len(up.conversations) == 0


def test_a_teacher_through_the_proxy_is_recorded_token_exact_as_one_segment(tokenizer, tmp_path):
    """What the loop's demonstrations are: every call recorded with ids, each rollout one training segment."""
    up = ScriptedUpstream(tokenizer=tokenizer, conversations=teacher())
    with run_upstream(up) as url, running_proxy(Up(up, url, None), tmp_path) as px:
        px.admin("POST", "/admin/policy_versions", json={"id": "teacher-scripted", "model_name": "scripted-teacher",
                                                         "engine": "scripted", "metadata": {"teacher": "scripted"}})
        for n, instruction in enumerate(TASKS):
            play(px.client(px.register(f"r{n}")), instruction, stream=n == 1)
        for n, actions in enumerate(TASKS.values()):
            calls = px.calls(f"r{n}")
            assert len(calls) == len(actions)
            assert all(c.token_exact and c.policy_version_id == "teacher-scripted" for c in calls)
            assert len(reconstruct(calls)) == 1  # each prompt extends the last: one segment per rollout
        (pv,) = px.store.lineage("policy_versions")
        assert pv["metadata"] == {"teacher": "scripted"} and pv["engine"] == "scripted"
