"""The operator routes that change which policy the proxy records calls under: policy versions (record, activate),
the pause that fences a weight update, and the whole update in one call (``POST /admin/weights/update``).

The fence: the proxy records a call under the version current when it admitted the call (``RolloutRegistry.enter``).
A pause holds new calls (they wait, they do not fail, up to ``proxy_pause_max_s``); the drain waits until every
admitted call (streams included) has been answered and recorded; only then may the engines' weights change, and the
new version is active before a held call is let through. Behind ``--workers`` each step holds on every worker
before the next (``proxy._fleet``): all pause and drain, the hook runs once, all activate, all resume.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ._errors import ProxyError, UpstreamFailure
from ._fleet import Fleet
from ._service import ProxyService
from ._upstream import Upstream


class PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    model_name: str
    checkpoint_id: str | None = None
    checkpoint_hash: str | None = None
    global_step: int | None = Field(default=None, ge=0, le=2**63 - 1)
    tokenizer_hash: str | None = None
    chat_template_hash: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    sampling_defaults: dict | None = None
    metadata: dict | None = None  # lineage: parent, algorithm, shard (a learner's), teacher (a scripted engine's)
    activate: bool = True


class PauseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    drain: bool = True
    timeout_s: float = 300.0


class HookIn(BaseModel):
    """What loads the new weights, awaited between the drain and the activation: ``path`` is POSTed (with
    ``body``) to every engine replica behind the proxy, e.g. SGLang's ``/update_weights_from_disk``. A 2xx answer
    means loaded."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(pattern=r"^/\S*$", max_length=2048)
    body: dict | None = None
    timeout_s: float = Field(default=600.0, gt=0, le=3600)


class SyncIn(BaseModel):
    """What a sibling changed (``Fleet.activate``, ``Fleet.share_upstreams``)."""

    model_config = ConfigDict(extra="forbid")
    policy_version: str | None = None
    upstreams: list[dict] | None = None  # ``UpstreamPool.marks()``


class WeightsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(min_length=1, max_length=128)
    model_name: str = Field(min_length=1, max_length=512)
    global_step: int | None = Field(default=None, ge=0, le=2**63 - 1)
    parent: str | None = Field(default=None, min_length=1, max_length=128)  # the version these weights came from
    checkpoint_id: str | None = Field(default=None, max_length=512)
    checkpoint_hash: str | None = Field(default=None, max_length=128)
    engine: str | None = Field(default=None, max_length=64)
    engine_version: str | None = Field(default=None, max_length=64)
    metadata: dict | None = None
    hook: HookIn | None = None
    drain_timeout_s: float = Field(default=300.0, ge=0, le=3600)


def policy_routes(router: APIRouter, service: ProxyService, fleet: Fleet, to_thread) -> None:
    """Policy versions, pause / resume, and the weight update (see the module docstring); each holds on every
    worker behind ``--workers`` (``fleet``)."""
    store, rollouts = service.store, service.rollouts
    updating = asyncio.Lock()  # one weight update at a time; a second waits for the first

    @router.post("/admin/policy_versions")
    async def policy_version(request: Request, body: PolicyIn):
        fields = body.model_dump(exclude={"id", "activate"})
        await to_thread(store.register_policy_version, body.id, **fields)
        rollouts.models.learn(body.id, body.model_name)
        previous = rollouts.policy_version
        if body.activate:
            async with fleet.change(request):
                previous = await fleet.activate(body.id, forwarded=fleet.forwarded(request))
        return {"policy_version": body.id, "current": rollouts.policy_version, "previous": previous}

    @router.post("/admin/policy_versions/{version}/activate")
    async def activate(request: Request, version: str):
        async with fleet.change(request):
            previous = await fleet.activate(version, forwarded=fleet.forwarded(request))
        return {"current": rollouts.policy_version, "previous": previous}

    @router.post("/admin/pause")
    async def pause(request: Request, body: PauseIn | None = None):
        body = body or PauseIn()
        async with fleet.change(request):
            return await fleet.pause(body.drain, body.timeout_s, forwarded=fleet.forwarded(request))

    @router.post("/admin/resume")
    async def resume(request: Request):
        async with fleet.change(request):
            return await fleet.resume(forwarded=fleet.forwarded(request))

    @router.post("/admin/fleet/sync", include_in_schema=False)
    async def sync(request: Request, body: SyncIn):
        """Take a sibling's activation or engine replica marks; only from a sibling (``proxy._siblings``)."""
        if not fleet.forwarded(request):
            raise ProxyError(404, "Not Found", code="http_error")
        return fleet.apply(body.model_dump(exclude_none=True))

    @router.post("/admin/weights/update")
    async def update_weights(request: Request, body: WeightsIn):
        """A trainer's weight update, fenced, in one call: pause (new calls wait), drain (calls in flight finish,
        recorded under the old version), the ``hook`` that loads the weights (awaited), register ``version``
        (global step, ``parent`` in its metadata, as the lineage reads it) and activate it, resume (the held calls
        run under ``version``).

        Without a hook, the weights must change while no call is in flight: between trainer steps with the
        rollouts done (a synchronous trainer), or after the caller paused the proxy itself (``POST /admin/pause``)
        before loading; this route then resumes it. With ``hook.path``, a replica that fails the hook is refused
        (it may hold either weights) and the others carry on; a down replica misses the update and is refused too
        (add it again once it holds the new weights). If the drain times out or every hook fails, nothing is
        activated, the old version stays, and the proxy resumes (unless it was paused before this call)."""
        async with updating, fleet.change(request):
            return await _update(body)

    async def _update(body: WeightsIn) -> dict:
        t0, paused_at = time.perf_counter(), time.time()
        paused = await fleet.pause(True, body.drain_timeout_s)  # every worker, or an error (the pause undone)
        was_paused, in_flight = paused["was_paused"], paused["in_flight_at_pause"]
        t1 = time.perf_counter()
        previous = rollouts.policy_version
        if not paused["drained"]:
            if not was_paused:
                await fleet.resume()
            raise ProxyError(409, f"{paused['in_flight']} call(s) were still in flight after drain_timeout_s="
                                  f"{body.drain_timeout_s:g}; nothing was loaded, {previous!r} stays active"
                                  f"{'' if was_paused else ' and the proxy is resumed'}; pass a longer "
                                  "drain_timeout_s", code="drain_timeout")
        hooked = await _hook(body.hook, was_paused, previous) if body.hook is not None else []
        t2 = time.perf_counter()
        meta = {**(body.metadata or {}), **({"parent": body.parent} if body.parent else {})}
        try:
            if hooked:
                await fleet.share_upstreams()  # the replicas refused here are refused on every worker
            await to_thread(store.register_policy_version, body.version, model_name=body.model_name,
                            global_step=body.global_step, checkpoint_id=body.checkpoint_id,
                            checkpoint_hash=body.checkpoint_hash, engine=body.engine,
                            engine_version=body.engine_version, metadata=meta or None)
            await fleet.activate(body.version)
        except Exception as exc:
            raise ProxyError(503, f"the engines hold {body.version!r}'s weights but the proxy could not record "
                                  f"and activate it everywhere ({type(exc).__name__}: {exc}); it stays paused "
                                  f"(with {previous!r} active where the activation did not reach) so that no call "
                                  f"is misattributed: activate {body.version!r} (POST /admin/policy_versions) then "
                                  "resume (POST /admin/resume)", type="server_error", code="activate_failed") from exc
        await fleet.resume()
        t3, resumed_at = time.perf_counter(), time.time()
        timings = {"drain_s": t1 - t0, "hook_s": t2 - t1, "activate_s": t3 - t2, "held_s": t3 - t0,
                   "paused_at": paused_at, "resumed_at": resumed_at}  # wall clock (epoch s): calls between were held
        await to_thread(store.add_event, "policy_version.weights_updated", source="proxy",
                        detail={"policy_version": body.version, "previous": previous, "in_flight": in_flight,
                                "hook": hooked, **timings})
        return {"policy_version": body.version, "previous": previous, "global_step": body.global_step,
                "parent": body.parent, "in_flight_at_pause": in_flight, "was_paused": was_paused,
                "hook": hooked, **timings}

    async def _hook(hook: HookIn, was_paused: bool, previous: str | None) -> list[dict]:
        """POST the hook to every replica that takes calls; per replica: url, status, seconds, error. If some
        succeeded, the others are refused, and so are down replicas (they missed the update). If every one failed,
        the proxy resumes under ``previous`` and the update is refused (424)."""
        data = orjson.dumps(hook.body) if hook.body is not None else b"{}"
        pool = service.upstream
        targets = pool.hook_targets()
        results = await asyncio.gather(*(_post(r.client, hook.path, data, hook.timeout_s) for r in targets))
        out = [{"url": r.url, **res} for r, res in zip(targets, results)]
        failed = [r for r, res in zip(targets, results) if res["error"] is not None]
        if targets and len(failed) < len(targets):
            for rep in failed:
                pool.refuse(rep, f"failed the weight-update hook {hook.path}; it may hold either weights: load "
                                 "them, then add it again (POST /admin/upstreams)")
            pool.refuse_down("was down during a weight update and holds the old weights: load the new ones, then "
                             "add it again (POST /admin/upstreams)")
            return out
        if not was_paused:
            await fleet.resume()
        errors = "; ".join(f"{o['url']}: {o['error']}" for o in out) or "no engine replica takes calls"
        raise ProxyError(424, f"the weight-update hook failed everywhere ({errors}); {previous!r} stays active"
                              f"{'' if was_paused else ' and the proxy is resumed'}. If a load stopped half-way, "
                              f"an engine may hold a mix of weights: load {previous!r}'s again before trusting it",
                         code="hook_failed")


async def _post(client: Upstream, path: str, data: bytes, timeout_s: float) -> dict:
    t0 = time.perf_counter()
    error = status = None
    try:
        ans = await asyncio.wait_for(client.request("POST", path, data), timeout_s)
        status = ans.status
        if not 200 <= ans.status < 300:
            error = f"answered {ans.status}: {ans.body[:300].decode(errors='replace')}"
    except asyncio.TimeoutError:
        error = f"no answer within {timeout_s:g}s"
    except UpstreamFailure as exc:
        error = exc.message
    return {"status": status, "seconds": time.perf_counter() - t0, "error": error}
