"""Everything of a Gemini request besides its contents, as chat completions: tools, tool config, generation config.

Tools: ``functionDeclarations`` go upstream as chat functions, ``parametersJsonSchema`` as it is and ``parameters``
(Google's OpenAPI subset) with its upper-case type names lower-cased, so the same tool hashes the same
(``tool_schema_hash``) whichever of the four APIs declared it; a function without parameters takes an empty object,
as a Responses function does. Google-hosted tools (``googleSearch``, ``codeExecution``, ...) cannot run on a local
model and are listed in the call's metadata (``tools_not_forwarded``), as are declaration keys with no chat
equivalent (``tool_keys_not_forwarded``: ``response``, ``behavior``).

``toolConfig.functionCallingConfig.mode``: AUTO -> "auto", ANY -> "required" (with one allowed name: that function),
NONE -> "none". ``generationConfig``: temperature, topP, topK, maxOutputTokens, stopSequences, seed and the two
penalties under their chat names; ``responseJsonSchema`` / ``responseSchema`` as a ``json_schema`` response format,
``responseMimeType: application/json`` alone as ``json_object``; ``thinkingConfig.thinkingBudget`` 0 turns the chat
template's ``enable_thinking`` off, any other budget on; ``thinkingLevel`` low/medium/high is ``reasoning_effort``.
Whatever has no chat knob (a budget's size, logprobs, safety settings, speech and image settings, VALIDATED mode,
allowed names beyond one) is listed in the call's metadata under ``not_forwarded``, by its field path.
"""

from __future__ import annotations

from ..errors import bad_request
from .request import CAMEL, fields

# generationConfig -> chat: forwarded under the chat name; NOTED are kept in the record's metadata as not forwarded.
SAMPLING = {"temperature": "temperature", "topP": "top_p", "topK": "top_k", "maxOutputTokens": "max_tokens",
            "stopSequences": "stop", "seed": "seed", "presencePenalty": "presence_penalty",
            "frequencyPenalty": "frequency_penalty"}
NOTED = ("responseLogprobs", "logprobs", "enableEnhancedCivicAnswers", "speechConfig", "imageConfig",
         "mediaResolution", "audioTimestamp", "routingConfig", "modelSelectionConfig")
DECLARATION = ("name", "description", "parameters", "parametersJsonSchema", "response", "responseJsonSchema",
               "behavior")
_FORWARDED = {"name", "description", "parameters", "parametersJsonSchema"}  # of a declaration's keys
_MODES = {"AUTO": "auto", "ANY": "required", "NONE": "none", "VALIDATED": "auto"}


def json_schema(schema):
    """Google's OpenAPI-subset ``Schema`` as JSON Schema: its type names (``STRING``, ``OBJECT``) lower-cased, in the
    schema and every schema inside it; property names and everything else as sent."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out[key] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: json_schema(s) for name, s in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "not", "additionalProperties"):
            out[key] = json_schema(value)
        else:
            out[key] = value
    return out


def chat_tools(tools: list, notes: dict) -> list[dict]:
    out, skipped = [], []
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad_request(f"tools[{k}]: must be a Tool object", "tools", "invalid_tools")
        for key, value in tool.items():
            if key not in ("functionDeclarations", "function_declarations"):
                skipped.append(CAMEL.sub(lambda m: m.group(1).upper(), key))
                continue
            for d, decl in enumerate(value or []):
                out.append(_declaration(fields(decl, DECLARATION, f"tools[{k}].functionDeclarations[{d}]"), notes))
    if skipped:
        notes["tools_not_forwarded"] = skipped
    return out


def _declaration(decl: dict, notes: dict) -> dict:
    name = decl.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("tools: a functionDeclaration needs a 'name' string", "tools", "invalid_tools")
    if decl.get("parameters") is not None and decl.get("parametersJsonSchema") is not None:
        raise bad_request(f"tools: function {name!r} sends both parameters and parametersJsonSchema; send one",
                          "tools", "invalid_tools")
    fn = {"name": name}
    if decl.get("description"):
        fn["description"] = decl["description"]
    schema = decl.get("parametersJsonSchema")
    if schema is None and decl.get("parameters") is not None:
        schema = json_schema(decl["parameters"])
    fn["parameters"] = schema if schema is not None else {"type": "object", "properties": {}}
    dropped = sorted(set(decl) - _FORWARDED)
    if dropped:
        notes.setdefault("tool_keys_not_forwarded", []).extend(f"{name}.{key}" for key in dropped)
    return {"type": "function", "function": fn}


def _tool_choice(config, notes: dict):
    cfg = fields(config, ("functionCallingConfig", "retrievalConfig", "includeServerSideToolInvocations"),
                 "toolConfig")
    for key in sorted(set(cfg) - {"functionCallingConfig"}):
        notes.setdefault("not_forwarded", []).append(f"toolConfig.{key}")
    fcc = fields(cfg.get("functionCallingConfig") or {},
                 ("mode", "allowedFunctionNames", "streamFunctionCallArguments"), "toolConfig.functionCallingConfig")
    mode = str(fcc.get("mode") or "AUTO").upper()
    if mode not in _MODES:
        raise bad_request(f"toolConfig.functionCallingConfig.mode: {fcc['mode']!r} is not one of "
                          f"{', '.join(_MODES)}", "toolConfig", "invalid_value")
    names = fcc.get("allowedFunctionNames") or []
    if mode == "ANY" and len(names) == 1:
        return {"type": "function", "function": {"name": names[0]}}
    missed = ["mode"] if mode == "VALIDATED" else []  # schema-checked calls: chat has no such mode ("auto" goes)
    missed += [k for k in ("allowedFunctionNames", "streamFunctionCallArguments") if fcc.get(k)]
    notes.setdefault("not_forwarded", []).extend(f"toolConfig.functionCallingConfig.{k}" for k in missed)
    return _MODES[mode]


def _response_format(gen: dict):
    if gen.get("responseJsonSchema") is not None and gen.get("responseSchema") is not None:
        raise bad_request("generationConfig: responseSchema and responseJsonSchema are both set; send one",
                          "generationConfig.responseJsonSchema", "invalid_value")
    schema = gen.get("responseJsonSchema")
    if schema is None and gen.get("responseSchema") is not None:
        schema = json_schema(gen["responseSchema"])
    if schema is not None:
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    mime = gen.get("responseMimeType")
    if mime == "application/json":
        return {"type": "json_object"}
    if mime not in (None, "text/plain"):
        raise bad_request(f"generationConfig.responseMimeType: {mime!r}: without a schema the engine answers "
                          "text/plain or application/json; send one of those, or a responseSchema",
                          "generationConfig.responseMimeType", "unsupported_value")
    return None


def _thinking(config, chat: dict, notes: dict) -> None:
    cfg = fields(config, ("includeThoughts", "thinkingBudget", "thinkingLevel"), "generationConfig.thinkingConfig")
    budget, level = cfg.get("thinkingBudget"), cfg.get("thinkingLevel")
    if budget is not None:  # 0: off; -1 (dynamic) or a budget: on (the chat template's switch; a budget is no knob)
        chat["chat_template_kwargs"] = {**(chat.get("chat_template_kwargs") or {}), "enable_thinking": budget != 0}
        if budget not in (0, -1):
            notes.setdefault("not_forwarded", []).append("generationConfig.thinkingConfig.thinkingBudget")
    if level is not None:
        if str(level).lower() in ("low", "medium", "high"):
            chat["reasoning_effort"] = str(level).lower()
        else:
            notes.setdefault("not_forwarded", []).append("generationConfig.thinkingConfig.thinkingLevel")


def chat_request(req: dict, model: str, messages: list[dict], tools: list[dict], stream: bool, notes: dict) -> dict:
    """The chat-completions request for a checked Gemini request ``req`` (``request``) whose contents and tools became
    ``messages`` and ``tools``."""
    chat: dict = {"model": model, "messages": messages, "stream": stream}
    gen = req["generationConfig"]
    for src, dst in SAMPLING.items():
        if gen.get(src) is not None:
            chat[dst] = gen[src]
    if (fmt := _response_format(gen)) is not None:
        chat["response_format"] = fmt
    if gen.get("thinkingConfig") is not None:
        _thinking(gen["thinkingConfig"], chat, notes)
    not_forwarded = [f"generationConfig.{k}" for k in NOTED if gen.get(k) is not None]
    not_forwarded += [k for k in ("safetySettings", "labels", "serviceTier") if req.get(k) is not None]
    if not_forwarded:
        notes.setdefault("not_forwarded", []).extend(not_forwarded)
    if tools:
        chat["tools"] = tools
        if req.get("toolConfig") is not None:
            chat["tool_choice"] = _tool_choice(req["toolConfig"], notes)
    elif req.get("toolConfig") is not None:
        notes.setdefault("not_forwarded", []).append("toolConfig")
    return chat
