"""The proxy's upstream client: ``client`` (``Upstream``: the pool, requests, answers whole or as SSE events) over
``connection`` (one keep-alive connection parsed by httptools)."""

from .client import Pending, Upstream, UpstreamAnswer, UpstreamStream

__all__ = ["Pending", "Upstream", "UpstreamAnswer", "UpstreamStream"]
