"""Rollout tokens: HMAC-signed, scoped to one rollout, optionally expiring.

``ofr1.<rollout id, base64url>.<expiry, unix seconds or 0>.<HMAC-SHA256, base64url>``. The signature proves the
proxy issued the token for that rollout; whether the rollout is still open is the registry's question (a token
stops working when its rollout ends, whatever its expiry).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from pathlib import Path

from ._errors import unauthorized

PREFIX = "ofr1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def load_or_create_secret(path: Path) -> bytes:
    """The signing secret kept in ``path`` (mode 0600), created on first use, so tokens survive a restart."""
    if path.exists():
        return path.read_bytes().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(32).encode()
    tmp = path.with_suffix(".tmp")
    tmp.touch(mode=0o600)
    tmp.write_bytes(secret)
    tmp.replace(path)
    return secret


class TokenSigner:
    def __init__(self, secret: bytes):
        if len(secret) < 16:
            raise ValueError("the rollout token secret must be at least 16 bytes; set OPENFORGE_PROXY_TOKEN_SECRET")
        self._key = secret
        self._verified: dict[str, tuple[str, int]] = {}  # token -> (rollout id, expiry): one HMAC per token

    def _sig(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest()[:24])

    def issue(self, rollout_id: str, ttl_s: float | None = None) -> str:
        expires = int(time.time() + ttl_s) if ttl_s else 0
        payload = f"{PREFIX}.{_b64(rollout_id.encode())}.{expires}"
        return f"{payload}.{self._sig(payload)}"

    def verify(self, token: str) -> str:
        """The rollout id the token was issued for; ProxyError 401 if it is malformed, forged or expired."""
        known = self._verified.get(token)
        if known is not None and not (known[1] and time.time() > known[1]):
            return known[0]
        if not token.isascii():  # a header byte past 0x7f (or a path's %FF): never a token this proxy issued
            raise unauthorized("API key is not an OpenForge rollout token (it holds bytes other than ASCII): use the "
                               "token the orchestrator was given for this rollout (POST /admin/rollouts)")
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != PREFIX:
            raise unauthorized("API key is not an OpenForge rollout token: use the token the orchestrator was given "
                               "for this rollout (POST /admin/rollouts)")
        payload = ".".join(parts[:3])
        if not hmac.compare_digest(self._sig(payload), parts[3]):
            raise unauthorized("rollout token signature does not match: the token was altered or issued by another "
                               "proxy (different secret)")
        try:
            rollout_id, expires = _unb64(parts[1]).decode(), int(parts[2])
        except (ValueError, UnicodeDecodeError):
            raise unauthorized("rollout token is malformed") from None
        if expires and time.time() > expires:
            raise unauthorized(f"rollout token for {rollout_id!r} expired; ask the orchestrator for a new one")
        if len(self._verified) >= 65536:
            self._verified.clear()
        self._verified[token] = (rollout_id, expires)
        return rollout_id


def admin_token_matches(token: str | None, admin_token: str) -> bool:
    """Whether ``token`` (as the request headers gave it, any bytes) is the admin token; compared in constant time
    as bytes (``hmac.compare_digest`` refuses strings that are not ASCII)."""
    return bool(token) and hmac.compare_digest(token.encode("utf-8", "surrogatepass"), admin_token.encode())
