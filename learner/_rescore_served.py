"""The at-scale scorer ``vllm-served``: teacher-forced logprobs from a vLLM OpenAI server that serves the version.

Each request is ``POST /v1/completions`` with ``prompt`` = the stored token ids (prompt ids + completion ids, as the
store holds them: never re-tokenized), ``max_tokens: 1`` and vLLM's extra parameter ``prompt_logprobs: 0``; the
answer's ``choices[0].prompt_logprobs`` holds, for every prompt position after the first, ``{token id: {logprob,
rank, decoded_token}}`` for the token at that position given the ones before it, from which the completion
positions are read (vLLM does not read its prefix cache for such a request: every position is computed). A few
requests are in flight at once (``concurrency``, spread over the engines round-robin); the caller writes the results
from its own thread (``_rescore_sink``). A call longer than the server's ``max_model_len`` - 1 is refused before any
request, naming the length to serve with.

As the Hugging Face scorer does, a call whose prompt + completion is a prefix of a longer call of the same rollout
(an agent's next turn) is read from that call's answer: one request per rollout chain, not per turn.

Which server holds the version's weights: an OpenAI-compatible server says which model *names* it serves, not which
weights, so ``--engine URL`` is trusted to serve the version (its model name is checked, and the lineage keeps the
URL, the served model, vLLM's version and, when the server runs in vLLM's dev mode, its dtype). ``--proxy URL``
asks the proxy instead: every engine replica behind a proxy serves its *active* policy version (a weight update
switches them all, fenced by a pause), so the proxy can answer only for its active version: the replicas it lists
as up are used when that version is the one asked for and the proxy is not paused, and that is checked again before
every batch is written (a weight switch during the re-score refuses the batch it could have touched). For another
version there is no replica to ask: serve it (``vllm serve CKPT``) and pass ``--engine``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from forge_store import TokenCall

from ._rescore_sink import RescoreError

SERVED_SCORER = "vllm-served"
CONCURRENCY = 4        # requests in flight at once, over all engines
TIMEOUT_S = 600.0      # one request's read timeout (a long prompt on a loaded engine)


@dataclass
class Served:
    """The engines that score, the model name they serve the version under, and the lineage of their scores."""

    urls: list[str]
    model: str
    lineage: dict
    check: Callable[[], object] | None = None   # raises when the engines may no longer hold the version


def _root(url: str) -> str:
    url = url.strip().rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _client(timeout_s: float = TIMEOUT_S, headers: dict | None = None):
    try:
        import httpx
    except ImportError:
        raise RescoreError("the vllm-served scorer speaks HTTP with httpx, which is not installed: "
                           "pip install 'openforge[proxy]'") from None
    return httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0), headers=headers,
                        transport=httpx.HTTPTransport(retries=2))


def _get(client, url: str, what: str, fix: str):
    import httpx

    try:
        r = client.get(url)
    except httpx.HTTPError as exc:
        raise RescoreError(f"{what} {url}: cannot be asked ({type(exc).__name__}: {exc}); {fix}") from None
    return r


def _error_text(r) -> str:
    try:
        body = r.json()
        err = body.get("error", body) if isinstance(body, dict) else body
        return str(err.get("message", err) if isinstance(err, dict) else err)[:500]
    except ValueError:
        return r.text[:500]


def connect(urls: Sequence[str], version: str, model_name: str | None, served_model: str | None = None) -> Served:
    """Ask each engine what it serves (``GET /v1/models``, ``/version``, ``/server_info``); the model the version's
    calls are sent to is ``served_model`` or the version's ``model_name``."""
    urls = [_root(u) for u in urls]
    model = served_model or model_name
    if not urls:
        raise RescoreError("the vllm-served scorer needs a server of the version: pass --engine URL (or --proxy URL "
                           "when the proxy's active version is the one to score)")
    if not model:
        raise RescoreError(f"policy version {version!r} names no model_name; pass --served-model NAME, the name its "
                           "server serves it under (GET /v1/models)")
    lineage: dict = {"scorer": SERVED_SCORER, "engine": "vllm", "engine_urls": urls, "served_model": model}
    with _client(30.0) as client:
        for url in urls:
            fix = ("start the server of the version (vllm serve CKPT --served-model-name NAME) or pass the URL of one "
                   "that runs")
            r = _get(client, f"{url}/v1/models", "--engine", fix)
            try:
                cards = {m["id"]: m for m in r.json()["data"]} if r.status_code == 200 else None
            except (ValueError, KeyError, TypeError):
                cards = None
            if cards is None:
                raise RescoreError(f"--engine {url}: GET /v1/models answered {r.status_code} ({_error_text(r)}) "
                                   "without a model list; is it an OpenAI-compatible vLLM server? pass the URL of one")
            if model not in cards:
                raise RescoreError(f"--engine {url} does not serve {model!r} (policy version {version!r}'s model); it "
                                   f"serves {', '.join(map(repr, cards)) or 'nothing'}: point --engine at a server "
                                   "of the version, or pass --served-model NAME if it serves it under another name")
            lineage.setdefault("model_root", cards[model].get("root"))
            lineage.setdefault("max_model_len", cards[model].get("max_model_len"))
            v = _get(client, f"{url}/version", "--engine", fix)
            got = v.json().get("version") if v.status_code == 200 else None
            if lineage.setdefault("engine_version", got) != got:
                raise RescoreError(f"--engine {url} runs vLLM {got}, another engine {lineage['engine_version']}: "
                                   "score a version with one build of the engine (its numerics differ across builds)")
            lineage.setdefault("dtype", _dtype(client, url))
    return Served(urls, model, lineage)


def _dtype(client, url: str) -> str | None:
    """The model's dtype from ``/server_info`` (vLLM's dev mode only; None otherwise: the API does not say)."""
    import httpx

    try:
        r = client.get(f"{url}/server_info", params={"config_format": "json"})
        cfg = r.json()["vllm_config"]["model_config"] if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    dtype = cfg.get("dtype") if isinstance(cfg, dict) else None
    return str(dtype).removeprefix("torch.") if dtype else None


def from_proxy(proxy_url: str, admin_token: str | None, version: str, model_name: str | None,
               served_model: str | None = None) -> Served:
    """The engine replicas behind a proxy whose active policy version is ``version`` (see the module docstring)."""
    proxy = _root(proxy_url)
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else None

    def state() -> dict:
        with _client(30.0, headers) as client:
            r = _get(client, f"{proxy}/admin/status", "--proxy", "start the proxy or pass its URL")
            if r.status_code in (401, 403):
                raise RescoreError(f"--proxy {proxy}: the admin API refused the token ({r.status_code}); pass "
                                   "--admin-token, the proxy's admin token")
            if r.status_code != 200:
                raise RescoreError(f"--proxy {proxy}: GET /admin/status answered {r.status_code} "
                                   f"({_error_text(r)}); is it an OpenForge proxy?")
            status = r.json()
            if status.get("policy_version") != version:
                raise RescoreError(f"--proxy {proxy} serves policy version {status.get('policy_version')!r}, not "
                                   f"{version!r}: its engine replicas hold the active version's weights only; "
                                   f"activate {version!r} there, or serve it and pass --engine URL")
            if status.get("paused"):
                raise RescoreError(f"--proxy {proxy} is paused (a weight update may be loading another version into "
                                   "its replicas); run again once it is resumed")
            return status

    state()
    with _client(30.0, headers) as client:
        r = _get(client, f"{proxy}/admin/upstreams", "--proxy", "start the proxy or pass its URL")
    up = [u["url"] for u in r.json().get("upstreams", []) if u.get("state") == "up"] if r.status_code == 200 else []
    if not up:
        raise RescoreError(f"--proxy {proxy} has no engine replica up (GET /admin/upstreams answered "
                           f"{r.status_code}); add one (POST /admin/upstreams) or pass --engine URL")
    served = connect(up, version, model_name, served_model)
    served.lineage["proxy"] = proxy
    served.check = state
    return served


def chains(calls: Sequence[TokenCall]) -> list[tuple[TokenCall, list[TokenCall]]]:
    """Requests to make: (the call whose ids are sent, the calls read from its answer, itself included)."""
    by_rollout: dict[str, list[TokenCall]] = defaultdict(list)
    for c in calls:
        by_rollout[c.rollout_id].append(c)
    out: list[tuple[bytes, TokenCall, list[TokenCall]]] = []
    for group in by_rollout.values():
        hosts: list[tuple[bytes, TokenCall, list[TokenCall]]] = []
        for c in sorted(group, key=lambda c: c.n_prompt * 4 + len(c.completion), reverse=True):
            seq = c.prompt_raw + c.completion
            host = next((h for h in hosts if h[0].startswith(seq)), None)
            if host is None:
                hosts.append((seq, c, [c]))
            else:
                host[2].append(c)
        out += hosts
    return [(h, members) for _, h, members in out]


def _score(client, url: str, model: str, host: TokenCall, members: list[TokenCall]) -> list[list[float]]:
    import httpx

    ids = host.prompt_token_ids + host.completion_token_ids
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
    try:
        r = client.post(f"{url}/v1/completions", json=body)
    except httpx.HTTPError as exc:
        raise RescoreError(f"--engine {url}: no answer for call {host.id} ({type(exc).__name__}: {exc}); is the "
                           "server up? start it again and run again: what was stored stays") from None
    if r.status_code == 404:
        raise RescoreError(f"--engine {url} no longer serves {model!r} ({_error_text(r)}); point --engine at a "
                           "server of the version and run again")
    if r.status_code != 200:
        fix = ("a call longer than the server's max_model_len needs a server started with --max-model-len above it"
               if r.status_code == 400 else "the engine failed: read its log, and run again (what was stored stays)")
        raise RescoreError(f"--engine {url} refused call {host.id} ({len(ids)} tokens, prompt + completion): "
                           f"{r.status_code} {_error_text(r)}; {fix}")
    try:
        got = r.json()["choices"][0]["prompt_logprobs"]
    except (ValueError, KeyError, IndexError, TypeError):
        got = None
    if not isinstance(got, list) or len(got) != len(ids):
        n = len(got) if isinstance(got, list) else "no"
        raise RescoreError(f"--engine {url} answered call {host.id} with {n} prompt logprobs for its {len(ids)} token "
                           "ids: a vLLM server gives one per prompt token (vLLM's prompt_logprobs); pass the URL of "
                           "a vLLM server that does not truncate prompts")
    out = []
    for c in members:
        n = c.n_prompt + len(c.completion) // 4
        row = []
        for t in range(c.n_prompt, n):
            entry = got[t] if isinstance(got[t], dict) else {}
            lp = entry.get(str(ids[t]))
            if not isinstance(lp, dict) or not isinstance(lp.get("logprob"), (int, float)):
                raise RescoreError(f"--engine {url}: call {c.id} token #{t - c.n_prompt} (id {ids[t]}) has no logprob "
                                   f"in the answer (it holds ids {list(entry)[:5]}): the server did not score the ids "
                                   "sent; pass the URL of a vLLM server")
            row.append(float(lp["logprob"]))
        out.append(row)
    return out


def scores(served: Served, calls: Sequence[TokenCall], concurrency: int = CONCURRENCY
           ) -> Iterator[tuple[TokenCall, list[float]]]:
    """(call, the logprob of each of its completion tokens) as answers come, ``concurrency`` requests at once."""
    plan = chains(calls)
    most = served.lineage.get("max_model_len")
    longest = max(plan, key=lambda h: h[0].n_prompt + len(h[0].completion) // 4)[0]
    n = longest.n_prompt + len(longest.completion) // 4
    if isinstance(most, int) and n + 1 > most:
        raise RescoreError(f"call {longest.id} is {n} tokens (prompt + completion) and scoring it takes {n + 1} "
                           f"(max_tokens 1), above the max_model_len {most} that {served.urls[0]} serves; start the "
                           f"server of the version with --max-model-len {n + 1} or more")
    work = iter(plan)
    with _client() as client, ThreadPoolExecutor(max_workers=concurrency) as pool:
        pending: set[Future] = set()
        k = 0

        def submit() -> bool:
            nonlocal k
            nxt = next(work, None)
            if nxt is None:
                return False
            fut = pool.submit(_score, client, served.urls[k % len(served.urls)], served.model, *nxt)
            fut.members = nxt[1]
            pending.add(fut)
            k += 1
            return True

        while len(pending) < concurrency and submit():
            pass
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    pending.discard(fut)
                    rows = fut.result()
                    submit()
                    yield from zip(fut.members, rows)
        finally:
            for fut in pending:
                fut.cancel()
