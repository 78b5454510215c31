"""The proxy's HTTP edge: thin routes, auth extraction, error shapes. The work lives in ``ProxyService``.

Harness routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` (OpenAI Responses),
``/v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic), ``/v1/models``, also under ``/r/{token}/v1/...``
for harnesses that cannot set an API key; errors take the shape of the API the route speaks. The four model-call
routes are served by ``proxy._asgi_app.ProxyApp`` without the framework (the hot path); the rest by FastAPI. Operator
routes: ``/health``, ``/metrics``, and ``/admin/*`` (bearer admin token): register/end rollouts, record and switch
policy versions, pause/drain/resume.
"""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from forge_store import InvalidRecord, NotFound, Store

from ._asgi_app import ProxyApp, error_reply
from ._errors import ProxyError
from ._protocols import anthropic_messages, openai_chat, openai_completions, openai_responses
from ._protocols.contract import ChatShaped
from ._service import CallHeaders, ProxyService, parse_json, read_body


def _token_from_headers(request: Request) -> str | None:
    return CallHeaders.from_asgi(request.scope["headers"]).token


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
    attempt: int = 1
    retry_of: str | None = None
    metadata: dict | None = None
    ttl_s: float | None = None


class RolloutEnd(BaseModel):
    model_config = ConfigDict(extra="forbid")
    outcome: str | None = None
    detail: str | None = None


class PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    model_name: str
    checkpoint_id: str | None = None
    checkpoint_hash: str | None = None
    global_step: int | None = None
    tokenizer_hash: str | None = None
    chat_template_hash: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    sampling_defaults: dict | None = None
    activate: bool = True


class PauseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    drain: bool = True
    timeout_s: float = 300.0


def _no_websocket() -> ProxyError:
    return ProxyError(405, "the Responses API websocket transport is not served: the proxy speaks it over HTTP POST "
                           "/v1/responses; set supports_websockets = false for this provider",
                      code="websocket_not_supported")


def create_app(service: ProxyService, *, admin_token: str, responses_mode: str = "translate",
               messages_mode: str = "translate") -> ProxyApp:
    """``responses_mode`` / ``messages_mode``: "translate" (to upstream chat completions, token-exact) or "native"."""
    store: Store = service.store
    registry = service.registry
    chat, completions = ChatShaped(openai_chat), ChatShaped(openai_completions)
    modes = {"translate": (openai_responses.ResponsesAdapter, anthropic_messages.MessagesAdapter),
             "native": (openai_responses.NativeResponses, anthropic_messages.NativeMessages)}
    for name, mode in (("responses", responses_mode), ("messages", messages_mode)):
        if mode not in modes:
            raise ValueError(f"{name} mode {mode!r} unknown: use one of {', '.join(modes)}")
    responses, messages = modes[responses_mode][0](), modes[messages_mode][1]()

    @asynccontextmanager
    async def lifespan(app):
        await service.upstream.start()
        yield
        await service.upstream.close()

    app = FastAPI(title="OpenForge recording proxy", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError):
        reply = error_reply(exc, request.url.path, service.metrics)
        return Response(reply.body, status_code=reply.status, media_type=reply.content_type)

    @app.exception_handler(InvalidRecord)
    async def invalid_record(request: Request, exc: InvalidRecord):  # an admin request the store cannot keep
        return await proxy_error(request, ProxyError(400, str(exc), code="invalid_record"))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return JSONResponse({"error": {"message": str(exc.errors()), "type": "invalid_request_error",
                                       "param": None, "code": "invalid_admin_request"}}, status_code=422)

    # ---- harness routes ----------------------------------------------------------------------------------
    @app.post("/v1/messages/count_tokens")
    async def count_tokens_route(request: Request):
        return await count_tokens(request, _token_from_headers(request))

    @app.get("/v1/responses")
    @app.get("/r/{token}/v1/responses")
    async def responses_get():
        raise _no_websocket()

    @app.websocket("/v1/responses")
    @app.websocket("/r/{token}/v1/responses")
    async def responses_websocket(websocket: WebSocket):
        """Codex may try a websocket first: refuse the handshake with a Responses-shaped error, so that it falls
        back to HTTP POST at once."""
        await websocket.send_denial_response(Response(orjson.dumps(_no_websocket().openai_body()), status_code=405,
                                                      media_type="application/json"))

    @app.get("/v1/models")
    async def models(request: Request):
        await registry.authorize(_token_from_headers(request))
        ans = await service.upstream.request("GET", "/v1/models")
        return Response(ans.body, status_code=ans.status, media_type=ans.content_type or "application/json")

    @app.post("/r/{token}/v1/messages/count_tokens")
    async def count_tokens_path(token: str, request: Request):
        return await count_tokens(request, token)

    async def count_tokens(request: Request, token: str | None):
        await registry.authorize(token)
        raw = await read_body(request.receive, request.headers.get("content-length"), service.max_body)
        return await messages.count_tokens(service.upstream, parse_json(raw))

    @app.get("/r/{token}/v1/models")
    async def models_path(token: str):
        await registry.authorize(token)
        ans = await service.upstream.request("GET", "/v1/models")
        return Response(ans.body, status_code=ans.status, media_type=ans.content_type or "application/json")

    # ---- operators ---------------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        return {"status": "ok", "paused": registry.paused, "in_flight": registry.in_flight,
                "policy_version": registry.policy_version, "store": store.writer_status()}

    @app.get("/metrics")
    async def metrics():
        service.metrics.in_flight.set(registry.in_flight)
        service.metrics.paused.set(1 if registry.paused else 0)
        service.metrics.store_pending.set(store.writer_status().get("pending_ops", 0))
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    def admin(request: Request) -> None:
        token = _token_from_headers(request)
        if not token or not hmac.compare_digest(token, admin_token):
            raise ProxyError(401, "admin API needs the proxy's admin token (Authorization: Bearer ...)",
                             type="authentication_error", code="invalid_admin_token")

    @app.post("/admin/rollouts")
    async def register_rollout(request: Request, body: RolloutIn):
        admin(request)
        fields = body.model_dump(exclude={"rollout_id", "ttl_s"})
        fields["policy_version_id"] = fields["policy_version_id"] or registry.policy_version
        rollout_id = await _to_thread(store.start_rollout, body.rollout_id, **fields)
        _, token = registry.register(rollout_id, body.ttl_s)
        return {"rollout_id": rollout_id, "token": token, "path_prefix": f"/r/{token}",
                "policy_version_id": fields["policy_version_id"]}

    @app.post("/admin/rollouts/{rollout_id}/end")
    async def end_rollout(rollout_id: str, request: Request, body: RolloutEnd | None = None):
        admin(request)
        was_open = registry.end(rollout_id)
        if body is not None and body.outcome:
            try:
                await _to_thread(store.finish_rollout, rollout_id, body.outcome, detail=body.detail)
            except InvalidRecord as exc:
                raise ProxyError(400, str(exc), code="invalid_outcome") from None
        return {"rollout_id": rollout_id, "ended": True, "was_open": was_open}

    @app.post("/admin/policy_versions")
    async def policy_version(request: Request, body: PolicyIn):
        admin(request)
        fields = body.model_dump(exclude={"id", "activate"})
        await _to_thread(store.register_policy_version, body.id, **fields)
        if body.activate:
            await _activate(body.id)
        return {"policy_version": body.id, "current": registry.policy_version}

    @app.post("/admin/policy_versions/{version}/activate")
    async def activate(version: str, request: Request):
        admin(request)
        await _activate(version)
        return {"current": registry.policy_version}

    async def _activate(version: str) -> None:
        previous, registry.policy_version = registry.policy_version, version
        await _to_thread(store.add_event, "policy_version.activated", source="proxy",
                         detail={"policy_version": version, "previous": previous})

    @app.post("/admin/pause")
    async def pause(request: Request, body: PauseIn | None = None):
        admin(request)
        body = body or PauseIn()
        registry.pause()
        drained = await registry.drain(body.timeout_s) if body.drain else None
        return {"paused": True, "drained": drained, "in_flight": registry.in_flight}

    @app.post("/admin/resume")
    async def resume(request: Request):
        admin(request)
        registry.resume()
        return {"paused": False}

    @app.get("/admin/status")
    async def status(request: Request):
        admin(request)
        return {"paused": registry.paused, "in_flight": registry.in_flight, "policy_version": registry.policy_version,
                "store": store.writer_status(), "upstream": service.upstream.base_url, "dialect": service.dialect,
                "responses_mode": responses_mode, "messages_mode": messages_mode}

    hot = {"/v1/chat/completions": chat, "/v1/completions": completions, "/v1/responses": responses,
           "/v1/messages": messages}
    return ProxyApp(service, hot, app)


async def _to_thread(fn, *args, **kwargs):
    import asyncio

    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except NotFound as exc:
        raise ProxyError(404, str(exc), code="not_found") from None


__all__ = ["create_app", "parse_json"]
