"""The recording proxy's settings (``ProxySettings``): its secrets, limits, timeouts, budgets and modes.

The proxy owns these; the store's settings (``forge_store.Settings``: home, store URL, journal, blobs) are the
store's, and ``build_proxy`` takes both. The environment variables are the ones they always were
(``OPENFORGE_PROXY_<FIELD>``, and ``OPENFORGE_UPSTREAM_API_KEY``): one ``OPENFORGE_`` scheme for every part, listed
in docs/configuration.md. Nothing is read at import time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProxySettings(BaseSettings):
    """``ProxySettings()`` reads the environment; ``ProxySettings(max_body_bytes=4096)`` sets a value explicitly."""

    model_config = SettingsConfigDict(env_prefix="OPENFORGE_PROXY_", extra="forbid", populate_by_name=True)

    admin_token: str | None = Field(
        default=None,
        description="Bearer token for the proxy's /admin API. Default: generated into HOME/proxy-admin-token.")
    token_secret: str | None = Field(
        default=None, description="HMAC secret that signs rollout tokens. Default: generated into HOME/proxy-secret."
    )
    max_body_bytes: int = Field(default=32 << 20, ge=1024, description="Largest request body the proxy accepts.")
    # The proxy's HTTP server faces every sandbox: what one client connection may hold, and for how long.
    head_timeout_s: float = Field(
        default=10.0, gt=0, description="A request's line and headers must be whole this long after its first byte "
        "(a deadline: a trickle does not extend it); past it: 408 and the connection closes.")
    body_timeout_s: float = Field(
        default=60.0, gt=0, description="A request's body must be whole this long after its head; past it: 408.")
    idle_timeout_s: float = Field(
        default=75.0, gt=0, description="A kept-alive client connection with no request for this long is closed.")
    write_timeout_s: float = Field(
        default=60.0, gt=0, description="A client that reads none of its answer for this long (its socket stays "
        "full) is disconnected.")
    max_head_bytes: int = Field(
        default=64 << 10, ge=1024, description="Largest request line and headers; 431 as soon as it is passed.")
    max_pipelined: int = Field(
        default=16, ge=1, description="Requests a connection may send ahead of their answers; past it the proxy "
        "stops reading that connection until they are answered.")
    max_connections: int = Field(
        default=1024, ge=1, description="Client connections served at once (at most half the descriptor limit); "
        "past it a new one gets a 503 with Retry-After.")
    connect_timeout_s: float = Field(default=5.0, gt=0, description="Upstream connect timeout.")
    read_timeout_s: float = Field(
        default=600.0, gt=0, description="Longest silence from the upstream (per read) before the call is a 504."
    )
    journal_fsync: bool = Field(
        default=False,
        description="fsync the proxy's journal before answering (survives power loss, costs a disk flush per "
        "call). Off: a call is in the kernel before its answer's last byte, which survives kill -9.",
    )
    drain_process: bool = Field(
        default=True, description="Write the proxy's journal into the database from a child process (its event "
        "loop then only journals); off: from a thread of the proxy's own process.")
    redact: list[str] = Field(
        default_factory=lambda: ["api_keys", "bearer_tokens", "private_keys", "cloud_keys", "jwts", "url_passwords",
                                 "rollout_tokens"],
        description="Redaction rules applied to everything the proxy stores (names from proxy._redaction.RULES; "
        "`emails` is the one not on by default).",
    )
    upstream_api_key: str | None = Field(
        default=None, validation_alias=AliasChoices("OPENFORGE_UPSTREAM_API_KEY", "OPENFORGE_PROXY_UPSTREAM_API_KEY"),
        description="API key the proxy presents upstream (OPENFORGE_UPSTREAM_API_KEY, or by its older name "
        "OPENFORGE_PROXY_UPSTREAM_API_KEY; or a file: `openforge proxy --upstream-api-key-file`). Never on the command "
        "line, which every user can read.")
    pin_model: bool = Field(
        default=True, description="Every call is served by the model of the policy version it is recorded under, "
        "whatever model name the harness asked for (the asked name is recorded as metadata.model_requested); off: "
        "the asked name goes upstream as it came (proxy._models).")
    model_map: dict[str, str] = Field(
        default_factory=dict, description="Requested model names to keep, each mapped to the policy version that "
        "serves it (a teacher beside the policy): such a call is served by that version's model and recorded under "
        "it (OPENFORGE_PROXY_MODEL_MAP as JSON; `openforge proxy --model-map NAME=VERSION`).")
    allow_unbound: bool = Field(
        default=False, description="Accept calls without a rollout token (recorded with no rollout)."
    )
    pause_max_s: float = Field(default=300.0, gt=0, description="Longest a call waits while the proxy is paused.")
    rollout_max_calls: int | None = Field(
        default=None, ge=1, description="Default per-rollout budget: the most model calls a rollout may make (a "
        "registration's `max_calls` overrides it; unset: no limit).")
    rollout_max_tokens: int | None = Field(
        default=None, ge=1, description="Default per-rollout budget: the most prompt + completion tokens (the recorded "
        "usage of its calls) a rollout may spend (a registration's `max_tokens` overrides it; unset: no limit).")
    rollout_max_wall_s: float | None = Field(
        default=None, gt=0, description="Default per-rollout budget: the most seconds since registration a rollout may "
        "call in (a registration's `max_wall_s` overrides it; unset: no limit).")
    responses_mode: Literal["translate", "native"] = Field(
        default="translate",
        description="/v1/responses: 'translate' to upstream chat completions with token ids (vLLM, SGLang), or "
        "'native' to pass through to the upstream's own /v1/responses (hosted teachers; not token-exact).",
    )
    messages_mode: Literal["translate", "native"] = Field(
        default="translate",
        description="/v1/messages: 'translate' to upstream chat completions with token ids, or 'native' to pass "
        "through to the upstream's own /v1/messages (not token-exact).",
    )
