"""Call ids (``call_ids.next()``): 32 hex digits like ``uuid4().hex``."""

from __future__ import annotations

import itertools
import os


class CallIds:
    """Call ids: 32 hex digits like ``uuid4().hex``, from a random 64-bit prefix per process and a counter: one
    ``getrandom`` per process (and per fork) instead of a system call and a ``UUID`` object per call."""

    def __init__(self):
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix, self._count = os.urandom(8).hex(), itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._count):016x}"


call_ids = CallIds()  # the process's one source of call ids
