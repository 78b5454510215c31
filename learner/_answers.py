"""Answers whose text holds tool-call markup that the server's tool parser did not read.

A model served with a tool parser (vLLM's ``hermes`` for SmolLM2 and Qwen: ``<tool_call>{json}</tool_call>``) gets
its calls back as ``tool_calls`` only when the markup parses. A call whose JSON is broken (an unescaped quote in a
shell command, say) comes back as the answer's text, and the harness takes it as the final answer: the turn ends
with no tool run. The other rubrics never see it (it is not a tool call), so a policy that learns to break its
calls looks like one that learns to call fewer tools. That is what the learning loop's GRPO rounds did on seed 1
(README, 2026-12-05): 2% of the SFT policy's sampled answers, 12% of the final version's.

The markers are :class:`learner._analysis_config.RubricConfig`'s ``unparsed_markers``.
"""

from __future__ import annotations

from collections.abc import Sequence


def unparsed_tool_call(call, markers: Sequence[str]) -> bool:
    """True when ``call``'s answer has no tool call and its text contains one of ``markers``."""
    msg = call.response_message or call.response or {}
    if any(isinstance(tc, dict) for tc in (msg.get("tool_calls") or [])):
        return False
    text = msg.get("content") if "content" in msg else msg.get("text")
    if isinstance(text, list):   # content parts
        text = "".join(p.get("text") or "" for p in text if isinstance(p, dict))
    return isinstance(text, str) and any(m in text for m in markers)
