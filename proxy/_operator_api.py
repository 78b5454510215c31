"""The proxy's operator app (FastAPI): every route but the model calls, which ``proxy._asgi_app.ProxyApp`` serves
without the framework (the hot path).

Harness routes besides the model calls: ``/v1/models`` and the wire protocols' side routes
(``/v1/messages/count_tokens``; the refused websocket of ``/v1/responses``), also under ``/r/{token}/...``; errors
take the shape of the API the path speaks. Operator routes: ``/health``, ``/metrics``, and ``/admin/*`` (bearer
admin token): register/end rollouts, add a reward to a rollout, record and switch policy versions, pause/drain/
resume and the fenced weight update (``proxy._policy_routes``), the engine replicas (``proxy._upstream_routes``);
behind ``--workers`` those that change proxy-wide state hold on every worker (``proxy._fleet``).
Routes are thin: the work is the service's, the rollout registry's, the pool's, the store's and the protocols'.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Literal

import orjson
from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from forge_store import REWARD_SOURCES, InvalidRecord, NotFound, StoreUnavailable

from ._asgi_app import ProxyApp, error_reply
from ._auth import admin_token_matches
from ._budgets import Limits
from ._errors import ProxyError
from ._exchange import CallHeaders, parse_json, read_body
from ._fleet import Fleet
from ._policy_routes import policy_routes
from ._protocols.body import check_body
from ._protocols.contract import SideRoute, WireProtocol
from ._protocols.registry import Protocols
from ._service import ProxyService
from ._upstream_routes import upstream_routes


class RolloutIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rollout_id: str | None = None
    task_id: str | None = None
    group_id: str | None = None
    run_id: str | None = None
    harness_id: str | None = None
    policy_version_id: str | None = None
    backend: str | None = None
    image_ref: str | None = None
    attempt: int = Field(default=1, ge=1, le=2**31 - 1)  # the store's column is 32-bit on PostgreSQL
    retry_of: str | None = None
    metadata: dict | None = None
    task_version_id: str | None = None  # the task version the rollout runs (rollout.task_version)
    ttl_s: float | None = None
    # the rollout's budget (``proxy._budgets``), over the proxy's defaults (settings); None: the default
    max_calls: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_wall_s: float | None = Field(default=None, gt=0)


class RolloutEnd(BaseModel):
    model_config = ConfigDict(extra="forbid")
    outcome: str | None = None
    detail: str | None = None


_NO_NUL = r"^[^\x00]*$"  # PostgreSQL text holds no NUL


class RewardIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: float = Field(allow_inf_nan=False)
    source: Literal[REWARD_SOURCES] = "api"
    verifier_version: str | None = Field(default=None, max_length=128, pattern=_NO_NUL)
    evidence: str | None = Field(default=None, max_length=32 << 20)  # text, kept as a blob
    evidence_blob: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")  # a blob already in the store
    detail: dict | None = None
    id: str | None = Field(default=None, min_length=1, max_length=128, pattern=_NO_NUL)  # a retried POST adds it once


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorOut(BaseModel):
    """Every 4xx of the operator routes, in OpenAI's shape (documented so that clients and schema checks know it)."""

    error: ErrorDetail


ERRORS = {"4XX": {"model": ErrorOut, "description": "the request was refused (the message says why and the fix)"}}


def _admin_route(admin_token: str) -> type[APIRoute]:
    """The operator routes' class: on ``/admin/*`` the admin token is checked before anything else (an
    unauthenticated request gets a 401, never a list of the fields the body takes), then any body is parsed as
    strictly as a model call's (``parse_json``, ``check_body``: 400) before FastAPI validates it."""

    class AdminRoute(APIRoute):
        def get_route_handler(self):
            handler, guarded = super().get_route_handler(), self.path.startswith("/admin/")

            async def checked(request: Request) -> Response:
                if guarded and not admin_token_matches(_token_from_headers(request), admin_token):
                    raise ProxyError(401, "admin API needs the proxy's admin token (Authorization: Bearer ...)",
                                     type="authentication_error", code="invalid_admin_token")
                if raw := await request.body():
                    check_body(parse_json(raw))
                return await handler(request)

            return checked

    return AdminRoute


def create_app(service: ProxyService, protocols: Protocols, *, admin_token: str,
               fleet: Fleet | None = None) -> ProxyApp:
    """The proxy's ASGI app: ``protocols``' model calls straight to ``service``, the rest through FastAPI.
    ``fleet``: the sibling workers admin changes reach (default: this process alone)."""
    fleet = fleet or Fleet(service.store, service.rollouts, service.upstream)

    @asynccontextmanager
    async def lifespan(app):
        await service.upstream.start()
        await service.rollouts.start()
        yield
        await service.rollouts.close()
        await service.upstream.close()

    app = FastAPI(title="OpenForge recording proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    _error_handlers(app, protocols, service)
    app.include_router(_harness_routes(service, protocols))
    app.include_router(_operator_routes(service, protocols, admin_token, fleet))
    return ProxyApp(service, protocols, app)


def _token_from_headers(request: Request) -> str | None:
    return CallHeaders.from_asgi(request.scope["headers"]).token


def _error_handlers(app: FastAPI, protocols: Protocols, service: ProxyService) -> None:
    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError):
        path = request.url.path
        reply = error_reply(exc, protocols.error_body(exc, path), service.metrics)
        return Response(reply.body, status_code=reply.status, media_type=reply.content_type)

    @app.exception_handler(InvalidRecord)
    async def invalid_record(request: Request, exc: InvalidRecord):  # an admin request the store cannot keep
        return await proxy_error(request, ProxyError(400, str(exc), code="invalid_record"))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):  # authenticated first: AdminRoute
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or e['loc'][0]}: {e['msg']}"
                             for e in exc.errors())
        exc = ProxyError(400, f"invalid request: {problems}", code="invalid_admin_request")
        return await proxy_error(request, exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # routing's 404 and 405, in the API's shape
        return await proxy_error(request, ProxyError(exc.status_code, str(exc.detail), code="http_error"))


# ---- harness routes ----------------------------------------------------------------------------------------------
def _harness_routes(service: ProxyService, protocols: Protocols) -> APIRouter:
    router = APIRouter()
    rollouts = service.rollouts

    async def upstream_models() -> Response:
        ans = await service.upstream.request("GET", "/v1/models")
        return Response(ans.body, status_code=ans.status, media_type=ans.content_type or "application/json")

    @router.get("/v1/models")
    async def models(request: Request):
        await rollouts.authorize(_token_from_headers(request))
        return await upstream_models()

    @router.get("/r/{token}/v1/models")
    async def models_path(token: str):
        await rollouts.authorize(token)
        return await upstream_models()

    for route, protocol in protocols.side:
        if route.post is not None:
            _post_route(router, service, route)
        if route.refuse is not None:
            _refusal_routes(router, route, protocol)
    return router


def _post_route(router: APIRouter, service: ProxyService, route: SideRoute) -> None:
    """A JSON request a protocol answers (``SideRoute.post``), authorized like a model call; what it asks the engine
    goes where a call for the model it names would (``ProxyService.side_post``)."""

    async def answer(request: Request, token: str | None) -> dict:
        await service.rollouts.authorize(token)
        raw = await read_body(request.receive, request.headers.get("content-length"), service.max_body)
        body = parse_json(raw)
        check_body(body)
        params = {k: v for k, v in request.path_params.items() if k != "token"}  # e.g. Gemini's {model}
        return await route.post(service.side_post, body, params)

    async def by_header(request: Request):  # or ?key= (the Gemini API's keys may come in the query)
        return await answer(request, _token_from_headers(request) or request.query_params.get("key"))

    async def by_path(token: str, request: Request):
        return await answer(request, token)

    router.add_api_route(route.path, by_header, methods=["POST"])
    router.add_api_route("/r/{token}" + route.path, by_path, methods=["POST"])


def _refusal_routes(router: APIRouter, route: SideRoute, protocol: WireProtocol) -> None:
    """GET requests and websocket handshakes on ``route.path`` refused with its error, in the protocol's shape (Codex
    tries a websocket first: refused at once, it falls back to HTTP POST)."""

    async def get():
        raise route.refuse()

    async def websocket(ws: WebSocket):
        exc = route.refuse()
        await ws.send_denial_response(Response(orjson.dumps(protocol.error_body(exc)), status_code=exc.status,
                                               media_type="application/json"))

    for path in (route.path, "/r/{token}" + route.path):
        router.add_api_route(path, get, methods=["GET"])
        router.add_api_websocket_route(path, websocket)


# ---- operators ---------------------------------------------------------------------------------------------------
def _operator_routes(service: ProxyService, protocols: Protocols, admin_token: str, fleet: Fleet) -> APIRouter:
    router = APIRouter(route_class=_admin_route(admin_token), responses=ERRORS)  # the admin token: AdminRoute
    store, rollouts = service.store, service.rollouts

    @router.get("/health")
    async def health():
        return {"status": "ok", "paused": rollouts.paused, "in_flight": rollouts.in_flight,
                "policy_version": rollouts.policy_version, "store": store.writer_status()}

    @router.get("/metrics", response_class=PlainTextResponse)  # Prometheus text, documented as such
    async def metrics():
        service.metrics.in_flight.set(rollouts.in_flight)
        service.metrics.paused.set(1 if rollouts.paused else 0)
        service.metrics.store_pending.set(store.writer_status().get("pending_ops", 0))
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @router.post("/admin/rollouts")
    async def register_rollout(body: RolloutIn):
        fields = body.model_dump(exclude={"rollout_id", "ttl_s", "max_calls", "max_tokens", "max_wall_s"})
        fields["policy_version_id"] = fields["policy_version_id"] or rollouts.policy_version
        rollout_id = await _to_thread(store.start_rollout, body.rollout_id, **fields)
        binding, token = rollouts.register(rollout_id, body.ttl_s)
        rollouts.limit(binding, Limits(body.max_calls, body.max_tokens, body.max_wall_s))
        limits = binding.budget.limits if binding.budget is not None else Limits()
        return {"rollout_id": rollout_id, "token": token, "path_prefix": f"/r/{token}",
                "policy_version_id": fields["policy_version_id"],
                "budget": {"max_calls": limits.max_calls, "max_tokens": limits.max_tokens,
                           "max_wall_s": limits.max_wall_s}}

    @router.post("/admin/rollouts/{rollout_id}/end")
    async def end_rollout(rollout_id: str, body: RolloutEnd | None = None):
        was_open = rollouts.end(rollout_id)
        if body is not None and body.outcome:
            try:
                await _to_thread(store.finish_rollout, rollout_id, body.outcome, detail=body.detail)
            except InvalidRecord as exc:
                raise ProxyError(400, str(exc), code="invalid_outcome") from None
        return {"rollout_id": rollout_id, "ended": True, "was_open": was_open}

    @router.post("/admin/rollouts/{rollout_id}/rewards")
    async def add_reward(rollout_id: str, body: RewardIn):
        """Append a reward to a rollout (an orchestrator that records through the proxy but grades elsewhere):
        ``value`` (finite), ``source``, ``verifier_version``, evidence as text (stored as a blob) or as a blob the
        store holds. Append-only: a second reward is a second row (the latest counts); with ``id``, a retried
        request adds it once. 404 for a rollout neither this proxy nor the store knows."""
        await _known_rollout(rollout_id)
        if body.evidence is not None and body.evidence_blob is not None:
            raise ProxyError(400, "give the evidence as text (evidence) or as a stored blob (evidence_blob), not "
                                  "both", code="invalid_reward")
        blob = body.evidence_blob
        if blob is not None and not await asyncio.to_thread(store.blobs.exists, blob):
            raise ProxyError(404, f"evidence_blob {blob} is not in the store; send the text as evidence, or put the "
                                  "blob first", code="not_found")
        if body.evidence is not None:
            blob = await asyncio.to_thread(store.put_blob, body.evidence.encode(), "text/plain")
        reward_id = await _to_thread(store.add_reward, rollout_id, body.value, source=body.source,
                                     verifier_version=body.verifier_version, evidence_blob=blob, detail=body.detail,
                                     id=body.id)
        return {"reward_id": reward_id, "rollout_id": rollout_id, "value": body.value, "source": body.source,
                "evidence_blob": blob}

    async def _known_rollout(rollout_id: str) -> None:
        """This proxy registered it (its ledger), or the store has it; else 404."""
        ledger = rollouts.ledger
        if ledger is not None and (rollout_id in ledger.started or rollout_id in ledger.ended):
            return
        try:
            await _to_thread(store.rollout, rollout_id)
        except StoreUnavailable:
            raise ProxyError(503, f"rollout {rollout_id!r} is not in this proxy's ledger and the store cannot be "
                                  "asked about it now (database unreachable); retry later", type="server_error",
                             code="store_unavailable") from None

    policy_routes(router, service, fleet, _to_thread)
    upstream_routes(router, service, fleet)

    @router.get("/admin/status")
    async def status(request: Request):
        """This process's state; behind ``--workers``, ``workers``: each worker's (``replica_id`` names them)."""
        return await fleet.views(request, {
            "paused": rollouts.paused, "in_flight": rollouts.in_flight, "policy_version": rollouts.policy_version,
            "store": store.writer_status(), "upstream": service.upstream.base_url, "dialect": service.dialect,
            "upstreams": [r.url for r in service.upstream.replicas], "replica_id": fleet.replica_id,
            **{f"{surface}_mode": mode for surface, mode in protocols.modes.items()}})

    return router


async def _to_thread(fn, *args, **kwargs):
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except NotFound as exc:
        raise ProxyError(404, str(exc), code="not_found") from None
