"""The proxy's upstream client: ``client`` (``Upstream``: the pool of connections to one engine, requests, answers
whole or as SSE events) over ``connection`` (one keep-alive connection parsed by httptools), and ``pool``
(``UpstreamPool``: the engine replicas behind one proxy, routing with rollout affinity, health, one dialect)."""

from .client import Pending, Upstream, UpstreamAnswer, UpstreamStream
from .engine_info import check_replicas
from .pool import Replica, UpstreamPool

__all__ = ["Pending", "Replica", "Upstream", "UpstreamAnswer", "UpstreamPool", "UpstreamStream", "check_replicas"]
