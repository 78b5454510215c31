"""The recording proxy: sits between an unmodified harness and the inference server and records every call.

Public: ``build_proxy`` (a proxy assembled from settings: wire protocols, store, rollout registry, upstream,
service, ASGI app), ``HttpServer`` (the proxy's own HTTP/1.1 server, which ``openforge proxy`` runs) with its
``HttpLimits`` (deadlines, size and connection caps, from settings), ``ProxySettings`` (the proxy's own settings:
secrets, limits, timeouts, budgets, modes; ``OPENFORGE_PROXY_*``), and the errors. Real engines to put behind
it are in ``proxy.engines`` (vLLM on the CPU, and ``proxy.engines.scripted``, an engine answering from a script); every other module is private:
``_protocols/`` (one module or folder per wire protocol, and their registry), ``_service`` (a call's path),
``_failover`` (a call's replicas),
``_asgi_app`` (model calls to the service, the rest to ``_operator_api``), ``_http/`` (the server), ``_upstream/``
(the client), ``_rollouts`` (which rollouts may call), ``_build``, ``_replicas`` (``--workers``' supervisor) and
``_fleet`` / ``_siblings`` (admin changes that hold on every worker).
"""

from ._build import Proxy, build_proxy
from ._errors import ProxyError, UpstreamFailure
from ._http import HttpLimits, HttpServer
from ._settings import ProxySettings

__all__ = ["HttpLimits", "HttpServer", "Proxy", "ProxyError", "ProxySettings", "UpstreamFailure", "build_proxy"]
