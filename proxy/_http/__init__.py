"""The proxy's own HTTP/1.1 server (``HttpServer``), which ``openforge proxy`` runs."""

from .limits import HttpLimits
from .server import HttpServer

__all__ = ["HttpLimits", "HttpServer"]
