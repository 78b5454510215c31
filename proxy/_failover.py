"""``Failover``: where one call goes, and where it goes again after a connection failure.

With several engine replicas (``proxy._upstream.pool``) a call goes to the one its rollout is bound to (among those
that serve the call's model, where replicas serve different ones). A connection
failure before any byte of the answer reached the client (the request could not be sent, the answer's head never
came, or a whole answer broke off before the proxy had it) is recorded as a failed call by the attempt; the call is
then sent again to a replica it has not tried (that serves its model), as a new call that is a retry of the failed one. Once bytes of a
stream reached the client, a break is that stream's failure event, not an ``UpstreamFailure``: no failover.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from ._errors import UpstreamFailure
from ._upstream import Replica, UpstreamPool

T = TypeVar("T")

# (replica, what it retries: (failed call's id, its replica's URL), or None for the first attempt) -> the answer
Attempt = Callable[[Replica, "tuple[str, str] | None"], Awaitable[T]]


class Failover:
    """One call's replicas: ``run(attempt)`` tries ``pool.pick(rollout_id)``, then each replica ``pool.failed``
    offers after a connection failure, until one answers or none is left (the last failure is raised)."""

    __slots__ = ("pool", "rollout_id", "model", "chosen", "tried")

    def __init__(self, pool: UpstreamPool, rollout_id: str | None, model: str | None = None, chosen: bool = False):
        """``model``: the one the call is sent for; ``chosen``: the proxy chose it (``ServedModels.choose``)."""
        self.pool, self.rollout_id, self.model, self.chosen = pool, rollout_id, model, chosen
        self.tried: tuple[Replica, ...] = ()

    async def run(self, attempt: Attempt) -> T:
        """``attempt`` records its own failure and names the failed call in ``UpstreamFailure.call_id`` (what the
        next attempt retries)."""
        rep, retry = self.pool.pick(self.rollout_id, self.model, self.chosen), None
        while True:
            try:
                return await attempt(rep, retry)
            except UpstreamFailure as exc:
                self.tried = (*self.tried, rep)
                nxt = self.pool.failed(rep, exc, self.rollout_id, self.tried, self.model, self.chosen)
                if nxt is None:
                    raise
                retry, rep = (exc.call_id, rep.url), nxt
