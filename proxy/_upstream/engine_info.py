"""What an engine replica is (``EngineInfo``, from its ``GET /v1/models``) and whether it may serve beside the
others behind one proxy (``mismatch``): the same engine, so one token-id dialect (the models may differ: the pool
sends each call to a replica that serves its model).
``check_replicas`` asks every replica before the proxy starts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson

from .._errors import UpstreamFailure
from .client import Upstream

log = logging.getLogger("proxy.upstreams")

TOKEN_ID_ENGINES = ("vllm", "sglang")  # engines whose /v1/models says so (owned_by) and that give token ids
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class EngineInfo:
    """What a replica's ``GET /v1/models`` says: ``engine`` (vllm, sglang, or openai for any other server),
    ``owned_by`` as it said it, and the model ids it serves."""

    engine: str
    owned_by: str
    models: tuple[str, ...]


def engine_of(body: bytes) -> EngineInfo:
    """``GET /v1/models``'s answer -> EngineInfo; ValueError if it is not a model list."""
    data = orjson.loads(body)
    cards = data.get("data") if isinstance(data, dict) else None
    if not isinstance(cards, list) or not all(isinstance(c, dict) for c in cards):
        raise ValueError(f"/v1/models did not answer a model list: {body[:200]!r}")
    owners = {str(c.get("owned_by")) for c in cards if c.get("owned_by") is not None}
    owned_by = owners.pop() if len(owners) == 1 else ",".join(sorted(owners)) or "unknown"
    engine = owned_by if owned_by in TOKEN_ID_ENGINES else "openai"
    return EngineInfo(engine, owned_by, tuple(sorted(str(c.get("id")) for c in cards)))


async def probe(client: Upstream, timeout_s: float = PROBE_TIMEOUT_S) -> EngineInfo:
    """Ask a replica what it is; UpstreamFailure if it cannot be reached, ValueError if it answers something else."""
    try:
        ans = await asyncio.wait_for(client.request("GET", "/v1/models"), timeout_s)
    except asyncio.TimeoutError:
        raise UpstreamFailure(504, f"upstream {client.base_url} did not answer GET /v1/models within {timeout_s:g}s",
                              "upstream_timeout") from None
    if ans.status != 200:
        raise ValueError(f"GET {client.base_url}/v1/models answered {ans.status}: {ans.body[:200]!r}")
    return engine_of(ans.body)


def mismatch(url: str, info: EngineInfo, dialect: str, others: Sequence[tuple[str, EngineInfo]]) -> str | None:
    """Why ``url`` (its engine ``info``) cannot serve beside ``others`` under ``dialect``; None if it can."""
    if dialect in TOKEN_ID_ENGINES and info.engine != dialect:
        return (f"upstream {url} is a {info.engine!r} server (its /v1/models says owned_by={info.owned_by!r}) but "
                f"this proxy asks for token ids in the {dialect!r} dialect: every replica behind one proxy must be "
                f"the engine its dialect names, or some calls would be recorded without token ids (not token-exact) "
                f"among token-exact ones; put a {dialect} engine at that URL, or serve it through its own proxy "
                f"(--dialect {info.engine if info.engine in TOKEN_ID_ENGINES else 'openai'})")
    for other_url, other in others:
        if other.engine != info.engine:
            return (f"upstream {url} is a {info.engine!r} server (owned_by={info.owned_by!r}) but {other_url} is a "
                    f"{other.engine!r} one: replicas behind one proxy must be the same engine (one token-id "
                    f"dialect); serve the other engine through its own proxy")
    return None


def check_replicas(urls: Sequence[str], dialect: str, make: Callable[[str], Upstream],
                   timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, EngineInfo | None]:
    """Probe every replica before the proxy starts (in a thread with its own loop, whoever calls): url -> what it
    is (None: unreachable now; it joins as down and is probed again by the health check). ValueError naming the
    replica, the rule and the fix if two are the same URL or are different engines."""
    clients = [make(u) for u in urls]
    seen: dict[str, str] = {}
    for given, c in zip(urls, clients):
        if c.base_url in seen:
            raise ValueError(f"--upstream {given} is given twice (as {seen[c.base_url]} too); give each replica once")
        seen[c.base_url] = given

    async def all_of() -> list:
        try:
            return await asyncio.gather(*(probe(c, timeout_s) for c in clients), return_exceptions=True)
        finally:
            for c in clients:
                await c.close()

    with ThreadPoolExecutor(1) as pool:
        found = pool.submit(asyncio.run, all_of()).result()
    infos: dict[str, EngineInfo | None] = {}
    for c, got in zip(clients, found):
        if isinstance(got, ValueError):
            raise ValueError(f"upstream {c.base_url} is not an OpenAI-compatible server ({got}); check the URL")
        if isinstance(got, BaseException):
            if not isinstance(got, UpstreamFailure):
                raise got
            log.warning("upstream %s unreachable at start (%s); it joins as down", c.base_url, got.message)
            infos[c.base_url] = None
            continue
        problem = mismatch(c.base_url, got, dialect, [(u, i) for u, i in infos.items() if i is not None])
        if problem:
            raise ValueError(problem)
        infos[c.base_url] = got
    return infos
