"""Which leading messages of a call's prompt equal its rollout's previous prompt, and the stored copies of the rest.

An agent resends its whole history every turn. Per rollout, ``PromptCache`` keeps the previous prompt as the
caller sent it and, per message, its stored copy (images moved to the blob store, then the caller's ``prepare``
hook: the proxy's redaction), the sha256 of the copy's canonical JSON, the blobs and the marks ``prepare``
reported; also the hash of the tool schemas and of the system prompt. The tool schemas' stored copy (``prepare``
applied to the whole list) is kept once for every rollout: a harness sends the same schemas with every call of every
rollout (Claude Code's are ~74 KB), so a call whose schemas equal the last ones costs a compare. A new prompt is compared with the previous
one message by message (Python ==, a C-speed deep compare); only the messages past the shared prefix are prepared,
serialised and hashed, so a call costs O(new messages). Values Python calls equal but JSON spells differently (1,
1.0, true) inside an otherwise identical earlier message keep the earlier spelling: harmless for chat content.

A prompt takes two steps. ``PromptCache.begin`` compares (cheap: a caller on an event loop does it there) and says
whether the new messages hold images, whose blob writes such a caller makes in a thread; ``PendingPrompt.prepare``
makes the copies and hashes and leaves them for the next call. Concurrent calls of one rollout (sub-agents) stay
correct: an entry is an immutable snapshot, replaced whole by each ``prepare``, and a prompt reuses the snapshot it
was compared with, whatever replaced it meanwhile. Copies made another way (another ``prepare`` hook, or none) are
not reused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._hashing import canonical_json, json_sha256, sha256_hex
from .._images import extract_images, has_images

Prepare = Callable[[Any, set], Any]  # (a message or the tool list, marks to add to) -> its stored form
PutBlob = Callable[[bytes, "str | None"], str]
_NO_IMAGES: tuple[str, ...] = ()
_NO_MARKS: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """One rollout's last prepared prompt; never changed once made."""

    mode: tuple  # (the blob writer, or None: images stay inline; the prepare hook, or None)
    raw: list  # the messages as the caller sent them
    stored: list  # their stored copies
    hashes: list[str]  # sha256 of each copy's canonical JSON
    images: list[tuple[str, ...]]  # blob hashes per message
    marks: list[frozenset[str]]  # what ``prepare`` reported per message
    system: tuple[int, str] | None  # (index, content hash) of the first system or developer message
    tools: list | None
    tools_hash: str | None


class PendingPrompt:
    """A call's prompt on its way into the store. ``holds_images``: the messages past the shared prefix carry images
    (``prepare`` writes blobs). After ``prepare()``: ``messages`` and ``tools`` (the stored copies), ``hashes``,
    ``image_hashes``, ``marks`` (of the messages and the tools), ``system_hash``, ``tools_hash``; ``body(i)`` is
    message ``i``'s canonical JSON."""

    __slots__ = ("rollout_id", "raw", "tools", "holds_images", "messages", "hashes", "image_hashes", "marks",
                 "system_hash", "tools_hash", "_cache", "_mode", "_base", "_same", "_bodies")

    def __init__(self, cache: PromptCache, rollout_id: str | None, raw: list, tools: list | None, mode: tuple,
                 base: _Snapshot | None, same: int):
        self.rollout_id, self.raw, self.tools = rollout_id, raw, tools
        self._cache, self._mode, self._base, self._same = cache, mode, base, same
        self.holds_images = mode[0] is not None and has_images(raw, same)
        self.messages: list | None = None
        self._bodies: list[str] = []

    @property
    def first_new(self) -> int:
        """How many leading messages were the previous prompt's (their copies and hashes were reused)."""
        return self._same

    def body(self, i: int) -> str:
        """Message ``i``'s stored copy as canonical JSON (made again for a reused one: needed only when a body the
        journal was thought to hold is not there)."""
        if i >= self._same:
            return self._bodies[i - self._same]
        return canonical_json(self.messages[i]).decode()

    def prepare(self) -> None:
        """Make the stored copies of the new messages and their hashes (once; later calls do nothing). Raises
        ``InvalidRecord`` for an image that is not base64, ``ValueError`` for a message with no JSON form."""
        if self.messages is not None:
            return
        base, same, raw = self._base, self._same, self.raw
        reuse = base is not None and same > 0
        stored = base.stored[:same] if reuse else []
        hashes = base.hashes[:same] if reuse else []
        images = base.images[:same] if reuse else []
        marks = base.marks[:same] if reuse else []
        put, hook = self._mode
        for i in range(same, len(raw)):
            copy, found, hit = raw[i], _NO_IMAGES, _NO_MARKS
            if put is not None:
                (copy,), blobs = extract_images([copy], put, i)
                found = tuple(blobs) if blobs else _NO_IMAGES
            if hook is not None:
                reported: set[str] = set()
                copy = hook(copy, reported)
                hit = frozenset(reported) if reported else _NO_MARKS
            body = canonical_json(copy)
            stored.append(copy)
            hashes.append(sha256_hex(body))
            images.append(found)
            marks.append(hit)
            self._bodies.append(body.decode())
        tool_marks = _NO_MARKS
        if hook is not None and self.tools:
            self.tools, tool_marks = self._cache.stored_tools(self.tools, hook)
        system = self._system(stored)
        tools_hash = self._tools_hash()
        self.messages, self.hashes, self.system_hash, self.tools_hash = stored, hashes, system and system[1], tools_hash
        self.image_hashes = [h for per in images if per for h in per]
        self.marks = set().union(tool_marks, *(m for m in marks if m))
        self._cache.put(self.rollout_id, _Snapshot(self._mode, list(raw), stored, hashes, images, marks, system,
                                                   self.tools, tools_hash))

    def _system(self, stored: list) -> tuple[int, str] | None:
        base, same = self._base, self._same
        if base is not None and base.system is not None and base.system[0] < same:
            return base.system  # the system prompt is in the shared prefix (none before it either)
        for i in range(same, len(stored)):  # [0, same) has none: it is the previous prompt's, which had none there
            if stored[i].get("role") in ("system", "developer"):
                return i, json_sha256(stored[i].get("content"))
        return None

    def _tools_hash(self) -> str | None:
        tools, base = self.tools, self._base
        if not tools:
            return None
        if base is not None and base.tools_hash is not None and (tools is base.tools or tools == base.tools):
            return base.tools_hash
        return sha256_hex(canonical_json(tools))


class PromptCache:
    """Per rollout, the last prepared prompt (see the module docstring); the least recently used are forgotten,
    which only costs a full preparation."""

    def __init__(self, max_rollouts: int = 4096):
        self._lock = threading.Lock()
        self._entries: OrderedDict[str | None, _Snapshot] = OrderedDict()
        self.max_rollouts = max_rollouts
        self._tools: tuple[Prepare, list, list, frozenset[str]] | None = None  # (hook, as sent, as stored, marks)

    def begin(self, rollout_id: str | None, messages: list, tools: list | None = None, *,
              put_blob: PutBlob | None = None, prepare: Prepare | None = None) -> PendingPrompt:
        """``messages`` compared with the rollout's previous prompt. ``put_blob``: move inline images to the blob
        store (else they stay inline); ``prepare``: applied to each new message's copy after that, reporting marks
        (the proxy's redaction, naming the rules that fired)."""
        mode = (put_blob, prepare)
        with self._lock:
            base = self._entries.get(rollout_id)
        same = 0
        if base is not None and base.mode == mode:
            for old, new in zip(base.raw, messages):
                if old != new:
                    break
                same += 1
        return PendingPrompt(self, rollout_id, messages, tools, mode, base, same)

    def stored_tools(self, tools: list, hook: Prepare) -> tuple[list, frozenset[str]]:
        """The tool schemas as stored (``hook`` applied to the list) and the marks it reported; the last ones are
        kept, so schemas equal to them cost a compare."""
        last = self._tools
        if last is not None and last[0] == hook and (tools is last[1] or tools == last[1]):
            return last[2], last[3]
        found: set[str] = set()
        stored = hook(tools, found)
        marks = frozenset(found) if found else _NO_MARKS
        self._tools = (hook, tools, stored, marks)
        return stored, marks

    def put(self, rollout_id: str | None, snapshot: _Snapshot) -> None:
        with self._lock:
            self._entries[rollout_id] = snapshot
            self._entries.move_to_end(rollout_id)
            while len(self._entries) > self.max_rollouts:
                self._entries.popitem(last=False)

    def forget(self, rollout_id: str) -> None:
        with self._lock:
            self._entries.pop(rollout_id, None)
