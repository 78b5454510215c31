"""An answer holding a tool call the server's parser could not read (``learner._answers``): counted per rollout by
the rubrics and compared between versions (``unparsed_tool_calls_per_rollout``), on a real store."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from forge_store import Settings, open_store
from forge_store.testing import Turn, agent_calls
from learner import compare_versions, rollout_rubrics
from learner._analysis_config import RubricConfig
from learner._answers import unparsed_tool_call

BROKEN = '<tool_call>{"name": "bash", "arguments": {"command": "sed -i \'s/a/b/g" notes.md"}}</tool_call>'
MARKERS = RubricConfig().unparsed_markers


def _call(response_message=None, response=None):
    return SimpleNamespace(response_message=response_message, response=response)


@pytest.mark.parametrize(("call", "unparsed"), [
    (_call({"role": "assistant", "content": BROKEN}), True),
    (_call(None, {"text": "x <|python_tag|>ls", "tool_calls": None}), True),                 # the stored response
    (_call({"role": "assistant", "content": [{"type": "text", "text": BROKEN}]}), True),     # content parts
    (_call({"role": "assistant", "content": "Done: wrote notes.md."}), False),
    (_call({"role": "assistant", "content": BROKEN, "tool_calls": [{"id": "1", "function": {"name": "bash"}}]}),
     False),                                                                              # the parser read a call
    (_call(None, None), False),
])
def test_an_answer_without_tool_calls_whose_text_opens_one_is_unparsed(call, unparsed):
    assert unparsed_tool_call(call, MARKERS) is unparsed


def test_a_rubric_config_can_name_other_markers():
    call = _call({"role": "assistant", "content": "[TOOL_CALLS] broken"})
    assert not unparsed_tool_call(call, MARKERS)
    assert unparsed_tool_call(call, RubricConfig.from_dict({"unparsed_markers": ["[TOOL_CALLS]"]}).unparsed_markers)


def test_versions_compare_on_unparsed_calls_per_rollout(store_url, tmp_path):
    ok = [Turn([("bash", {"command": "ls"})], ["a.txt\n"]), Turn(text="Done.")]
    broken = [Turn([("bash", {"command": "ls"})], ["a.txt\n"]), Turn(text=BROKEN)]
    with open_store(store_url, settings=Settings(home=tmp_path / "home")) as st:
        for v in ("A", "B"):
            st.register_policy_version(v, model_name="m")
        for t in range(10):
            st.register_task(f"t{t}", metadata={"family": "files"})
            for v in ("A", "B"):
                rid = f"{v}-{t}"
                st.start_rollout(rid, task_id=f"t{t}", policy_version_id=v, metadata={"purpose": "eval"})
                turns = broken if v == "B" and t < 4 else ok
                for rec in agent_calls(rid, turns, policy_version_id=v):
                    st.record_call(rec)
                st.finish_rollout(rid, "failure" if turns is broken else "success")
                st.add_reward(rid, 0.0 if turns is broken else 1.0)
        st.flush(30)
        assert rollout_rubrics(st.calls("B-0")).unparsed == 1 and rollout_rubrics(st.calls("B-9")).unparsed == 0
        diffs = {d.metric: d for d in compare_versions(st, "A", "B", n_boot=500)}
    d = diffs["unparsed_tool_calls_per_rollout"]
    assert (d.a, d.b, d.diff) == (0.0, 0.4, 0.4) and d.paired and d.ci95[0] > 0
    assert diffs["tool_calls_per_rollout"].diff == 0.0   # the broken call is no tool call: only this rubric sees it
