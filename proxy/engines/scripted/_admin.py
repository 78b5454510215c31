"""The scripted upstream's control routes (``/_scripted/*``), for a double run in its own process: recorded requests,
script, per-conversation scripts, slow / down state, a weight load (the script swapped after a while), reset. They
are never recorded, slow or down themselves."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from .conversations import conversations_from_json


def _ok(obj) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


def add_admin_routes(app: FastAPI, up: Any) -> None:
    """The control routes of ``up`` (a ``ScriptedUpstream``, which imports this module: not imported back)."""
    async def requests() -> Response:
        return _ok([asdict(r) for r in up.requests])

    async def script(request: Request) -> Response:
        """Steps to add (``{"steps": [...]}`` or a list), or to replace the script with (``"replace": true``)."""
        body = await request.json()
        steps = body.get("steps", []) if isinstance(body, dict) else body
        (up.script.replace if isinstance(body, dict) and body.get("replace") else up.script.extend)(steps)
        return _ok({"remaining": len(up.script.remaining())})

    async def conversations(request: Request) -> Response:
        """``{first user message: steps or actions}`` added to the per-conversation scripts."""
        for key, steps in conversations_from_json(await request.json()).items():
            up.conversations.add(key, steps)
        return _ok({"conversations": len(up.conversations)})

    async def state(request: Request) -> Response:
        body = await request.json()
        if "slow" in body:
            up.set_slow(body["slow"] or 0.0)
        if "down" in body:
            up.set_down(body["down"])
        if "capacity" in body:
            up.set_capacity(body["capacity"])
        return _ok({"slow": up.slow, "down": up.down, "capacity": up.capacity})

    async def load(request: Request) -> Response:
        """A weight load, as an engine's update route does one (``/update_weights_from_disk``): takes ``seconds``,
        then the engine answers from ``steps`` (the new weights' answers), replacing the script."""
        body = await request.json()
        await asyncio.sleep(float(body.get("seconds", 0.0)))
        up.script.replace(body.get("steps", []))
        return _ok({"loaded": True, "remaining": len(up.script.remaining())})

    async def reset() -> Response:
        up.reset()
        return _ok({})

    app.add_api_route("/_scripted/requests", requests, methods=["GET"])
    app.add_api_route("/_scripted/script", script, methods=["POST"])
    app.add_api_route("/_scripted/conversations", conversations, methods=["POST"])
    app.add_api_route("/_scripted/state", state, methods=["POST"])
    app.add_api_route("/_scripted/load", load, methods=["POST"])
    app.add_api_route("/_scripted/reset", reset, methods=["POST"])
