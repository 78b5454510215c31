"""What must hold proxy-wide (``Fleet``): the pause that fences a weight switch, the active policy version, and the
engine replicas an operator added, drained, removed or a weight update refused.

One process: these are its own state, changed in place. Behind ``openforge proxy --workers N`` every worker holds a
copy, and the worker that receives such an admin call changes its own and then every sibling's
(``proxy._siblings``) before it answers, one change at a time across workers; the answer carries each worker's
(``workers``). A pause holds on every worker before it answers: each one holds new calls and, with ``drain``, waits
for its calls in flight; if a worker does not pause, the pause is undone (unless the proxy was paused before) and
the error names that worker. Other changes that a sibling fails are reported, naming it (they are idempotent:
retry). What stays per worker: budgets, retry detection, metrics, the engines' health.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from contextlib import asynccontextmanager

import orjson

from forge_store import Store

from ._rollouts import RolloutRegistry
from ._siblings import Answer, SiblingError, Siblings, failures, named
from ._upstream import UpstreamPool

MARGIN_S = 10.0  # a sibling's drain may take its whole timeout; its answer gets this much longer
READ_S = 5.0  # how long a read (status, upstreams) waits for each sibling's view
SYNC = "/admin/fleet/sync"  # a sibling's activation or engine replica marks (``proxy._policy_routes``)


class Fleet:
    def __init__(self, store: Store, rollouts: RolloutRegistry, pool: UpstreamPool, siblings: Siblings | None = None):
        self.store, self.rollouts, self.pool, self.siblings = store, rollouts, pool, siblings

    @property
    def replica_id(self) -> str | None:
        return self.siblings.replica_id if self.siblings is not None else None

    def state(self) -> dict:
        """The state a worker that starts now must take (``restore``)."""
        return {"paused": self.rollouts.paused, "policy_version": self.rollouts.policy_version,
                "upstreams": self.pool.marks()}

    def restore(self, state: dict) -> None:
        """Take ``state`` (another worker's ``state()``) before serving."""
        if state["paused"]:
            self.rollouts.pause()
        self.apply(state)

    def apply(self, changes: dict) -> dict:
        """A sibling's ``policy_version`` and engine replica marks (``upstreams``), where given."""
        if "policy_version" in changes:
            self.rollouts.policy_version = changes["policy_version"]
        if "upstreams" in changes:
            self.pool.apply_marks(changes["upstreams"])
        return {"policy_version": self.rollouts.policy_version, "upstreams": self.pool.marks()}

    def forwarded(self, request) -> bool:
        """A call a sibling forwarded here: it changes this process only."""
        return self.siblings is not None and self.siblings.forwarded(request)

    def _alone(self, forwarded: bool) -> bool:
        return forwarded or self.siblings is None

    @asynccontextmanager
    async def change(self, request):
        """Around a proxy-wide change a client asked for: one at a time across the workers."""
        if self._alone(self.forwarded(request)):
            yield
            return
        async with self.siblings.exclusive():
            yield

    async def _send(self, method: str, path: str, body: dict | None = None, timeout_s: float | None = None,
                    raw: bytes | None = None) -> dict[str, Answer]:
        """To every sibling, after writing the state a worker starting meanwhile takes."""
        self.siblings.write_state(self.state())
        content = raw if raw is not None else (orjson.dumps(body) if body is not None else None)
        return await self.siblings.send(method, path, content, timeout_s=timeout_s)

    def _merged(self, mine: dict, answers: dict[str, Answer]) -> dict:
        return {self.replica_id: mine, **{rid: a.body for rid, a in sorted(answers.items())}}

    # ---- pause / resume -------------------------------------------------------------------------------------
    async def pause(self, drain: bool, timeout_s: float, *, forwarded: bool = False) -> dict:
        """Hold new calls everywhere and, with ``drain``, wait until none is in flight anywhere (``drained``: every
        worker drained within ``timeout_s``). SiblingError if a worker did not pause (undone, unless paused before)."""
        if self._alone(forwarded):
            return await self._pause_here(drain, timeout_s)
        before, at_pause = self.rollouts.paused, self.rollouts.in_flight
        self.rollouts.pause()  # this worker holds new calls from now on, its siblings as soon as they are told
        here = asyncio.ensure_future(self._pause_here(drain, timeout_s))
        answers = await self._send("POST", "/admin/pause", {"drain": drain, "timeout_s": timeout_s},
                                   timeout_s + MARGIN_S)
        mine = await here
        mine["was_paused"], mine["in_flight_at_pause"] = before, at_pause
        if failed := failures(answers):
            undo = "the proxy was paused before this call and stays paused"
            if not before:
                resumed = await self._resume_all()
                left = failures(resumed)
                back = ", ".join(sorted({self.replica_id, *resumed} - set(left)))
                undo = f"the pause is undone: worker(s) {back} resumed" + (
                    f"; the resume failed on {named(left)}: resume again once it answers" if left else "")
            raise SiblingError(f"the pause did not hold on every worker ({named(failed)}); {undo}. Retry the pause "
                               "(a worker being restarted comes up paused by itself)", failed)
        workers = self._merged(mine, answers)
        every = workers.values()
        return {"paused": True, "was_paused": any(w["was_paused"] for w in every),
                "drained": all(w["drained"] for w in every) if drain else None,
                "in_flight": sum(w["in_flight"] for w in every),
                "in_flight_at_pause": sum(w["in_flight_at_pause"] for w in every),
                "policy_version": self.rollouts.policy_version, "workers": workers}

    async def _pause_here(self, drain: bool, timeout_s: float) -> dict:
        rollouts = self.rollouts
        was_paused = rollouts.paused  # read and set in one loop step: of two pausers, one sees the other's pause
        rollouts.pause()
        at_pause = rollouts.in_flight
        drained = await rollouts.drain(timeout_s) if drain else None
        return {"paused": True, "was_paused": was_paused, "drained": drained, "in_flight": rollouts.in_flight,
                "in_flight_at_pause": at_pause, "policy_version": rollouts.policy_version}

    async def resume(self, *, forwarded: bool = False) -> dict:
        """Let held and new calls through everywhere. SiblingError naming a worker that did not resume."""
        was_paused = self.rollouts.paused
        self.rollouts.resume()
        mine = {"paused": False, "was_paused": was_paused, "policy_version": self.rollouts.policy_version}
        if self._alone(forwarded):
            return mine
        answers = await self._resume_all()
        if failed := failures(answers):
            raise SiblingError(f"resumed here (worker {self.replica_id}) but not on {named(failed)}: those still "
                               "hold their calls; resume again", failed)
        workers = self._merged(mine, answers)
        return {**mine, "was_paused": any(w["was_paused"] for w in workers.values()), "workers": workers}

    async def _resume_all(self) -> dict[str, Answer]:
        self.rollouts.resume()
        return await self._send("POST", "/admin/resume")

    # ---- policy version, engine replicas ----------------------------------------------------------------------
    async def activate(self, version: str, *, forwarded: bool = False) -> str | None:
        """Calls admitted from now on, on every worker, are recorded under ``version`` (those in flight keep the
        one they entered with: ``RolloutRegistry.enter``). Returns the version it replaces. The event is recorded
        once, by the worker that received the call."""
        if version not in self.rollouts.models.by_version:   # its model name, for pinning (never fails the switch)
            await asyncio.to_thread(self.rollouts.models.lookup, version)
        previous, self.rollouts.policy_version = self.rollouts.policy_version, version
        if forwarded:
            return previous
        await asyncio.to_thread(self.store.add_event, "policy_version.activated", source="proxy",
                                detail={"policy_version": version, "previous": previous})
        if self.siblings is not None:
            self._check(await self._send("POST", SYNC, {"policy_version": version}), f"activated {version!r}")
        return previous

    async def share_upstreams(self) -> None:
        """Every sibling drains and refuses the engine replicas this worker does (after a weight update's hook)."""
        if self.siblings is not None:
            answers = await self._send("POST", SYNC, {"upstreams": self.pool.marks()})
            self._check(answers, "refused the engine replicas that missed the weight update")

    async def forward(self, request, mine: dict | Awaitable[dict], timeout_s: float | None = None) -> dict:
        """After this worker applied ``request`` (its answer ``mine``, or what it still waits for, awaited meanwhile):
        the same request to every sibling; the answer is this worker's with ``workers``, each worker's.
        SiblingError naming those that failed."""
        if self._alone(self.forwarded(request)):
            return mine if isinstance(mine, dict) else await mine
        sent = self._send(request.method, request.url.path, timeout_s=timeout_s, raw=await request.body())
        if isinstance(mine, dict):
            answers = await sent
        else:
            mine, answers = await asyncio.gather(mine, sent)
        self._check(answers, f"{request.method} {request.url.path} done")
        return {**mine, "workers": self._merged(mine, answers)}

    async def views(self, request, mine: dict) -> dict:
        """A read: ``mine`` with ``workers``, what each worker answers (an ``error`` for one that did not)."""
        if self._alone(self.forwarded(request)):
            return mine
        answers = await self.siblings.send(request.method, request.url.path, timeout_s=READ_S)
        failed = failures(answers)
        workers = {rid: {"error": failed[rid]} if rid in failed else a.body for rid, a in sorted(answers.items())}
        return {**mine, "workers": {self.replica_id: mine, **workers}}

    def _check(self, answers: dict[str, Answer], done: str) -> None:
        if failed := failures(answers):
            ok = sorted({self.replica_id, *answers} - set(failed))
            raise SiblingError(f"{done} on worker(s) {', '.join(ok)} but not on {named(failed)}; the call is "
                               "idempotent: retry it (a worker that restarts takes the new state by itself)", failed)
