"""Assemble a proxy from settings: wire protocols, store (journal mode), token signer, rollout registry and its
ledger, upstream, service, app.

Nothing here needs the database: the store opens offline when it is away (writes are journaled, the schema is
checked by the drain once it answers) and the registry knows its rollouts from the ledger, so a proxy started (or
restarted) during a database outage serves from its journal.

A replica (``replica_id``: ``openforge proxy --workers N`` numbers its workers, a Kubernetes pod passes its name)
shares the store, the token secret and the admin token with the others and keeps its own journal and rollout ledger,
named ``<journal>-<replica id>``: a replica restarted under the same id opens its predecessor's journal and drains
what it left. It serves rollouts the others registered and ended, and ``previous_response_id`` of responses they
answered, through the store (``proxy._rollouts``, ``proxy._protocols.openai_responses``). A worker of ``--workers``
(``run_dir``: its supervisor's run folder) starts in the proxy-wide state its siblings left there (paused or not, the
active policy version, the engine replicas) and reaches them for proxy-wide admin changes (``proxy._fleet``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from forge_store import Settings, Store, open_store

from ._asgi_app import ProxyApp
from ._auth import TokenSigner, load_or_create_secret
from ._budgets import Limits
from ._fleet import Fleet
from ._metrics import Metrics
from ._models import ServedModels
from ._operator_api import create_app
from ._protocols.openai_chat import DIALECTS
from ._protocols.openai_responses import Responses
from ._protocols.registry import protocols
from ._redaction import Redactor
from ._rollout_ledger import RolloutLedger
from ._rollouts import RolloutRegistry
from ._service import ProxyService
from ._settings import ProxySettings
from ._siblings import Siblings
from ._upstream import Upstream, UpstreamPool, check_replicas


@dataclass
class Proxy:
    app: ProxyApp
    service: ProxyService
    store: Store
    admin_token: str
    signer: TokenSigner


def build_proxy(upstream_url: str | Sequence[str], *, settings: Settings, store_url: str | None = None,
                dialect: str = "vllm", journal_name: str = "proxy", upstream_api_key: str | None = None,
                policy_version: str | None = None, store: Store | None = None,
                replica_id: str | None = None, run_dir: Path | None = None,
                proxy_settings: ProxySettings | None = None) -> Proxy:
    """``settings``: the store's (home, store URL, journal); ``proxy_settings``: the proxy's own (default: from the
    environment)."""
    if dialect not in DIALECTS:
        raise ValueError(f"upstream dialect {dialect!r} unknown: use one of {', '.join(DIALECTS)}")
    ps = proxy_settings if proxy_settings is not None else ProxySettings()
    served = protocols({"responses": ps.responses_mode, "messages": ps.messages_mode})
    redactor = Redactor(ps.redact)
    home = settings.home
    secret = ps.token_secret.encode() if ps.token_secret else load_or_create_secret(home / "proxy-secret")
    admin_token = ps.admin_token or load_or_create_secret(home / "proxy-admin-token").decode()
    signer = TokenSigner(secret)
    if replica_id is not None:
        journal_name, settings = replica_journal(journal_name, replica_id, settings)
    siblings = Siblings(run_dir, replica_id, admin_token) if run_dir is not None and replica_id is not None else None
    state = siblings.read_state() if siblings is not None else None  # read after its socket is bound (the CLI's)
    if state is not None:  # the engine replicas as the last admin change left them (not probed again: all were)
        upstream_url, policy_version = [m["url"] for m in state["upstreams"]], state["policy_version"]
    upstream = _pool(upstream_url, ps, dialect, upstream_api_key, probe=state is None)  # before the journal
    if store is None:
        store = open_store(store_url, journal=True, name=journal_name, offline=True,
                           settings=settings.model_copy(update={"journal_fsync": ps.journal_fsync}),
                           drain="process" if ps.drain_process else "thread")
    ledger = RolloutLedger(home / "proxy-rollouts" / f"{journal_name}.ledger", fsync=ps.journal_fsync)
    rollouts = RolloutRegistry(store, signer, allow_unbound=ps.allow_unbound,
                               pause_max_s=ps.pause_max_s, ledger=ledger, on_close=upstream.forget,
                               **(REPLICA_SYNC if replica_id is not None else {}))
    rollouts.policy_version = policy_version
    rollouts.models = ServedModels(store, pin=ps.pin_model, keep=ps.model_map)
    rollouts.default_limits = Limits(ps.rollout_max_calls, ps.rollout_max_tokens, ps.rollout_max_wall_s)
    if replica_id is not None:
        for protocol in served.served:
            if type(protocol) is Responses:  # translated: the conversations live here, and in the store for the others
                protocol.memory.store = store
    service = ProxyService(store, upstream, rollouts, redactor=redactor, metrics=Metrics(), dialect=dialect,
                           max_body_bytes=ps.max_body_bytes, replica_id=replica_id)
    fleet = Fleet(store, rollouts, upstream, siblings)
    if state is not None:
        fleet.restore(state)
    app = create_app(service, served, admin_token=admin_token, fleet=fleet)
    return Proxy(app, service, store, admin_token, signer)


REPLICA_SYNC = {"register_wait_s": 5.0, "sync_s": 2.0}  # how replicas wait for each other (``RolloutRegistry``)


def replica_journal(journal_name: str, replica_id: str, settings: Settings) -> tuple[str, Settings]:
    """A replica's journal name (``<journal>-<replica id>``), and the settings that put its journal in its own folder
    (under ``journal_dir`` when one is set: without a name, every replica would share it)."""
    if not replica_id or not all(c.isalnum() or c in "-_." for c in replica_id) or replica_id.startswith("."):
        raise ValueError(f"replica id {replica_id!r}: use letters, digits, '-', '_' and '.' (it names the replica's "
                         "journal folder), e.g. 0, 1, 2 or the pod's name")
    name = f"{journal_name}-{replica_id}"
    if settings.journal_dir is not None:
        settings = settings.model_copy(update={"journal_dir": Path(settings.journal_dir) / name})
    return name, settings


def _pool(urls: str | Sequence[str], settings: ProxySettings, dialect: str, api_key: str | None,
          probe: bool = True) -> UpstreamPool:
    """The engine replicas (``proxy._upstream.pool``). Several are probed first (unless not ``probe``): replicas
    of another engine are refused here (ValueError: value, rule, fix); one alone is not (the proxy
    starts without it)."""
    urls = [urls] if isinstance(urls, str) else list(urls)
    make = partial(Upstream, api_key=api_key, connect_timeout_s=settings.connect_timeout_s,
                   read_timeout_s=settings.read_timeout_s)
    infos = check_replicas(urls, dialect, make) if probe and len(urls) > 1 else None
    return UpstreamPool([make(u) for u in urls], dialect=dialect, make=make, infos=infos)
