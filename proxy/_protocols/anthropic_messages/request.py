"""An Anthropic Messages request as a chat-completions request.

``system`` (a string or text blocks) becomes the first system message and ``role: "system"`` entries stay system
messages where they stand; ``text`` / ``image`` blocks become chat parts (base64 images as data URLs, which the
stored copy moves to the blob store); assistant ``tool_use`` blocks become ``tool_calls`` and ``thinking`` blocks
``reasoning_content``; each ``tool_result`` becomes a ``tool`` message, in order. Tools with an ``input_schema`` go
upstream as functions (with ``strict``; other tool keys are listed in the call's metadata as
``tool_keys_not_forwarded``); Anthropic-hosted tools (web search, ...) cannot and are listed in the call's metadata.
``thinking: enabled|disabled`` is passed to the chat template as ``enable_thinking``.

Every other documented field goes upstream under its chat name, or has its equivalent there (``cache_control``, a
cache hint: the engine's prefix cache), or is listed in the call's metadata under ``not_forwarded`` by its field path
(``NOT_SENT``, a thinking or output setting chat has no knob for, ``tool_choice`` without tools): never lost
silently.
"""

from __future__ import annotations

import orjson

from ..body import check_body, check_image_media_type, check_image_url
from ..completion import chat_tool_call
from ..errors import bad_request

NOT_SENT = ("metadata", "service_tier", "container", "mcp_servers", "context_management", "inference_geo",
            "diagnostics", "speed", "user_profile_id", "workspace_id")  # no chat knob
_TOOL_KEYS = {"name", "description", "input_schema", "type", "strict", "cache_control"}
PROMPT_FIELDS = ("messages", "system", "tools")  # what becomes the stored prompt's messages and tools, not params
_KNOWN = {"model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k",
          "tools", "tool_choice", "thinking", "metadata", "service_tier", "container", "mcp_servers",
          "context_management", "output_config", "output_format", "inference_geo", "cache_control", "diagnostics",
          "speed", "user_profile_id", "workspace_id"}


def validate(body: dict) -> None:
    check_body(body)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
        raise bad_request("messages: Field required: a list of message objects", "messages", "invalid_messages")
    for i, m in enumerate(msgs):
        if m.get("role") not in ("user", "assistant", "system"):
            raise bad_request(f"messages.{i}.role: {m.get('role')!r} is not 'user', 'assistant' or 'system'",
                              "messages")
        c = m.get("content")
        if not isinstance(c, str) and not (isinstance(c, list) and all(isinstance(b, dict) for b in c)):
            raise bad_request(f"messages.{i}.content: must be a string or a list of content blocks", "messages")
    for key, kind in (("system", (str, list)), ("tools", list), ("model", str), ("stop_sequences", list),
                      ("thinking", dict), ("tool_choice", dict)):
        if body.get(key) is not None and not isinstance(body[key], kind):
            raise bad_request(f"{key}: has the wrong type ({type(body[key]).__name__})", key)
    choice = body.get("tool_choice") or {}
    if choice.get("type") == "tool" and not isinstance(choice.get("name"), str):
        raise bad_request("tool_choice: type 'tool' needs the 'name' of the tool to call; pass "
                          "{\"type\": \"tool\", \"name\": ...}, or type 'any' for any tool", "tool_choice")
    mt = body.get("max_tokens")
    if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
        raise bad_request(f"max_tokens: {mt!r} is not a positive integer", "max_tokens")
    if any(not isinstance(t, dict) for t in body.get("tools") or []) or any(
            not isinstance(b, dict) for b in body.get("system") or [] if isinstance(body.get("system"), list)):
        raise bad_request("tools and system blocks must be objects", "tools")


def _image(block: dict, where: str) -> dict:
    src = block.get("source") if isinstance(block.get("source"), dict) else {}
    if src.get("type") == "base64" and isinstance(src.get("data"), str):
        if src.get("media_type") is not None:
            check_image_media_type(src["media_type"], where, "messages")
        url = f"data:{src.get('media_type') or 'image/png'};base64,{src['data']}"
    elif src.get("type") == "url" and isinstance(src.get("url"), str):
        check_image_url(src["url"], where, "messages")
        url = src["url"]
    else:
        raise bad_request(f"{where}: an image needs a base64 or url source", "messages", "invalid_image")
    return {"type": "image_url", "image_url": {"url": url}}


def _part(block: dict, where: str) -> dict:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": block.get("text") if isinstance(block.get("text"), str) else ""}
    if kind == "image":
        return _image(block, where)
    src = block.get("source") if isinstance(block.get("source"), dict) else {}
    if kind == "document" and src.get("type") == "text":
        return {"type": "text", "text": src.get("data") or ""}
    raise bad_request(f"{where}: content block type {kind!r} cannot go to a chat-completions upstream; send text, "
                      "image, tool_use, tool_result or thinking blocks, or run the proxy with messages mode "
                      "'native'", "messages", "unsupported_content")


def _content(parts: list[dict]):
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _tool_result(block: dict, where: str):
    c = block.get("content", "")
    if isinstance(c, list):
        parts = [_part(x, f"{where}.content.{k}") for k, x in enumerate(c) if isinstance(x, dict)]
        return _content(parts) if parts else ""
    return c if isinstance(c, str) else ""


def _user(blocks: list[dict], where: str, notes: dict) -> list[dict]:
    out, parts = [], []
    for j, b in enumerate(blocks):
        if b.get("type") == "tool_result":
            if parts:
                out.append({"role": "user", "content": _content(parts)})
                parts = []
            if not isinstance(b.get("tool_use_id"), str):
                raise bad_request(f"{where}.{j}: a tool_result needs a 'tool_use_id' string", "messages")
            if b.get("is_error"):
                notes["tool_result_is_error"] = notes.get("tool_result_is_error", 0) + 1
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": _tool_result(b, f"{where}.{j}")})
        else:
            parts.append(_part(b, f"{where}.{j}"))
    if parts:
        out.append({"role": "user", "content": _content(parts)})
    return out


def _assistant(blocks: list[dict], where: str, notes: dict) -> dict:
    msg: dict = {"role": "assistant", "content": None}
    text, thinking, calls = [], [], []
    for j, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "text":
            text.append(b.get("text") or "")
        elif kind == "thinking":
            thinking.append(b.get("thinking") or "")
        elif kind == "redacted_thinking":
            notes["redacted_thinking_not_forwarded"] = notes.get("redacted_thinking_not_forwarded", 0) + 1
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise bad_request(f"{where}.{j}: a tool_use needs 'id' and 'name' strings", "messages")
            calls.append(chat_tool_call(b["id"], b["name"], orjson.dumps(b.get("input") or {}).decode()))
        else:
            raise bad_request(f"{where}.{j}: assistant content block type {kind!r} cannot go to a chat-completions "
                              "upstream; send text, thinking or tool_use blocks", "messages", "unsupported_content")
    if text:
        msg["content"] = "".join(text)
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    return msg


def chat_messages(body: dict, notes: dict) -> list[dict]:
    out = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": system if isinstance(system, str) else _content(
            [_part(b, f"system.{j}") for j, b in enumerate(system)])})
    for i, m in enumerate(body["messages"]):
        c = m["content"]
        blocks = [{"type": "text", "text": c}] if isinstance(c, str) else c
        if m["role"] == "assistant":
            out.append(_assistant(blocks, f"messages.{i}.content", notes))
        elif m["role"] == "system":
            out.append({"role": "system", "content": c if isinstance(c, str) else _content(
                [_part(b, f"messages.{i}.content.{j}") for j, b in enumerate(c)])})
        else:
            out += _user(blocks, f"messages.{i}.content", notes)
    return out


def chat_tools(tools: list, notes: dict) -> list[dict]:
    out, skipped = [], []
    for t in tools:
        if isinstance(t.get("input_schema"), dict) and isinstance(t.get("name"), str):
            fn = {"name": t["name"], "parameters": t["input_schema"]}
            if t.get("description"):
                fn["description"] = t["description"]
            if t.get("strict") is not None:   # chat tools take it as they are: structured outputs for the arguments
                fn["strict"] = t["strict"]
            if dropped := sorted(set(t) - _TOOL_KEYS):
                notes.setdefault("tool_keys_not_forwarded", []).extend(f"{t['name']}.{k}" for k in dropped)
            out.append({"type": "function", "function": fn})
        else:
            skipped.append(t.get("type") or t.get("name"))
    if skipped:
        notes["tools_not_forwarded"] = skipped
    return out


def tool_choice(choice: dict):
    kind = choice.get("type")
    if kind == "tool" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind, "auto")


def chat_request(body: dict, messages: list[dict], tools: list[dict], notes: dict) -> dict:
    """The chat-completions request for a Messages ``body`` whose messages and tools became ``messages``, ``tools``."""
    chat = {k: v for k, v in body.items() if k not in _KNOWN}  # unknown sampling knobs go upstream as they are
    chat.update(model=body.get("model"), messages=messages, stream=bool(body.get("stream")))
    for src, dst in (("max_tokens", "max_tokens"), ("stop_sequences", "stop"), ("temperature", "temperature"),
                     ("top_p", "top_p"), ("top_k", "top_k")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    if tools:
        chat["tools"] = tools
        choice = body.get("tool_choice") or {}
        if choice:
            chat["tool_choice"] = tool_choice(choice)
        if choice.get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    thinking = (body.get("thinking") or {}).get("type")
    if thinking in ("enabled", "disabled"):
        chat["chat_template_kwargs"] = {**(chat.get("chat_template_kwargs") or {}),
                                        "enable_thinking": thinking == "enabled"}
    effort = (body.get("output_config") or {}).get("effort")
    if effort in ("low", "medium", "high"):
        chat["reasoning_effort"] = effort
    fmt = (body.get("output_config") or {}).get("format") or body.get("output_format") or {}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output",
                                                                           "schema": fmt.get("schema") or {}}}
    if missed := not_forwarded(body, tools):
        notes.setdefault("not_forwarded", []).extend(missed)
    return chat


def not_forwarded(body: dict, tools: list[dict]) -> list[str]:
    """The field paths of ``body`` that do not go upstream (see the module docstring)."""
    missed = [k for k in NOT_SENT if body.get(k) is not None]
    choice, thinking = body.get("tool_choice") or {}, body.get("thinking") or {}
    if choice and not tools:
        missed.append("tool_choice")
    elif choice.get("type") not in (None, "auto", "any", "none", "tool"):
        missed.append("tool_choice.type")
    if thinking.get("type") not in (None, "enabled", "disabled"):
        missed.append("thinking.type")
    missed += [f"thinking.{k}" for k in sorted(thinking) if k != "type" and thinking[k] is not None]
    config = body.get("output_config") or {}
    config = config if isinstance(config, dict) else {}
    if config.get("effort") not in (None, "low", "medium", "high"):
        missed.append("output_config.effort")
    missed += [f"output_config.{k}" for k in sorted(config) if k not in ("effort", "format") and config[k] is not None]
    fmt, other = (config.get("format"), "output_config.format"), (body.get("output_format"), "output_format")
    for (value, path), shadowed in ((fmt, False), (other, bool(config.get("format")))):
        if value and (shadowed or not isinstance(value, dict) or value.get("type") != "json_schema"):
            missed.append(path)
    return missed


def tokenize_request(body: dict) -> dict:
    """The body of a vLLM ``/tokenize`` request that counts a Messages request's prompt with the chat template."""
    validate(body)
    tokenize = {"model": body.get("model"), "messages": chat_messages(body, {}), "add_generation_prompt": True}
    if tools := chat_tools(body.get("tools") or [], {}):
        tokenize["tools"] = tools
    return tokenize
