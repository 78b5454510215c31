"""Engine replicas behind one proxy (``UpstreamPool``): which one answers a call, and which ones may answer at all.

Routing: a call of a rollout goes to the replica its rollout is bound to while that replica is up (its prefix cache
holds the rollout's growing prompt); a rollout's first call, an unbound call, or a call whose replica went down or
is draining goes to the up replica with the least load, and binds the rollout there. Load is outstanding requests
plus bound rollouts: a bound rollout between two calls (its harness running a tool) is a request about to come, so
a replica whose rollouts are all between calls is not mistaken for an idle one; a slow replica, whose requests stay
outstanding longer, gets fewer new rollouts. With one replica none of this runs: ``pick`` returns it (the hot path of a single
engine is what it was before replicas existed), and a single replica is tried even when marked down.

Health: a replica is marked down on a connection failure (``failed``) and by a periodic check (``GET /v1/models``,
what every OpenAI-compatible server answers); a check that succeeds brings it back. A replica is ``draining`` once an
operator says so (no new calls; calls in flight finish) and ``refused`` when its engine or models do not match the
others' (see ``probe``); neither ever gets a call.

One dialect per proxy: the proxy asks the engine for token ids in one dialect (``--dialect``), so every replica must
be that engine (vLLM's ``return_token_ids``, SGLang's); a replica whose ``/v1/models`` says otherwise is refused, at
start (``check_replicas``) and when added (``add``), with the value, the rule and the fix. Replicas may serve
different models (issue 32: a teacher served beside the policy): a call goes only to a replica whose ``/v1/models``
lists its model (the one ``proxy._models`` chose: the policy version's, or a name the operator keeps), with rollout
affinity per model, and a failover only to another replica that serves it; a token count for a model (``request``)
goes to such a replica too. A model that the proxy chose and no replica serves is refused (503
``model_not_served``: the value, the rule, the fix); a name the harness chose itself that no replica lists goes where
any call goes, and the engine answers it. Where every replica serves the same models nothing of this runs per call
(``_serving`` is None). What the failed attempt and its retry on another replica look like in the store is the
service's business (``proxy._service``): the pool only says whether another replica can take the call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence

from .._errors import ProxyError, UpstreamFailure
from .client import Upstream
from .engine_info import EngineInfo, mismatch, probe
from .replica import DOWN, DRAINING, REFUSED, UP, Replica

log = logging.getLogger("proxy.upstreams")

class UpstreamPool:
    """The replicas (``Replica``), the rollouts bound to them, and their health. See the module docstring."""

    def __init__(self, clients: Sequence[Upstream], *, dialect: str, make: Callable[[str], Upstream],
                 infos: dict[str, EngineInfo | None] | None = None, health_interval_s: float = 2.0,
                 max_bound: int = 65536):
        if not clients:
            raise ValueError("no upstream: give at least one --upstream URL")
        self.dialect, self._make, self.health_interval_s, self.max_bound = dialect, make, health_interval_s, max_bound
        self.replicas = [Replica(c.base_url, c, DOWN if infos and infos.get(c.base_url, 0) is None else UP,
                                 (infos or {}).get(c.base_url)) for c in clients]
        # rollout id -> its replica, oldest binding first; (rollout id, model) for a model only some replicas serve
        self._bound: dict[str | tuple[str, str], Replica] = {}
        self._sides: dict[str, list[tuple[str, str]]] = {}  # rollout id -> its (rollout id, model) bindings
        self._serving: dict[str, tuple[Replica, ...]] | None = None  # model -> its replicas; None: all serve the same
        self._health: asyncio.Task | None = None
        self._lock = asyncio.Lock()  # admin changes, one at a time (bound to the loop on first use: Python 3.10+)
        self._only: Replica | None = None
        self._reshape()

    def _reshape(self) -> None:
        """After a change of the replica list or a replica's admission: one replica that may take calls takes them
        all, whatever its health says (``pick``'s fast path)."""
        one = self.replicas[0] if len(self.replicas) == 1 else None
        self._only = one if one is not None and one.state in (UP, DOWN) else None
        self._index()

    def _index(self) -> None:
        """Which replicas serve which model, when they do not all serve the same (what their ``/v1/models`` said;
        a replica not reached yet serves nothing here until the health check reaches it)."""
        known = [r for r in self.replicas if r.info is not None and r.state != REFUSED]
        if len({r.info.models for r in known}) <= 1:
            self._serving = None
            return
        serving: dict[str, list[Replica]] = {}
        for r in known:
            for model in r.info.models:
                serving.setdefault(model, []).append(r)
        self._serving = {m: tuple(rs) for m, rs in serving.items()}

    @property
    def routing(self) -> bool:
        """More than one replica: calls are routed (and record which replica answered)."""
        return len(self.replicas) > 1

    @property
    def base_url(self) -> str:
        return self.replicas[0].url

    # ---- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        for r in self.replicas:
            await r.client.start()
        if self.routing and self._health is None:
            self._health = asyncio.get_running_loop().create_task(self._check_forever())

    async def close(self) -> None:
        if self._health is not None:
            self._health.cancel()
            self._health = None
        for r in self.replicas:
            await r.client.close()

    # ---- routing (the hot path) -----------------------------------------------------------------------------
    def pick(self, key: str | None, model: str | None = None, chosen: bool = False) -> Replica:
        """The replica for the next call of rollout ``key`` (None: an unbound call) asking for ``model`` (``chosen``:
        the proxy chose that name, see the module docstring). ProxyError 503 if none may take calls (every replica
        draining or refused), or none serves a chosen model."""
        only = self._only
        if only is not None:
            only.calls += 1
            return only
        among = self._serving_among(model, chosen)
        if among is not None:
            return self._pick_among(key, model, among)
        if key is not None:
            rep = self._bound.get(key)
            if rep is not None and rep.state == UP:
                rep.calls += 1
                return rep
        rep = self._least()
        if key is not None:
            self._bind(key, rep)
        rep.calls += 1
        return rep

    def _serving_among(self, model: str | None, chosen: bool) -> tuple[Replica, ...] | None:
        """The replicas that serve ``model`` (None: any replica may take it, also where all serve the same)."""
        if self._serving is None or model is None:
            return None
        among = self._serving.get(model)
        if among is None and chosen:
            served = "; ".join(f"{r.url} serves {list(r.info.models)}" for r in self.replicas if r.info is not None)
            raise ProxyError(503, f"model {model!r} is served by no engine replica behind this proxy ({served}): a "
                                  "call goes only to a replica that serves the model it is recorded under (its policy "
                                  "version's, or a name --model-map keeps); start an engine that serves it and add it "
                                  "(POST /admin/upstreams or --upstream), or map the name to a version a replica "
                                  "serves (--model-map NAME=VERSION)", type="server_error", code="model_not_served")
        return among

    def _pick_among(self, key: str | None, model: str, among: tuple[Replica, ...]) -> Replica:
        """``pick`` for a model only ``among`` serve: the rollout's replica for that model while it is up."""
        side = None if key is None else (key, model)
        rep = self._bound.get(side) if side is not None else None
        if rep is None or rep.state != UP or rep not in among:
            rep = self._least(among=among)
            if side is not None:
                self._bind(side, rep)
        rep.calls += 1
        return rep

    def _least(self, exclude: Collection[Replica] = (), among: Collection[Replica] | None = None) -> Replica:
        pool = self.replicas if among is None else among
        up = [r for r in pool if r.state == UP and r not in exclude]
        if not up:  # none known up: a down one may be back before the next check (a failed try is recorded)
            up = [r for r in pool if r.state == DOWN and r not in exclude]
        if not up:
            states = ", ".join(f"{r.url} {r.state}" for r in pool)
            raise ProxyError(503, f"no upstream takes calls now ({states}); add one (POST /admin/upstreams) or "
                                  "bring a draining one back by adding it again", type="server_error",
                             code="no_upstream")
        return min(up, key=lambda r: r.client.outstanding + r.bound)

    def _bind(self, key: str | tuple[str, str], rep: Replica) -> None:
        old = self._bound.pop(key, None)
        if old is not None:
            old.bound -= 1
        elif isinstance(key, tuple):
            self._sides.setdefault(key[0], []).append(key)
            if len(self._sides) > self.max_bound:   # rollouts never ended: their bindings were evicted already
                self._sides.pop(next(iter(self._sides)))
        self._bound[key] = rep
        rep.bound += 1
        if len(self._bound) > self.max_bound:
            oldest = next(iter(self._bound))
            self._bound.pop(oldest).bound -= 1

    def forget(self, key: str) -> None:
        """Rollout ``key`` ended: it binds nothing any more."""
        for k in (key, *self._sides.pop(key, ())):
            rep = self._bound.pop(k, None)
            if rep is not None:
                rep.bound -= 1

    def failed(self, rep: Replica, failure: UpstreamFailure, key: str | None, tried: Collection[Replica] = (),
               model: str | None = None, chosen: bool = False) -> Replica | None:
        """A call to ``rep`` (for ``model``, as ``pick`` was asked) failed with ``failure``. A connection failure
        marks it down; if another replica that serves the call's model and that the call has not ``tried`` can take
        it, that one is returned (rollout ``key`` bound to it), else None. Other failures (a timeout, the engine's
        own errors) are the call's answer: None."""
        if failure.error_class != "upstream_unreachable":
            return None
        rep.failures += 1
        if self._only is not None:  # nowhere else to go, and no health check to bring it back: it stays tried
            rep.last_error = failure.message
            return None
        rep.set_state(DOWN if rep.state == UP else rep.state, failure.message)
        among = self._serving.get(model) if self._serving is not None and model is not None else None
        if among is None and chosen and self._serving is not None:
            return None  # no other replica serves the model it was sent for
        try:
            nxt = self._least(exclude=(rep, *tried), among=among)
        except ProxyError:
            return None
        if key is not None:
            self._bind(key if among is None else (key, model), nxt)
        nxt.calls += 1
        return nxt

    async def request(self, method: str, path: str, body: bytes | None = None, model: str | None = None,
                      chosen: bool = False):
        """A request that is not a recorded call (``/v1/models``, token counts): on a replica that takes calls and
        serves ``model`` (chosen, refused: as ``pick`` does), the next such one if it cannot be reached."""
        among = self._serving_among(model, chosen)
        rep, tried = self._only or self._least(among=among), []
        while True:
            try:
                return await rep.client.request(method, path, body)
            except UpstreamFailure as exc:
                tried.append(rep)
                nxt = self.failed(rep, exc, None, tried, model, chosen)
                if nxt is None:
                    raise
                rep = nxt

    # ---- operators ------------------------------------------------------------------------------------------
    def describe(self) -> list[dict]:
        return [r.describe() for r in self.replicas]

    def find(self, url: str) -> Replica:
        try:
            base = Upstream(url).base_url
        except ValueError as exc:
            raise ProxyError(400, str(exc), code="invalid_upstream") from None
        for r in self.replicas:
            if r.url == base:
                return r
        raise ProxyError(404, f"upstream {url!r} is not behind this proxy (it has: "
                              f"{', '.join(r.url for r in self.replicas)}); list them with GET /admin/upstreams",
                         code="unknown_upstream")

    async def add(self, url: str) -> dict:
        """Add a replica (or bring a draining one back): it must answer ``GET /v1/models`` as the same engine as the
        others (its models may differ: calls go to the replicas that serve theirs). 424 if it cannot be asked, 409 if
        it is another engine."""
        async with self._lock:
            try:
                client = self._make(url)
            except ValueError as exc:
                raise ProxyError(400, str(exc), code="invalid_upstream") from None
            existing = next((r for r in self.replicas if r.url == client.base_url), None)
            try:
                info = await probe(client)
            except UpstreamFailure as exc:
                raise ProxyError(424, f"cannot add upstream {client.base_url}: {exc.message}; start the engine, "
                                      "then add it again", code="upstream_unreachable") from None
            except ValueError as exc:
                raise ProxyError(424, f"cannot add upstream {client.base_url}: {exc}; is it an OpenAI-compatible "
                                      "server?", code="upstream_protocol") from None
            finally:
                await client.close()
            await self._probe_unknown(exclude=existing)
            others = [(r.url, r.info) for r in self.replicas if r is not existing and r.info is not None
                      and r.state != REFUSED]
            if problem := mismatch(client.base_url, info, self.dialect, others):
                raise ProxyError(409, f"upstream refused: {problem}", code="dialect_mismatch")
            if existing is not None:
                was = existing.state
                existing.info = info
                existing.set_state(UP)
                self._reshape()
                return {"added": False, "was": was, **existing.describe()}
            rep = Replica(client.base_url, self._make(url), UP, info)
            await rep.client.start()
            self.replicas.append(rep)
            self._reshape()
            await self.start()
            return {"added": True, "was": None, **rep.describe()}

    async def _probe_unknown(self, exclude: Replica | None) -> None:
        """Replicas never reached (one given alone at start is not probed): asked now, so a new one is compared
        with what they are."""
        for r in self.replicas:
            if r.info is None and r is not exclude:
                try:
                    r.info = await probe(r.client)
                except (UpstreamFailure, ValueError):
                    pass
        self._index()

    async def remove(self, url: str) -> dict:
        """Take a replica out now: no new call goes there, its rollouts move on their next call, calls in flight
        finish (their connections are then closed). 409 for the last one."""
        async with self._lock:
            rep = self.find(url)
            if len(self.replicas) == 1:
                raise ProxyError(409, f"upstream {rep.url} is the only one; a proxy needs one: add another "
                                      "(POST /admin/upstreams) before removing it", code="last_upstream")
            self.replicas.remove(rep)
            self._unbind(rep)
            self._reshape()
            rep.set_state("removed")
            await rep.client.close()
            if not self.routing and self._health is not None:
                self._health.cancel()
                self._health = None
            return rep.describe()

    async def drain(self, url: str, timeout_s: float) -> dict:
        """No new calls to a replica (its rollouts move on their next call); waits up to ``timeout_s`` for its
        calls in flight. It stays listed, draining, until removed or added again."""
        rep = self.find(url)
        if rep.state == REFUSED:
            raise ProxyError(409, f"upstream {rep.url} is refused ({rep.last_error}); remove it instead",
                             code="upstream_refused")
        rep.set_state(DRAINING)
        self._unbind(rep)
        self._reshape()
        deadline = time.monotonic() + timeout_s
        while rep.client.outstanding and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return {"drained": rep.client.outstanding == 0, **rep.describe()}

    def hook_targets(self) -> list[Replica]:
        """The replicas a weight update must reach: those that take calls or are draining (a single one always)."""
        return [r for r in self.replicas if r.state in (UP, DRAINING) or r is self._only]

    def refuse(self, rep: Replica, why: str) -> None:
        """No more calls to ``rep`` until an operator adds it again (``add``)."""
        rep.set_state(REFUSED, why)
        self._unbind(rep)
        self._reshape()

    def refuse_down(self, why: str) -> None:
        """Refuse every down replica (a weight update went on without them; they come back with the old weights)."""
        for rep in list(self.replicas):
            if rep.state == DOWN and rep is not self._only:
                self.refuse(rep, why)

    def marks(self) -> list[dict]:
        """What an operator (or a weight update) decided about each replica, for a worker that starts later
        (``proxy._fleet``): url, and state ``draining`` or ``refused`` (with why), else ``up`` (health is each
        process's own)."""
        return [{"url": r.url, "state": r.state if r.state in (DRAINING, REFUSED) else UP,
                 "why": r.last_error if r.state == REFUSED else None} for r in self.replicas]

    def apply_marks(self, marks: list[dict]) -> None:
        """Drain or refuse the replicas ``marks`` (``marks()`` of another process) say are; others as they are."""
        for mark in marks:
            rep = next((r for r in self.replicas if r.url == mark["url"]), None)
            if rep is None or rep.state == mark["state"]:
                continue
            if mark["state"] == REFUSED:
                self.refuse(rep, mark["why"] or "refused by another worker of this proxy")
            elif mark["state"] == DRAINING:
                rep.set_state(DRAINING)
                self._unbind(rep)
                self._reshape()

    def _unbind(self, rep: Replica) -> None:
        for key in [k for k, r in self._bound.items() if r is rep]:
            del self._bound[key]
        rep.bound = 0

    # ---- health ---------------------------------------------------------------------------------------------
    async def check(self) -> None:
        """One health round: every replica that is up, down or draining is asked ``GET /v1/models``."""
        await asyncio.gather(*(self._check(r) for r in list(self.replicas) if r.state in (UP, DOWN, DRAINING)))

    async def _check(self, rep: Replica) -> None:
        try:
            info = await probe(rep.client)
        except (UpstreamFailure, ValueError) as exc:
            rep.failures += 1
            if rep.state == UP:
                rep.set_state(DOWN, getattr(exc, "message", str(exc)))
            return
        if rep.info != info:  # first reached now, or restarted as something else
            others = [(r.url, r.info) for r in self.replicas if r is not rep and r.info is not None
                      and r.state != REFUSED]
            if problem := mismatch(rep.url, info, self.dialect, others):
                rep.info = info
                self.refuse(rep, problem)
                return
            rep.info = info
            self._index()
        if rep.state == DOWN:
            rep.set_state(UP)

    async def _check_forever(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.check()
            except Exception:  # a health round must never end the loop; the next one tries again
                log.exception("upstream health check failed")
