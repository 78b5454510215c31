"""A Responses request as a chat-completions request: input items as chat messages, tools as chat tools.

Input items become chat messages (``developer`` -> ``system``; ``reasoning`` items -> the next assistant message's
``reasoning_content``; ``function_call`` / ``custom_tool_call`` -> ``tool_calls``; ``*_output`` -> ``tool``
messages). Function tools go upstream as chat tools, ``custom`` tools as functions taking one string ``input``,
``namespace`` tools flattened to ``namespace.name``; hosted tools (``web_search``, ``file_search``, ...) cannot run
on a local model and are listed in the call's metadata as not forwarded.

Every other documented field goes upstream under its chat name, or is served by the proxy itself (``store``,
``previous_response_id``, ``include: reasoning.encrypted_content``), or has its equivalent there (the cache hints
``prompt_cache_key`` / ``prompt_cache_retention``: the engine's prefix cache and the proxy's rollout affinity), or is
listed in the call's metadata under ``not_forwarded`` by its field path (``NOT_SENT``, a reasoning effort or text
setting chat has no knob for, ``tool_choice`` without tools, ``include`` entries not served): never lost silently.
"""

from __future__ import annotations

import orjson

from ..body import check_body, check_image_url
from ..completion import chat_tool_call
from ..errors import bad_request
from .answer import ToolMap, unseal

_KNOWN = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
          "temperature", "top_p", "top_logprobs", "reasoning", "text", "stream", "stream_options", "store",
          "include", "previous_response_id", "prompt_cache_key", "prompt_cache_retention", "client_metadata",
          "metadata", "user", "safety_identifier", "service_tier", "truncation", "background", "max_tool_calls",
          "conversation", "prompt", "context_management"}
NOT_SENT = ("stream_options", "client_metadata", "metadata", "user", "safety_identifier", "service_tier", "truncation",
            "background", "max_tool_calls", "conversation", "prompt", "context_management")  # no chat knob
PROMPT_FIELDS = ("input", "instructions", "tools")  # what becomes the stored prompt's messages and tools, not params
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def validate(body: dict) -> None:
    check_body(body)
    inp = body.get("input")
    if inp is None and not body.get("previous_response_id"):
        raise bad_request("'input' is required: a string or a list of input items", "input", "missing_input")
    if inp is not None and not isinstance(inp, str) and not (
            isinstance(inp, list) and all(isinstance(i, dict) for i in inp)):
        raise bad_request("'input' must be a string or a list of input item objects", "input", "invalid_input")
    for key, kind in (("tools", list), ("instructions", (str, list)), ("previous_response_id", str),
                      ("model", str), ("reasoning", dict), ("text", dict), ("include", list)):
        if body.get(key) is not None and not isinstance(body[key], kind):
            raise bad_request(f"'{key}' has the wrong type ({type(body[key]).__name__})", key, "invalid_type")
    if any(not isinstance(t, dict) for t in body.get("tools") or []):
        raise bad_request("'tools' must be a list of tool objects", "tools", "invalid_tools")


def _text(parts, where: str) -> str:
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise bad_request(f"{where}: content must be a string or a list of content parts", "input")
    return "".join(p.get("text") or p.get("refusal") or "" for p in parts if isinstance(p, dict))


def _parts(content, where: str):
    """Responses content -> chat content: a string, or chat parts (text / image_url)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: content must be a string or a list of content parts", "input")
    out = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in _TEXT_PARTS or kind == "refusal":
            out.append({"type": "text", "text": p.get("text") or p.get("refusal") or ""})
        elif kind == "input_image" and isinstance(p.get("image_url"), str):
            check_image_url(p["image_url"], where, "input")
            url = {"url": p["image_url"], **({"detail": p["detail"]} if p.get("detail") else {})}
            out.append({"type": "image_url", "image_url": url})
        else:
            raise bad_request(f"{where}: content part {kind!r} cannot go to a chat-completions upstream; send "
                              "input_text, output_text or input_image with an image_url (file ids are not "
                              "resolved)", "input", "unsupported_content")
    if len(out) == 1 and out[0]["type"] == "text":
        return out[0]["text"]
    return out


def input_messages(items: list, tools: ToolMap, notes: dict) -> list[dict]:
    msgs: list[dict] = []

    def open_assistant(fresh_only: bool) -> dict:
        last = msgs[-1] if msgs else None
        if last is None or last["role"] != "assistant" or (fresh_only and (last.get("content") is not None
                                                                             or last.get("tool_calls"))):
            last = {"role": "assistant", "content": None}
            msgs.append(last)
        return last

    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = _ROLES.get(item.get("role"))
            if role is None:
                raise bad_request(f"{where}: role {item.get('role')!r} is not one of {', '.join(_ROLES)}", "input")
            if role == "assistant":
                open_assistant(fresh_only=True)["content"] = _text(item.get("content"), where)
            else:
                msgs.append({"role": role, "content": _parts(item.get("content"), where)})
        elif kind == "reasoning":
            parts = [p.get("text", "") for p in item.get("content") or [] if isinstance(p, dict)]
            text = "".join(parts) if parts else unseal(item.get("encrypted_content"))
            if text is None:
                notes["reasoning_items_not_forwarded"] = notes.get("reasoning_items_not_forwarded", 0) + 1
                continue
            msg = open_assistant(fresh_only=True)
            msg["reasoning_content"] = (msg.get("reasoning_content") or "") + text
        elif kind in ("function_call", "custom_tool_call"):
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str):
                raise bad_request(f"{where}: a {kind} needs 'call_id' and 'name' strings", "input")
            name = tools.chat_name(item["name"], item.get("namespace"))
            args = item.get("arguments") if kind == "function_call" else orjson.dumps(
                {"input": item.get("input", "")}).decode()
            msg = open_assistant(fresh_only=False)
            msg.setdefault("tool_calls", []).append(chat_tool_call(item["call_id"], name, args or ""))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if not isinstance(item.get("call_id"), str):
                raise bad_request(f"{where}: a {kind} needs a 'call_id' string", "input")
            msgs.append({"role": "tool", "tool_call_id": item["call_id"], "content": _parts(item.get("output", ""),
                                                                                            where)})
        else:
            raise bad_request(f"{where}: input item type {kind!r} cannot be translated to chat completions; "
                              "send message, reasoning, function_call(_output) or custom_tool_call(_output) items, "
                              "or run the proxy with responses mode 'native'", "input", "unsupported_item")
    return msgs


# What a Responses tool of each kind may hold, all of it carried into the chat tool (``format`` becomes the input's
# description); any other key is listed in the call's metadata as ``tool_keys_not_forwarded``.
_TOOL_KEYS = {"function": {"type", "name", "description", "parameters", "strict"},
              "custom": {"type", "name", "description", "format"}}


def chat_tools(tools: list, notes: dict) -> tuple[list[dict], ToolMap]:
    out, tmap, skipped = [], ToolMap(), []

    def add(t: dict, namespace: str | None) -> None:
        kind, name = t.get("type"), t.get("name")
        if kind not in ("function", "custom"):
            skipped.append(f"{namespace}.{kind}" if namespace else str(kind))
            return
        if not isinstance(name, str) or not name:
            raise bad_request(f"a {kind} tool needs a 'name' string", "tools", "invalid_tools")
        fn = {"name": tmap.chat_name(name, namespace)}
        if t.get("description"):
            fn["description"] = t["description"]
        dropped = sorted(set(t) - _TOOL_KEYS[kind])
        if dropped:   # keys this translation does not know: said in the call's metadata, never silently lost
            notes.setdefault("tool_keys_not_forwarded", []).extend(f"{fn['name']}.{k}" for k in dropped)
        if kind == "function":
            fn["parameters"] = t.get("parameters") or {"type": "object", "properties": {}}
            if t.get("strict") is not None:   # chat tools take it as they are: structured outputs for the arguments
                fn["strict"] = t["strict"]
        else:
            fmt = t.get("format") or {}
            hint = f"Free-form input ({fmt.get('syntax', 'text')}): {fmt['definition']}" if fmt.get(
                "definition") else "Free-form input."
            fn["parameters"] = {"type": "object", "properties": {"input": {"type": "string", "description": hint}},
                                "required": ["input"]}
        tmap.by_chat[fn["name"]] = (kind, namespace, name)
        out.append({"type": "function", "function": fn})

    for t in tools:
        if t.get("type") == "namespace" and isinstance(t.get("tools"), list):
            for inner in t["tools"]:
                if isinstance(inner, dict):
                    add(inner, t.get("name"))
        else:
            add(t, None)
    if skipped:
        notes["tools_not_forwarded"] = skipped
    return out, tmap


def tool_choice(choice, tmap: ToolMap, notes: dict):
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and choice.get("name"):
        return {"type": "function", "function": {"name": tmap.chat_name(choice["name"], choice.get("namespace"))}}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        return choice.get("mode", "auto")
    notes["tool_choice_not_forwarded"] = choice
    return "auto"


def chat_request(body: dict, messages: list[dict], tools: list[dict], tmap: ToolMap, notes: dict) -> dict:
    """The chat-completions request for a Responses ``body`` whose input became ``messages`` and ``tools``."""
    chat = {k: v for k, v in body.items() if k not in _KNOWN}  # unknown sampling knobs go upstream as they are
    chat.update(model=body.get("model"), messages=messages, stream=bool(body.get("stream")))
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("top_logprobs", "top_logprobs")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    if tools:
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = tool_choice(body["tool_choice"], tmap, notes)
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    effort = (body.get("reasoning") or {}).get("effort")
    if effort in ("low", "medium", "high"):
        chat["reasoning_effort"] = effort
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    elif fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    if missed := not_forwarded(body, tools):
        notes.setdefault("not_forwarded", []).extend(missed)
    return chat


def not_forwarded(body: dict, tools: list[dict]) -> list[str]:
    """The field paths of ``body`` that neither go upstream nor are served by the proxy (see the module docstring)."""
    missed = [k for k in NOT_SENT if body.get(k) is not None]
    if not tools:
        missed += [k for k in ("tool_choice", "parallel_tool_calls") if body.get(k) is not None]
    reasoning, text = body.get("reasoning") or {}, body.get("text") or {}
    if reasoning.get("effort") not in (None, "low", "medium", "high"):
        missed.append("reasoning.effort")
    missed += [f"reasoning.{k}" for k in sorted(reasoning) if k != "effort" and reasoning[k] is not None]
    fmt = text.get("format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_schema", "json_object")):
        missed.append("text.format")
    missed += [f"text.{k}" for k in sorted(text) if k != "format" and text[k] is not None]
    missed += [f"include.{i}" for i in body.get("include") or [] if i != "reasoning.encrypted_content"]
    return missed
