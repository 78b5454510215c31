"""The recording proxy: sits between an unmodified harness and the inference server and records every call.

Public: ``build_proxy`` (a proxy assembled from settings: store, registry, upstream, service, ASGI app),
``HttpServer`` (the proxy's own HTTP/1.1 server, which ``openforge proxy`` runs), and the errors. Real engines to
put behind it are in ``proxy.engines``, test doubles of one in ``proxy.testing``; every other module is private.
"""

from ._build import Proxy, build_proxy
from ._errors import ProxyError, UpstreamFailure
from ._http_server import HttpServer

__all__ = ["HttpServer", "Proxy", "ProxyError", "UpstreamFailure", "build_proxy"]
