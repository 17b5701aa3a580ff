"""The HTTP front: one HTTP/1.1 + WebSocket server for every listener of a relay and of a bootstrap.

An ASGI app (HTTP and `websocket` scopes) served over trio streams, plain TCP or TLS, with absolute
deadlines, connection caps, overload shedding, trusted proxies and a pure, fuzzed request parser. Why a
server of our own and what each part does: the modules' docstrings (server.py first); the operator's
view: docs/operations.md, "HTTP front".
"""

from inri.common.front.server import ASGIApp, HttpServer, listening_socket, raise_fd_limit
from inri.common.front.settings import ClientIpHeader, FrontSettings, check_front_settings
from inri.common.front.stats import FrontStats, Phase, ShedReason
from inri.common.front.tls import TlsContext, TlsError

__all__ = ["ASGIApp", "ClientIpHeader", "FrontSettings", "FrontStats", "HttpServer", "Phase", "ShedReason",
           "TlsContext", "TlsError", "check_front_settings", "listening_socket", "raise_fd_limit"]
