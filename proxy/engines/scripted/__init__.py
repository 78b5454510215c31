"""The scripted engine: an OpenAI-compatible engine that answers from a script instead of a model.

A product, not a test rig: the demo's scripted teacher is this engine (`Conversations`: each task's reference
solution played turn by turn as tool calls, `steps_from_actions`), and users point a proxy at it to test their own
harness integration without a GPU. `ScriptedUpstream` speaks vLLM's token-id protocol (prompt and completion token
ids, logprobs), tokenizes with SmolLM2's real tokenizer (read from the GGUF file, `load_smollm2_tokenizer`) and
answers from a `Script`; `UpstreamServer` serves it over HTTP in a thread, `python -m proxy.engines.scripted.upstream`
in a process of its own. Rigs that only tests need (several replicas in processes, one to kill) live in
`tests/doubles/`.
"""

from __future__ import annotations

import importlib
from typing import Any

from .conversations import Conversations, steps_from_actions
from .script import Delay, HTTPError, Script, Step, Text, ToolCall, ToolCalls, load_script
from .server import UpstreamServer
from .tokenizer import ChatTokenizer, load_smollm2_tokenizer, load_tokenizer_from_gguf

# Imported on first use, so that `python -m proxy.engines.scripted.upstream` does not load the module twice.
_LAZY = {"RecordedRequest": "upstream", "ScriptedUpstream": "upstream", "run_upstream": "serve"}

__all__ = [
    "ChatTokenizer",
    "Conversations",
    "Delay",
    "HTTPError",
    "RecordedRequest",
    "Script",
    "ScriptedUpstream",
    "Step",
    "Text",
    "ToolCall",
    "ToolCalls",
    "UpstreamServer",
    "load_script",
    "load_smollm2_tokenizer",
    "load_tokenizer_from_gguf",
    "run_upstream",
    "steps_from_actions",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"proxy.engines.scripted.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'proxy.engines.scripted' has no attribute {name!r}")
