"""Network addresses as operators write them in config files and relays announce them: `host:port`."""

from __future__ import annotations


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
