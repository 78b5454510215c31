"""The recording proxy: sits between an unmodified harness and the inference server and records every call."""

from .errors import ProxyError, UpstreamFailure
from .server import Proxy, build_proxy

__all__ = ["Proxy", "ProxyError", "UpstreamFailure", "build_proxy"]
