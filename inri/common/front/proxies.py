"""Which client a request comes from: the peer, or behind a trusted reverse proxy the client it names.

A proxy appends the address it received a request from to X-Forwarded-For (or adds a `for=` element to
RFC 7239 `Forwarded`); whatever the client wrote there itself comes first. So the list is read from the
right: trusted proxies are skipped, and the first address that is not one is the client (what nginx's
real_ip_recursive and Caddy's trusted_proxies do). Nothing a client sends can then move its address:
headers from a peer that is not a trusted proxy are ignored, and behind one, a forged entry sits left
of the address the proxy appended. An entry that is not an IP address (`unknown`, an obfuscated
identifier, garbage) stops the walk: the request counts as the trusted proxy's right of it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from inri.common.front.settings import ClientIpHeader

__all__ = ["TrustedProxies"]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
ANSWERS_CACHED_MAX = 4096  # (header value) -> client, (address) -> trusted; each cleared when full


class TrustedProxies:
    """Trusted proxy networks and the header they name the client in."""

    def __init__(self, networks: Sequence[str], header: ClientIpHeader = ClientIpHeader.X_FORWARDED_FOR) -> None:
        self.networks: tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(n.strip(), strict=False)
                                                     for n in networks)
        self.header = header.value.encode()
        self._trusted: dict[str, bool] = {}
        self._clients: dict[bytes, str | None] = {}

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, host: str) -> bool:
        """host (an address as the socket reports it) is a trusted proxy."""
        known = self._trusted.get(host)
        if known is None:
            ip = _ip(host)
            known = ip is not None and any(ip in net for net in self.networks if net.version == ip.version)
            if len(self._trusted) >= ANSWERS_CACHED_MAX:
                self._trusted.clear()
            self._trusted[host] = known
        return known

    def client(self, peer: str, headers: Sequence[tuple[bytes, bytes]]) -> str:
        """The client's address for a request from peer (a trusted proxy), its header fields in order."""
        values = [value for name, value in headers if name == self.header]
        if not values:
            return peer
        joined = b", ".join(values)  # several fields are one comma-separated list (RFC 9110 5.3)
        found = self._clients.get(joined, peer)  # `peer`: not cached yet (None is a cached "no answer")
        if found is peer:
            found = self._walk(joined)
            if len(self._clients) >= ANSWERS_CACHED_MAX:
                self._clients.clear()
            self._clients[joined] = found
        return peer if found is None else found

    def _walk(self, joined: bytes) -> str | None:
        """The rightmost address that is not a trusted proxy; None when it is the peer's right neighbour
        (every entry trusted but none, or an entry that is no address)."""
        entries = _forwarded_for(joined) if self.header == b"forwarded" else _x_forwarded_for(joined)
        last_trusted: str | None = None
        for entry in reversed(entries):
            if entry is None:
                return last_trusted
            if not self.trusts(entry):
                return entry
            last_trusted = entry
        return last_trusted


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _address(text: str) -> str | None:
    """An address as a proxy writes it ("198.51.100.7", "198.51.100.7:4711", "[2001:db8::1]:80",
    "2001:db8::1"), normalised; None when it is not one."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    ip = _ip(text)
    return None if ip is None else str(ip)


def _x_forwarded_for(value: bytes) -> list[str | None]:
    return [_address(part) for part in value.decode("latin-1").split(",") if part.strip()]


def _forwarded_for(value: bytes) -> list[str | None]:
    """The `for=` of each element of a Forwarded field (RFC 7239 section 4); an element without one is
    no address."""
    out: list[str | None] = []
    for element in value.decode("latin-1").split(","):
        if not element.strip():
            continue
        found: str | None = None
        for pair in element.split(";"):
            name, _, val = pair.partition("=")
            if name.strip().lower() == "for":
                found = _address(val)
        out.append(found)
    return out
