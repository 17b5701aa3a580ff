"""Network addresses as operators write them in config files and relays announce them: `host:port`."""

from __future__ import annotations

import functools
import ipaddress


def parse_addr(addr: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); ValueError with a clear message otherwise."""
    host, sep, port_s = addr.rpartition(":")
    if not sep or not host:
        raise ValueError(f"address {addr!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"address {addr!r}: port {port_s!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"address {addr!r}: port out of range")
    return host, port


def format_addr(host: str, port: int) -> str:
    """(host, port) -> 'host:port' ('[v6]:port' for IPv6)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@functools.lru_cache(maxsize=4096)  # called per request with the client's address
def rate_key(host: str) -> str:
    """Rate-limit key of a client address: the IPv4 address, or the IPv6 /64.

    One IPv6 host usually owns a whole /64, so keying on the full address would give it 2^64 buckets;
    an IPv4-mapped IPv6 address is its IPv4 address. A host that is not an IP literal is its own key.
    """
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)
