"""One engine replica behind the proxy (``Replica``): its client, its state (``UP``, ``DOWN``, ``DRAINING``,
``REFUSED``), what its ``/v1/models`` said and its counts; the pool (``proxy._upstream.pool``) routes over them."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from .client import Upstream
from .engine_info import EngineInfo

log = logging.getLogger("proxy.upstreams")

UP, DOWN, DRAINING, REFUSED = "up", "down", "draining", "refused"


@dataclass(eq=False)
class Replica:
    url: str
    client: Upstream
    state: str = UP
    info: EngineInfo | None = None  # None until a probe reached it
    calls: int = 0  # calls routed here
    failures: int = 0  # connection failures and failed health checks
    bound: int = 0  # rollouts bound here
    last_error: str | None = None
    changed_at: float = field(default_factory=time.time)

    def serves(self, model: str) -> bool:
        return self.info is not None and model in self.info.models

    def set_state(self, state: str, error: str | None = None) -> None:
        if state != self.state:
            log.warning("upstream %s: %s -> %s%s", self.url, self.state, state, f" ({error})" if error else "")
            self.state, self.changed_at = state, time.time()
        if error is not None:
            self.last_error = error

    def describe(self) -> dict:
        info = self.info
        return {"url": self.url, "state": self.state, "engine": info.engine if info else None,
                "owned_by": info.owned_by if info else None, "models": list(info.models) if info else None,
                "outstanding": self.client.outstanding, "calls": self.calls, "failures": self.failures,
                "rollouts": self.bound, "last_error": self.last_error, "since": self.changed_at}
