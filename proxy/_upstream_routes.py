"""The operator routes over the engine replicas behind the proxy (``proxy._upstream.pool``): list, add (or bring
back), drain, remove. Thin: the pool does the work; behind ``--workers`` every worker's pool (``proxy._fleet``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ._fleet import MARGIN_S, Fleet
from ._service import ProxyService


class UpstreamIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, max_length=2048)


class DrainIn(UpstreamIn):
    timeout_s: float = Field(default=60.0, ge=0, le=3600)  # how long to wait for its calls in flight


def upstream_routes(router: APIRouter, service: ProxyService, fleet: Fleet) -> None:
    pool = service.upstream

    @router.get("/admin/upstreams")
    async def list_upstreams(request: Request):
        """Every replica: url, state (up, down, draining, refused), engine and models (from its ``/v1/models``),
        outstanding requests, calls routed to it, failures, rollouts bound to it, the last error. Behind
        ``--workers``: ``workers``, each worker's view (health and load are each worker's own)."""
        return await fleet.views(request, {"dialect": pool.dialect, "routing": pool.routing,
                                           "upstreams": pool.describe()})

    @router.post("/admin/upstreams")
    async def add_upstream(request: Request, body: UpstreamIn):
        """Add a replica, or bring a draining or refused one back. It is asked ``GET /v1/models`` first: 424 if it
        cannot be asked, 409 if it is another engine (token-id dialect). It may serve other models than the others: calls go to the
        replicas that serve theirs."""
        async with fleet.change(request):
            return await fleet.forward(request, await pool.add(body.url))

    @router.post("/admin/upstreams/drain")
    async def drain_upstream(request: Request, body: DrainIn):
        """No new calls to the replica (its rollouts move on their next call); waits up to ``timeout_s`` for its
        calls in flight (``drained``: none left). It stays listed until removed or added again."""
        async with fleet.change(request):
            await pool.drain(body.url, 0)  # marked here at once (a 404 or 409 before any sibling is told)
            return await fleet.forward(request, pool.drain(body.url, body.timeout_s), body.timeout_s + MARGIN_S)

    @router.post("/admin/upstreams/remove")
    async def remove_upstream(request: Request, body: UpstreamIn):
        """Take the replica out now (calls in flight finish); 409 for the last one."""
        async with fleet.change(request):
            return await fleet.forward(request, await pool.remove(body.url))
