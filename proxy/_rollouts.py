"""Which rollouts may call, under which policy version, and whether calls may start now.

Rollouts are registered by the orchestrator through the admin API and get a signed token. A token works while
its rollout is open: ending the rollout (or the store saying it finished) closes it. Registrations and ends go
into the proxy's rollout ledger (``_rollout_ledger``) before the admin API answers, so after a restart the registry
knows its rollouts without the database: a live rollout's token is served and an ended one's refused while the
database is down. A rollout the ledger does not know (registered by another proxy sharing the secret) is looked
up in the store; while the store cannot answer, that call is a 503 (retry), never a guess.

Proxy replicas (``openforge proxy --workers N``, or a Deployment's pods) share the token secret and the store, so
any replica serves any rollout: one that does not know a rollout asks the store, and with ``register_wait_s`` it
asks again for that long while the store has not seen it yet (the replica that registered it journaled it before
answering the admin API, but its batch reaches the database a moment later, and a killed replica's only when its
successor drains its journal). An end is the store's too (a ``rollout.token_ended`` event, journaled), and each
replica asks the store every ``sync_s`` which of the rollouts it serves have ended (or finished), so a token ended
through one replica stops working on all within about ``sync_s`` plus the journal's batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from forge_store import NotFound, Store, StoreError, StoreUnavailable

from ._auth import TokenSigner
from ._budgets import Budget, Limits
from ._errors import ProxyError, unauthorized
from ._models import ServedModels
from ._rollout_ledger import RolloutLedger
from ._store_wait import until_found

log = logging.getLogger("proxy")
ENDED_EVENT = "rollout.token_ended"  # an end, in the store for the other replicas (``RolloutRegistry.sync_s``)


@dataclass
class Binding:
    """One rollout as the proxy serves it: the order of its calls and which requests it made before."""

    rollout_id: str | None
    first_call_by_request: OrderedDict = field(default_factory=OrderedDict)
    last_seq: int = 0
    ended: bool = False
    budget: Budget | None = None  # what it may still spend (``proxy._budgets``); None: no limit

    def next_seq(self) -> int:
        """Calls are ordered by start time; strictly increasing even if the clock steps back."""
        self.last_seq = max(self.last_seq + 1, time.time_ns())
        return self.last_seq

    def retry_of(self, request_hash: str, call_id: str) -> str | None:
        """The first call with this exact request (``request_hash``: the store's) in the rollout, if this one repeats
        it."""
        first = self.first_call_by_request.get(request_hash)
        if first is None:
            self.first_call_by_request[request_hash] = call_id
            if len(self.first_call_by_request) > 4096:
                self.first_call_by_request.popitem(last=False)
        return first


class RolloutRegistry:
    def __init__(self, store: Store, signer: TokenSigner, *, allow_unbound: bool = False, pause_max_s: float = 300,
                 ledger: RolloutLedger | None = None, lookup_timeout_s: float = 5.0, register_wait_s: float = 0.0,
                 sync_s: float | None = None, on_close: Callable[[str], None] | None = None):
        """``register_wait_s``, ``sync_s``: for replicas (see the module docstring); None: no other replica.
        ``on_close``: told the id of every rollout that closes, however it ended (the engine pool unbinds it)."""
        self.store, self.signer, self.allow_unbound, self.pause_max_s = store, signer, allow_unbound, pause_max_s
        self.ledger, self.lookup_timeout_s, self.register_wait_s = ledger, lookup_timeout_s, register_wait_s
        self.sync_s, self.on_close = sync_s, on_close
        self._watcher: asyncio.Task | None = None
        self._open: dict[str, Binding] = {}
        self._ended: set[str] = set(ledger.ended) if ledger is not None else set()
        self._unbound = Binding(None)
        self.policy_version: str | None = None
        self.models = ServedModels()  # which model answers a call, recorded under which version (proxy._models)
        self.default_limits = Limits()  # a rollout's budget where its registration gives none (settings)
        self._running = asyncio.Event()
        self._running.set()
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # ---- rollouts -----------------------------------------------------------------------------------------
    def register(self, rollout_id: str, ttl_s: float | None = None) -> tuple[Binding, str]:
        if rollout_id in self._ended:
            raise ProxyError(409, f"rollout {rollout_id!r} has ended; register a new rollout id for a new attempt",
                             code="rollout_ended")
        binding = self._open.setdefault(rollout_id, Binding(rollout_id))
        if self.ledger is not None:
            self.ledger.start(rollout_id)
        return binding, self.signer.issue(rollout_id, ttl_s)

    def end(self, rollout_id: str) -> bool:
        """Close the rollout (its token stops working, across restarts: the ledger has it when this returns); the
        store forgets its last prompt (memory). True if open."""
        if self.sync_s is not None:  # the other replicas learn it from the store
            self.store.add_event(ENDED_EVENT, source="proxy", rollout_id=rollout_id)
        return self._close(rollout_id)

    def _close(self, rollout_id: str) -> bool:
        if self.ledger is not None:
            self.ledger.end(rollout_id)
        self._ended.add(rollout_id)
        self.store.forget_rollout(rollout_id)
        if self.on_close is not None:
            self.on_close(rollout_id)
        return self._open.pop(rollout_id, None) is not None

    async def start(self) -> None:
        """With other replicas (``sync_s``): start asking the store which rollouts they ended (the app's startup)."""
        if self.sync_s is not None and self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def _watch(self) -> None:
        """Every ``sync_s``: close the rollouts served here that another replica ended (or that finished)."""
        while True:
            await asyncio.sleep(self.sync_s)
            if not self._open:
                continue
            try:
                ended = await asyncio.to_thread(self.store.ended_rollouts, list(self._open), ENDED_EVENT)
            except StoreError as exc:  # the database is away: ends through here still hold
                log.warning("cannot ask the store which rollouts other replicas ended (%s); asking again in %.0fs",
                            exc.__class__.__name__, self.sync_s)
                continue
            for rollout_id in ended:
                self._close(rollout_id)

    async def authorize(self, token: str | None) -> Binding:
        if not token:
            if self.allow_unbound:
                return self._unbound
            raise unauthorized("no API key: pass the rollout token as the API key (Authorization: Bearer or "
                               "x-api-key) or in the path /r/{token}/v1/...")
        rollout_id = self.signer.verify(token)
        if rollout_id in self._ended:
            raise unauthorized(f"rollout {rollout_id!r} has ended; its token no longer works")
        binding = self._open.get(rollout_id)
        if binding is None:
            binding = await self._recover(rollout_id)
        return binding

    async def _recover(self, rollout_id: str) -> Binding:
        """A valid token for a rollout this process does not know: it was registered before a restart. The ledger
        says it is live (ended ones were refused before this), or else the store is asked."""
        if self.ledger is not None and rollout_id in self.ledger.started:
            return self._open.setdefault(rollout_id, Binding(rollout_id))
        info = await self._look_up(rollout_id)
        if info.status == "finished" or (self.sync_s is not None and await self._ended_elsewhere(rollout_id)):
            self._ended.add(rollout_id)
            raise unauthorized(f"rollout {rollout_id!r} has ended; its token no longer works")
        if self.ledger is not None:
            self.ledger.start(rollout_id)
        return self._open.setdefault(rollout_id, Binding(rollout_id))

    async def _ended_elsewhere(self, rollout_id: str) -> bool:
        try:
            ended = await asyncio.wait_for(asyncio.to_thread(self.store.ended_rollouts, [rollout_id], ENDED_EVENT),
                                           self.lookup_timeout_s)
        except (StoreUnavailable, asyncio.TimeoutError):
            raise ProxyError(503, f"rollout {rollout_id!r}: the store cannot be asked now whether another replica "
                                  "ended it (database unreachable); retry later", type="server_error",
                             code="store_unavailable") from None
        return rollout_id in ended

    async def _look_up(self, rollout_id: str):
        """The store's row for ``rollout_id``, asked again for up to ``register_wait_s`` while it is not there."""
        try:
            return await until_found(self.store.rollout, rollout_id, wait_s=self.register_wait_s,
                                     timeout_s=self.lookup_timeout_s)
        except NotFound:
            shared = (f" nor, within {self.register_wait_s:.0f}s, in the store its replicas share"
                      if self.register_wait_s else "")
            raise unauthorized(f"rollout {rollout_id!r} is not registered with this proxy{shared}") from None
        except (StoreUnavailable, asyncio.TimeoutError):  # refused or stalled: the store cannot say now
            raise ProxyError(503, f"rollout {rollout_id!r} is not in this proxy's ledger and the store cannot be "
                                  "asked about it now (database unreachable); retry later", type="server_error",
                             code="store_unavailable") from None

    # ---- budgets (``proxy._budgets``) ------------------------------------------------------------------------
    def limit(self, binding: Binding, limits: Limits) -> None:
        """``limits``, over ``default_limits``, become the rollout's budget, its clock starting now. A repeated
        registration of an open rollout changes its limits but keeps what it has spent and when it started."""
        limits = limits.over(self.default_limits)
        if binding.budget is not None:
            binding.budget.limits = limits
        elif limits:
            binding.budget = Budget(limits)

    def charge(self, rollout_id: str | None, usage: dict | None) -> None:
        """A recorded call's usage, counted against its rollout's budget (if it has one and is open here)."""
        binding = self._open.get(rollout_id) if rollout_id is not None else None
        if binding is not None and binding.budget is not None:
            binding.budget.charge(usage)

    # ---- pause / drain ------------------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    async def drain(self, timeout_s: float) -> bool:
        """Wait until no call is in flight (new calls wait while paused). False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    async def enter(self) -> str | None:
        """Admit one call: wait while paused (weights are changing), then count it in flight. Returns the policy
        version current at admission, the one the call is recorded under: a switch drains every admitted call
        before the engine loads, so that version is the one that answers it.

        The wait loops: a call woken by a resume that a new pause followed before it ran (resume and pause in one
        loop step) waits again, instead of slipping past the pause after the drain saw no call in flight."""
        deadline = None
        while not self._running.is_set():
            loop = asyncio.get_running_loop()
            deadline = deadline or loop.time() + self.pause_max_s
            try:
                await asyncio.wait_for(self._running.wait(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise ProxyError(503, f"the proxy has been paused for over {self.pause_max_s:.0f}s (a weight update?); "
                                      "retry later", type="server_error", code="paused") from None
        self.in_flight += 1
        self._idle.clear()
        return self.policy_version

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()
