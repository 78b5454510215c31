"""The chat template the CPU engine serves SmolLM2 with: ChatML plus a compact Hermes tool section.

SmolLM2-135M-Instruct's own template has no tools: tool schemas are dropped and an agent harness cannot drive it.
`smollm2_tools.jinja` (next to this module) adds them, shaped by what a 135M model on a CPU can learn and afford:

- **Compact.** Every prompt token costs CPU time, at every turn: each tool is one line of the system turn,
  `- name(param, ...): first line of its description` (parameter names sorted: the store keeps tool schemas as
  canonical JSON with sorted keys, so an SFT shard re-rendered from the store must give the line the engine served),
  then one line saying how to call
  (`Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>`). The full JSON schemas a Hermes template
  writes would cost hundreds of tokens per tool. With this format SmolLM2 learned one-step shell tasks from 96
  demonstrations (40/40 held-out tasks exact after 40 SFT steps; /tmp/sft_probe.py, this session).
- **Hermes tool calls, parsed by vLLM's `hermes` parser.** An assistant turn is its content, then each call as
  `<tool_call>{"name": NAME, "arguments": ARGS}</tool_call>` (newline between calls), then `<|im_end|>`. ARGS is
  `tojson` of the arguments vLLM hands the template (it parses the client's JSON string into an object) and the
  parser returns `json.dumps(arguments, ensure_ascii=False)`: the same text. So a call the model emits, parsed and
  sent back by the harness in the next request, renders to the very text the model emitted, and the next prompt's
  ids start with the previous prompt + completion ids (the learner's merge rule; tests/slow/test_vllm_cpu.py).
- **Tool results as their own turn** (`<|im_start|>tool\n...<|im_end|>`), no `<tool_response>` wrapper.
- **`{% generation %}` around what the model generates** (content, calls, `<|im_end|>`), so transformers'
  `return_assistant_tokens_mask` (TRL's `assistant_only_loss`) masks exactly the generated tokens.
- **Without tools it is SmolLM2's template**, byte for byte (the default system prompt included).

The template is written into the served model folder (`tokenizer_config.json` and `chat_template.jinja`, which
transformers prefers), so vLLM, transformers, TRL and the learner's trainer render the same text from the same file.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

TEMPLATE_FILE = Path(__file__).with_name("smollm2_tools.jinja")


@functools.cache
def chat_template() -> str:
    """The Jinja source of the template the CPU engine serves (tools and tool calls in Hermes format)."""
    return TEMPLATE_FILE.read_text(encoding="utf-8")


def template_hash() -> str:
    """A short sha256 of the template, part of the model folder's spec: an edited template rebuilds the folder."""
    return hashlib.sha256(chat_template().encode()).hexdigest()[:16]
