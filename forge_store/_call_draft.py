"""``CallDraft``: one model call recorded as one unit of work (``Store.begin_call`` makes it).

A caller that forwards a call (the proxy) has time while the upstream works; the draft lets it spend that time on
the request side and leaves only the answer's side for the end::

    draft = store.begin_call(rollout_id, messages, tools, redact=rules)  # compare with the rollout's last prompt
    rec = draft.start(id=..., api_surface=..., started_at=..., ...)   # stored copies, hashes, bodies journaled
    ... the upstream answers; the caller fills rec's answer side ...
    await draft.finish()                                              # durable when this returns

What the draft owns: the prompt's stored copies (images moved to the blob store, then ``redact`` applied to each
new message and to the tool schemas), the record (``draft.record``), its delta base and request hash (the
encoder's ``PromptPart``, which callers never see) and the rollback: a journal write that fails may have taken the
only copy of a delta base or a body, so the encoder forgets what the journal holds (``CallEncoder.reset``) and the
next call is stored whole. ``redact`` is a value's stored form, ``(value, rules that fired: added to) -> value``;
the store calls nothing else of its caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ._records import CallRecord

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._write.call_encoder import CallEncoder, PromptPart
    from ._write.journaling_writer import JournalingWriter
    from ._write.prompt_cache import PendingPrompt


class CallDraft:
    """One call on its way into the store; see the module docstring. Not shared between tasks."""

    __slots__ = ("_encoder", "_writer", "_write", "_prompt", "_part", "record")

    def __init__(self, encoder: CallEncoder, writer: JournalingWriter | None, write: Callable[[dict], None],
                 prompt: PendingPrompt | None, record: CallRecord | None = None):
        self._encoder, self._writer, self._write, self._prompt = encoder, writer, write, prompt
        self._part: PromptPart | None = None
        self.record = record

    # ---- the request side, while the upstream works ------------------------------------------------------------
    @property
    def holds_images(self) -> bool:
        """``prepare`` writes blobs (the new messages carry inline images): a caller on an event loop runs it in a
        thread."""
        return self._prompt is not None and self._prompt.holds_images

    @property
    def first_new(self) -> int:
        """How many leading messages were the rollout's previous prompt's (their copies and hashes are reused)."""
        return self._prompt.first_new if self._prompt is not None else 0

    @property
    def marks(self) -> set[str]:
        """What ``redact`` reported for the prompt's messages and tool schemas (after ``prepare``)."""
        self.prepare()
        return self._prompt.marks

    def prepare(self) -> None:
        """The stored copies of the new messages and of the tool schemas, and their hashes (once; ``start`` does it
        if the caller did not). ``InvalidRecord`` for an inline image that is not base64, before anything changed."""
        if self._prompt is not None:
            self._prompt.prepare()

    def start(self, **fields) -> CallRecord:
        """The call's record, request side: ``fields`` are ``CallRecord``'s besides ``rollout_id``, ``messages``,
        ``tools`` and ``image_hashes``, which are the draft's. Encodes the prompt (hashes, the delta against the
        rollout's last recorded call, the request hash: ``request_hash``) and, with a journal, journals the message
        and tool bodies new to it, ahead of the call. ``InvalidRecord`` / the journal's error if it cannot."""
        if self.record is not None:
            raise RuntimeError(f"call draft for {self.record.id!r} started twice; a retry is draft.retry()")
        p = self._prompt
        p.prepare()
        self.record = CallRecord(rollout_id=p.rollout_id, messages=p.messages, tools=p.tools,
                                 image_hashes=p.image_hashes or None, **fields)
        part = self._part = self._encoder.encode_prompt(self.record, p)
        writer = self._writer
        if writer is not None and (op := self._encoder.ahead(part)) is not None:
            with self._rollback():
                if writer.journal.fsync:  # queued: the call's own record comes later and waiting for it covers them
                    writer.submit(op)
                else:
                    writer.journal_now(op)
            self._encoder.journaled(part)
        return self.record

    @property
    def request_hash(self) -> str:
        """The call's canonical request hash (after ``start``)."""
        return self._part.request_hash

    def retry(self) -> CallDraft:
        """A new call with this one's prompt (already prepared): the same request sent again, recorded as its own
        call."""
        return CallDraft(self._encoder, self._writer, self._write, self._prompt)

    # ---- the answer side -----------------------------------------------------------------------------------------
    async def finish(self) -> str:
        """Record ``record`` as it is now (answer or error filled in by the caller); returns once it is durable,
        without blocking the loop. Finishing the same call id again stores nothing more."""
        op = self._op()
        if op is not None:
            with self._rollback():
                writer = self._writer
                if writer is None:
                    await asyncio.to_thread(self._write, op)
                elif not writer.journal.fsync:  # journaled in this thread: no hop through the loop's self-pipe
                    writer.journal_now(op)
                else:
                    await asyncio.wrap_future(writer.submit(op))
        return self.record.id

    def finish_now(self) -> str:
        """``finish`` for a caller that may block (``Store.record_call``)."""
        op = self._op()
        if op is not None:
            with self._rollback():
                self._write(op)
        return self.record.id

    def _op(self) -> dict | None:
        if self.record is None:
            raise RuntimeError("a call draft is finished after start(): start() makes its record")
        return self._encoder.encode(self.record, self._part)

    @contextmanager
    def _rollback(self) -> Iterator[None]:
        """A failed journal write: the encoder forgets what it thought the journal holds (see the module docstring)."""
        try:
            yield
        except BaseException:
            self._encoder.reset()
            raise
