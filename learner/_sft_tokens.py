"""An SFT conversation as token ids and labels (-100 outside the assistant's tokens), with the checkpoint's own
chat template: the text the engine serves. Used by the CPU train step (``train_step.py``, run by path in the
engine's torch environment), so this module imports nothing of the project.
"""

from __future__ import annotations

import re

_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


class StepError(RuntimeError):
    """A sample or a template the step cannot train on; the message says why."""


def _render(tok, messages, tools, **kw) -> str:
    return tok.apply_chat_template(messages, tools=tools or None, tokenize=False, **kw)


def _assistant_spans(tok, messages: list[dict], tools) -> tuple[str, list[tuple[int, int]]]:
    """The full text and the character spans of each assistant message's generated part, prefix by prefix."""
    full = _render(tok, messages, tools)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = _render(tok, messages[:i], tools, add_generation_prompt=True) if i else ""
        end = _render(tok, messages[:i + 1], tools)
        if not (end.startswith(start) and full.startswith(end)):
            raise StepError("the chat template does not render a conversation's prefixes as prefixes of the whole "
                            "(message %d), so its assistant tokens cannot be located; mark them with "
                            "{%% generation %%} in the template" % i)
        spans.append((len(start), len(end)))
    return full, spans


def sft_tokens(tok, sample: dict) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 outside the assistant's tokens) of one conversation."""
    messages, tools = sample["messages"], sample.get("tools")
    if _GENERATION.search(tok.chat_template or ""):
        enc = tok.apply_chat_template(messages, tools=tools or None, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        ids = list(enc["input_ids"])
        return ids, [t if m else -100 for t, m in zip(ids, enc["assistant_masks"])]
    text, spans = _assistant_spans(tok, messages, tools)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = [t if any(s <= a and b <= e for s, e in spans) and b > a else -100
              for t, (a, b) in zip(enc["input_ids"], enc["offset_mapping"])]
    return list(enc["input_ids"]), labels
