"""Proximity ranking of peer candidates: near first, random others so the mesh does not split.

Half of an answer (rounded up) is the nearest candidates — same network prefix (IPv4 /24, IPv6 /48)
first, then by distance between coarse geo hints — and the rest is drawn at random from everyone
else: a mesh built only from nearest neighbours becomes islands (one per prefix or city), while a
few random long links keep its diameter logarithmic (small-world). The asker is never in its own
answer and no relay appears twice.
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass

from inri.protocol.peer_record import geo_distance_km, parse_geo


def prefix_of(host: str) -> str | None:
    """The ranking/capping prefix of an IP literal: IPv4 /24 or IPv6 /48; None if not an IP."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    bits = 24 if ip.version == 4 else 48
    return str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))


@dataclass(frozen=True, slots=True)
class Candidate:
    """A listed relay as the ranking sees it."""

    node_id: str
    addr: str
    prefix: str | None
    geo: str


def rank(
    candidates: list[Candidate],
    *,
    asker: str | None,
    asker_prefix: str | None,
    asker_geo: str | None,
    count: int,
    rng: random.Random,
) -> list[Candidate]:
    """Up to count candidates: ceil(count/2) nearest, then random others; never the asker, no duplicates."""
    if count <= 0:
        return []
    seen: set[str] = set()
    pool: list[Candidate] = []
    for c in candidates:
        if c.node_id != asker and c.node_id not in seen:
            seen.add(c.node_id)
            pool.append(c)
    here = parse_geo(asker_geo or "")

    def nearness(c: Candidate) -> tuple[int, float, float]:
        same = 0 if asker_prefix is not None and c.prefix == asker_prefix else 1
        there = parse_geo(c.geo)
        dist = geo_distance_km(here, there) if here is not None and there is not None else float("inf")
        return same, dist, rng.random()  # random tie-break: equal candidates share the load

    ordered = sorted(pool, key=nearness)
    near_n = (count + 1) // 2
    chosen = ordered[:near_n]
    rest = ordered[near_n:]
    rng.shuffle(rest)
    chosen += rest[: count - len(chosen)]
    return chosen
