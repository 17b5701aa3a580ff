"""The HTTP front's limits: the `[api]` keys of a relay and the same keys of a bootstrap (docs/operations.md).

Relay (`inri.node.config.ApiSection`) and bootstrap (`bootstrap_nodes.config.BootstrapConfig`) inherit
these fields, so a key means the same on both daemons and one validator checks them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from msgspec import Meta

from inri.common.config import ConfigError

__all__ = ["ClientIpHeader", "FrontSettings", "check_front_settings"]

_POSITIVE = Meta(gt=0)


class ClientIpHeader(StrEnum):
    """The header a trusted proxy names the client in (the other one is ignored: a client could set it)."""

    X_FORWARDED_FOR = "x-forwarded-for"  # nginx $proxy_add_x_forwarded_for, haproxy `option forwardfor`
    FORWARDED = "forwarded"  # RFC 7239 `for=`


@dataclass(frozen=True)
class FrontSettings:
    """Deadlines and caps of every HTTP listener (inri.common.front), and who may name the client."""

    # Deadlines, absolute (trio's model: a slow trickle does not move them). A request head must be whole
    # within head_timeout_s of its first byte (of the connection's start for the first one, TLS
    # handshake included); its body within body_timeout_s of the head; each write (an answer, a
    # WebSocket message) within write_timeout_s; the next request must start within idle_timeout_s.
    head_timeout_s: Annotated[float, _POSITIVE] = 10.0
    body_timeout_s: Annotated[float, _POSITIVE] = 30.0
    write_timeout_s: Annotated[float, _POSITIVE] = 30.0
    idle_timeout_s: Annotated[float, _POSITIVE] = 30.0
    max_head_bytes: Annotated[int, Meta(ge=1024, le=1024 * 1024)] = 16 * 1024  # larger heads: 431
    # Connections served at once, in all and per client address (IPv4, IPv6 /64; behind a trusted
    # proxy, the address it names). Past either, a new connection is answered 503 too_many_connections
    # with Retry-After and closed; the connections already open are kept.
    connections_max: Annotated[int, Meta(ge=1)] = 16384
    connections_per_client_max: Annotated[int, Meta(ge=1)] = 1024
    # WebSockets: a Ping after ws_ping_interval_s without a frame from the client; no frame within
    # ws_pong_timeout_s of it closes the connection. Messages over ws_max_message_bytes: close 1009.
    ws_ping_interval_s: Annotated[float, _POSITIVE] = 30.0
    ws_pong_timeout_s: Annotated[float, _POSITIVE] = 30.0
    ws_max_message_bytes: Annotated[int, Meta(ge=1024)] = 64 * 1024
    # Addresses and networks ("127.0.0.1", "10.0.0.0/8", "::1") of reverse proxies whose client_ip_header
    # names the client; nobody else's is believed.
    trusted_proxies: tuple[str, ...] = ()
    client_ip_header: ClientIpHeader = ClientIpHeader.X_FORWARDED_FOR


def check_front_settings(s: FrontSettings, at: Callable[[str], str]) -> None:
    """ConfigError for what the types cannot say; at(key) names where a key's value came from."""
    for entry in s.trusted_proxies:
        try:
            ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            raise ConfigError(f"{at('trusted_proxies')}: {entry!r} is not an IP address or network "
                              "(e.g. 127.0.0.1, 10.0.0.0/8, ::1)") from None
