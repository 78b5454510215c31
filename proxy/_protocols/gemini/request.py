"""A Gemini API ``GenerateContentRequest`` as a chat-completions request.

Field names: the REST API reads proto3 JSON, which takes ``systemInstruction`` and ``system_instruction`` alike (the
SDKs send camelCase, Google's curl examples snake_case); every object the API defines is read in both spellings
(``_fields``), never the user's own JSON inside it (function arguments, schemas, responses). A field the API does not
define is a 400 naming it, as Google answers.

Contents: ``systemInstruction`` becomes the first system message; ``user`` contents become user messages (text and
``inlineData`` images as chat parts, the images as data URLs the store keeps as blobs) and each ``functionResponse``
a ``tool`` message (its ``response`` object as JSON text), in order; ``model`` contents become assistant messages
(``thought`` text as ``reasoning_content``, ``functionCall`` as ``tool_calls``). Gemini function calls need not carry
ids; chat tool calls must: a call without one gets ``call_{content}_{part}`` (stable from turn to turn, so the prompt
of the next call extends this one) and a ``functionResponse`` without one answers the earliest unanswered call of its
name. Part keys with no chat equivalent (Google's opaque ``thoughtSignature``, a call's ``willContinue``, an image's
``displayName``) are listed in the call's metadata as ``part_keys_not_forwarded``.
"""

from __future__ import annotations

import re

import orjson

from ..body import check_body, check_image_url
from ..completion import chat_tool_call
from ..errors import bad_request

PROMPT_FIELDS = ("contents", "systemInstruction", "tools")  # what becomes the stored prompt, not params
TOP = ("contents", "systemInstruction", "tools", "toolConfig", "safetySettings", "generationConfig", "cachedContent",
       "labels", "serviceTier", "model")
GENERATION = ("stopSequences", "responseMimeType", "responseSchema", "responseJsonSchema", "responseModalities",
              "candidateCount", "maxOutputTokens", "temperature", "topP", "topK", "seed", "presencePenalty",
              "frequencyPenalty", "responseLogprobs", "logprobs", "enableEnhancedCivicAnswers", "speechConfig",
              "thinkingConfig", "imageConfig", "mediaResolution", "audioTimestamp", "routingConfig",
              "modelSelectionConfig")
_CONTENT = ("role", "parts")
_PART = ("text", "thought", "thoughtSignature", "inlineData", "fileData", "functionCall", "functionResponse",
         "executableCode", "codeExecutionResult", "videoMetadata", "partMetadata", "mediaResolution")
CAMEL = re.compile(r"_([a-z])")


def fields(obj, known: tuple[str, ...], where: str) -> dict:
    """``obj`` (an object the API defines) with snake_case names read as their camelCase ones; a name the API does not
    define there is the client's 400, naming it."""
    if not isinstance(obj, dict):
        raise bad_request(f"Invalid JSON payload received. {where or 'the request'}: expected an object, got "
                          f"{type(obj).__name__}", where or None, "invalid_type")
    out = {}
    for key, value in obj.items():
        name = CAMEL.sub(lambda m: m.group(1).upper(), key)
        if name not in known:
            at = f"{where}.{key}" if where else key
            raise bad_request(f'Invalid JSON payload received. Unknown name "{key}" at \'{where or "the top level"}\':'
                              f" Cannot find field. The Gemini API defines {', '.join(known)} there; remove {at!r}",
                              at, "unknown_field")
        if name in out:
            raise bad_request(f"Invalid JSON payload received. {where or 'the request'} names {name!r} twice (in "
                              "camelCase and snake_case); send it once", name, "duplicate_field")
        out[name] = value
    return out


def request(body: dict) -> dict:
    """The request's known fields, camelCase, with its generation config's too; the client's 400 otherwise."""
    check_body(body)
    req = fields(body, TOP, "")
    if not isinstance(req.get("contents"), list) or not req["contents"]:
        raise bad_request('contents: required: at least one Content ({"role": "user", "parts": [{"text": ...}]})',
                          "contents", "missing_contents")
    req["generationConfig"] = fields(req.get("generationConfig") or {}, GENERATION, "generationConfig")
    for key in ("tools", "safetySettings"):
        if req.get(key) is not None and not isinstance(req[key], list):
            raise bad_request(f"{key}: must be a list, not {type(req[key]).__name__}", key, "invalid_type")
    if req.get("cachedContent") is not None:
        raise bad_request(f"cachedContent: {req['cachedContent']!r} names content cached by Google, which a local "
                          "engine cannot read (and the proxy could not record it); send the contents themselves",
                          "cachedContent", "unsupported_field")
    gen = req["generationConfig"]
    if gen.get("candidateCount") not in (None, 1):
        raise bad_request(f"generationConfig.candidateCount: {gen['candidateCount']!r}: the proxy serves one "
                          "candidate per call (a recorded call is one completion); send 1 or leave it out",
                          "generationConfig.candidateCount", "unsupported_value")
    modalities = gen.get("responseModalities")
    if modalities is not None and any(str(m).upper() != "TEXT" for m in modalities or []):
        raise bad_request(f"generationConfig.responseModalities: {modalities!r}: a chat-completions engine answers "
                          "text only; send [\"TEXT\"] or leave it out", "generationConfig.responseModalities",
                          "unsupported_value")
    return req


# ---- contents ---------------------------------------------------------------------------------------------------
def _image(part: dict, key: str, where: str, reader: _Reader) -> dict:
    data = fields(part[key], ("mimeType", "data", "fileUri", "displayName"), f"{where}.{key}")
    reader.skip(data, {"mimeType", "data", "fileUri"}, key + ".")
    mime = data.get("mimeType") or ""
    if not str(mime).lower().startswith("image/"):
        raise bad_request(f"{where}.{key}: mimeType {mime!r} is not an image; a chat-completions engine takes text "
                          "and images (image/png, image/jpeg, image/gif, image/webp)", "contents",
                          "unsupported_media_type")
    if key == "inlineData":
        if not isinstance(data.get("data"), str):
            raise bad_request(f"{where}.inlineData.data: required: the image as base64 text", "contents",
                              "invalid_image")
        url = f"data:{mime};base64,{_standard_base64(data['data'])}"
    else:
        url = data.get("fileUri")
        if not isinstance(url, str) or not url.startswith(("http://", "https://", "data:")):
            raise bad_request(f"{where}.fileData.fileUri: {url!r} is not an http(s) URL the engine can fetch (files "
                              "uploaded to Google are not resolved); send the image as inlineData", "contents",
                              "unsupported_content")
    check_image_url(url, where, "contents")
    return {"type": "image_url", "image_url": {"url": url}}


def _standard_base64(data: str) -> str:
    """Google's JSON carries bytes as base64 of either alphabet (the Python SDK sends the URL-safe one); a data URL
    takes the standard one (the store decodes it into the image blob, the engine decodes it too)."""
    if "-" in data or "_" in data:
        data = data.replace("-", "+").replace("_", "/")
    return data + "=" * (-len(data) % 4)


def _parts(content, where: str) -> list[dict]:
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        raise bad_request(f"{where}.parts: required: a non-empty list of Part objects (contents.parts must not be "
                          "empty)", "contents", "invalid_contents")
    return [fields(p, _PART, f"{where}.parts[{j}]") for j, p in enumerate(parts)]


def _unsupported(part: dict, where: str):
    kind = next((k for k in part if k not in ("thought", "thoughtSignature", "partMetadata", "mediaResolution")), None)
    raise bad_request(f"{where}: a {kind or 'empty'} part cannot go to a chat-completions engine; send text, "
                      "inlineData images, functionCall or functionResponse parts", "contents", "unsupported_content")


class _Reader:
    """What reading the contents keeps: the function calls so far (to give each ``functionResponse`` its call's id)
    and the part keys that have no chat equivalent (``notes["part_keys_not_forwarded"]``, by name: Google's
    ``thoughtSignature``, a call's ``willContinue``, ...), so that nothing is dropped without a word."""

    def __init__(self, notes: dict):
        self.open: list[tuple[str, str]] = []  # (id, name) not yet answered, oldest first
        self.notes = notes

    def skip(self, obj: dict, used: set[str], prefix: str = "") -> None:
        for key in obj.keys() - used:
            skipped = self.notes.setdefault("part_keys_not_forwarded", [])
            if prefix + key not in skipped:
                skipped.append(prefix + key)

    def call(self, call: dict, i: int, j: int) -> dict:
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{i}_{j}"
        self.open.append((call_id, call["name"]))
        return chat_tool_call(call_id, call["name"], orjson.dumps(call.get("args") or {}).decode())

    def answer(self, resp: dict, where: str) -> str:
        want = resp.get("id") if isinstance(resp.get("id"), str) and resp.get("id") else None
        for k, (call_id, name) in enumerate(self.open):
            if call_id == want or (want is None and name == resp["name"]):
                del self.open[k]
                return call_id
        if want is not None:
            return want
        raise bad_request(f"{where}: a functionResponse for {resp['name']!r} answers no earlier functionCall of that "
                          "name; send the model's functionCall before it, or give both the same id", "contents",
                          "unmatched_function_response")


def _function(part: dict, key: str, where: str, reader: _Reader) -> dict:
    known = ("id", "name", "args", "partialArgs", "willContinue") if key == "functionCall" else (
        "id", "name", "response", "parts", "willContinue", "scheduling")
    fn = fields(part[key], known, f"{where}.{key}")
    reader.skip(fn, {"id", "name", "args" if key == "functionCall" else "response"}, key + ".")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad_request(f"{where}.{key}.name: required: the function's name", "contents", "invalid_contents")
    return fn


def _user(parts: list[dict], where: str, reader: _Reader) -> list[dict]:
    out, chat = [], []
    for j, p in enumerate(parts):
        at = f"{where}.parts[{j}]"
        if "functionResponse" in p:
            if chat:
                out.append({"role": "user", "content": _content(chat)})
                chat = []
            resp = _function(p, "functionResponse", at, reader)
            out.append({"role": "tool", "tool_call_id": reader.answer(resp, at),
                        "content": orjson.dumps(resp.get("response") or {}).decode()})
            reader.skip(p, {"functionResponse"})
        elif "text" in p:
            chat.append({"type": "text", "text": p["text"] if isinstance(p["text"], str) else ""})
            reader.skip(p, {"text"})
        elif "inlineData" in p or "fileData" in p:
            key = "inlineData" if "inlineData" in p else "fileData"
            chat.append(_image(p, key, at, reader))
            reader.skip(p, {key})
        else:
            _unsupported(p, at)
    if chat:
        out.append({"role": "user", "content": _content(chat)})
    return out


def _model(parts: list[dict], where: str, reader: _Reader, i: int) -> dict:
    msg: dict = {"role": "assistant", "content": None}
    text, thinking, tool_calls = [], [], []
    for j, p in enumerate(parts):
        if "functionCall" in p:
            tool_calls.append(reader.call(_function(p, "functionCall", f"{where}.parts[{j}]", reader), i, j))
            reader.skip(p, {"functionCall"})
        elif "text" in p:
            (thinking if p.get("thought") else text).append(p["text"] if isinstance(p["text"], str) else "")
            reader.skip(p, {"text", "thought"})
        elif set(p) <= {"thought", "thoughtSignature"}:
            reader.skip(p, set())  # Google's opaque thought state: nothing a local engine reads
        else:
            _unsupported(p, f"{where}.parts[{j}]")
    if text:
        msg["content"] = "".join(text)
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    return msg


def _content(parts: list[dict]):
    return parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def system_message(instruction, reader: _Reader) -> list[dict]:
    if instruction is None:
        return []
    if isinstance(instruction, str):
        return [{"role": "system", "content": instruction}]
    inst = fields(instruction, _CONTENT, "systemInstruction")
    parts = _parts(inst, "systemInstruction")
    chat = []
    for j, p in enumerate(parts):
        if "text" not in p:
            _unsupported(p, f"systemInstruction.parts[{j}]")
        reader.skip(p, {"text"})
        chat.append({"type": "text", "text": p["text"] if isinstance(p["text"], str) else ""})
    return [{"role": "system", "content": "".join(c["text"] for c in chat)}] if chat else []


def chat_messages(req: dict, notes: dict) -> list[dict]:
    reader = _Reader(notes)
    out = system_message(req.get("systemInstruction"), reader)
    for i, content in enumerate(req["contents"]):
        where = f"contents[{i}]"
        c = fields(content, _CONTENT, where)
        role = c.get("role") or "user"
        if role not in ("user", "model", "function"):
            raise bad_request(f"{where}.role: {role!r} is not 'user' or 'model'", "contents", "invalid_role")
        parts = _parts(c, where)
        if role == "model":
            out.append(_model(parts, where, reader, i))
        else:
            out += _user(parts, where, reader)
    return out
