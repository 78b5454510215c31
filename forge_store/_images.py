"""Move inline images out of messages into the blob store, keeping a reversible reference in their place.

Harnesses send screenshots inline as base64: OpenAI ``image_url`` data URLs, Responses ``input_image`` data URLs,
Anthropic ``image`` blocks with a base64 ``source``. Stored inline, every later turn would copy every earlier
screenshot (invariant 3). ``extract_images`` replaces each payload by ``openforge-blob:sha256:<hex>`` in the same
place of the same structure, and ``restore_images`` puts the bytes back, so the prompt the harness sent can be
rebuilt exactly. Only the stored copy changes; what is forwarded upstream is never altered.
"""

from __future__ import annotations

import base64
import binascii
import copy
import re
from collections.abc import Callable

from ._errors import InvalidRecord

REF_PREFIX = "openforge-blob:sha256:"
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+/-]+)?(?P<params>(;[\w-]+=[^;,]*)*);base64,(?P<data>.*)$", re.S)


def _decode(b64: str, where: str) -> bytes:
    try:
        return base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRecord(f"{where}: image data is not valid base64 ({exc}); send the image base64-encoded") from None


def extract_images(messages: list, put: Callable[[bytes, str | None], str], first: int = 0) -> tuple[list, list[str]]:
    """Return (messages with image payloads replaced by blob references, blob hashes in order of appearance).

    ``put(data, media_type) -> sha256`` stores the bytes. The input is not modified (a copy is made only when an
    image is found). Raises InvalidRecord naming the message (``first``: the index of ``messages[0]`` in its
    prompt) for undecodable base64.
    """
    hashes: list[str] = []

    def visit(node, where: str):
        if isinstance(node, dict):
            replaced = image(node, where)
            if replaced is not None:
                return replaced
            out = None
            for k, v in node.items():
                if isinstance(v, (dict, list)):
                    nv = visit(v, where)
                    if nv is not v:
                        out = out if out is not None else dict(node)
                        out[k] = nv
            return node if out is None else out
        if isinstance(node, list):
            out = None
            for i, v in enumerate(node):
                if isinstance(v, (dict, list)):
                    nv = visit(v, where)
                    if nv is not v:
                        out = out if out is not None else list(node)
                        out[i] = nv
            return node if out is None else out
        return node

    def image(node: dict, where: str):
        kind = node.get("type")
        if kind == "image_url" and isinstance(node.get("image_url"), dict):
            new = _from_url(node["image_url"].get("url"), where)
            return None if new is None else {**node, "image_url": {**node["image_url"], "url": new}}
        if kind == "input_image" and isinstance(node.get("image_url"), str):
            new = _from_url(node["image_url"], where)
            return None if new is None else {**node, "image_url": new}
        if kind == "image" and isinstance(node.get("source"), dict) and node["source"].get("type") == "base64":
            src = node["source"]
            sha = put(_decode(src.get("data", ""), where), src.get("media_type"))
            hashes.append(sha)
            return {**node, "source": {**src, "data": REF_PREFIX + sha}}
        return None

    def _from_url(url, where: str):
        if not isinstance(url, str) or not url.startswith("data:"):
            return None
        m = _DATA_URL.match(url)
        if m is None:
            raise InvalidRecord(f"{where}: image data URL is not base64 (data:TYPE;base64,...)")
        sha = put(_decode(m["data"], where), m["type"])
        hashes.append(sha)
        return f"data:{m['type'] or ''}{m['params'] or ''};base64,{REF_PREFIX}{sha}"

    out = [visit(m, f"message {i}") for i, m in enumerate(messages, first)]
    return out, hashes


_IMAGE_PARTS = frozenset(("image_url", "input_image", "image"))


def _has_image_part(parts) -> bool:
    for part in parts if isinstance(parts, list) else ():
        if isinstance(part, dict) and (part.get("type") in _IMAGE_PARTS or _has_image_part(part.get("content"))):
            return True
    return False


def has_images(messages: list, start: int = 0) -> bool:
    """Whether messages past ``start`` carry image parts (whose blob writes should not block an event loop).

    A cheap look at content lists only, one level of nesting (tool results): text-only content lists (Claude Code
    sends every message as a list of blocks) say no at once."""
    return any(_has_image_part(m.get("content")) for m in messages[start:] if isinstance(m, dict))


def restore_images(messages: list, get: Callable[[str], bytes]) -> list:
    """Inverse of ``extract_images``: put the base64 payloads back (a deep copy; the input is not modified)."""
    messages = copy.deepcopy(messages)

    def visit(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, str) and REF_PREFIX in v:
                    head, sha = v.split(REF_PREFIX, 1)
                    node[k] = head + base64.b64encode(get(sha)).decode()
                else:
                    visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(messages)
    return messages
