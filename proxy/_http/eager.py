"""Starting a coroutine eagerly: at once, in the caller's step, up to its first real wait (what Python 3.12's eager
task factory does, for 3.11). A model call starts so: the upstream gets it one event-loop turn earlier."""

from __future__ import annotations

import asyncio


def start_eagerly(loop: asyncio.AbstractEventLoop, coro) -> asyncio.Task | None:
    """Run ``coro`` at once, in the caller's step, up to its first real wait; the rest runs as a task (None if it
    finished without waiting). What Python 3.12's eager task factory does, for 3.11.

    A model call is parsed, translated and written to the upstream before this returns: the upstream starts on it
    one event-loop turn earlier than through ``create_task`` (whose first step waits for the loop's next turn, ~50
    us at one client on the 2-core bench machine, every microsecond of it on the call's critical path). Until its
    first wait the coroutine runs without a current task: only model calls start so (the proxy's own code asks for
    none before a call's first wait); the FastAPI routes, whose libraries may ask, start as tasks."""
    try:
        first = coro.send(None)
    except StopIteration:
        return None
    return loop.create_task(_resume(coro, first))


async def _resume(coro, first):
    return await Continue(coro, first)


class Continue:
    """Awaiting it continues a coroutine that was started by hand and whose first step yielded ``first``: what
    ``yield from`` does for one that has not started (values sent and exceptions thrown in, cancellation among
    them, go through to it)."""

    __slots__ = ("coro", "first")

    def __init__(self, coro, first):
        self.coro, self.first = coro, first

    def __await__(self):
        coro, out = self.coro, self.first
        while True:
            try:
                sent = yield out
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    out = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    out = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
