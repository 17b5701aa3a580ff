"""Core types: TokenBucket/KeyedBuckets (inri.core.budget), BoundedMap and RouteTable (inri.core.tables)."""

from __future__ import annotations

from inri.core.budget import KeyedBuckets, TokenBucket
from inri.core.tables import BoundedMap, RouteTable


def test_token_bucket_refills_caps_and_refuses() -> None:
    b = TokenBucket(2.0, 0.0)
    assert b.take(0.0, 1.0, 2.0) and b.take(0.0, 1.0, 2.0)
    assert not b.take(0.0, 1.0, 2.0) and b.wait(1.0) == 1.0
    assert b.take(1.0, 1.0, 2.0)  # one token refilled in 1 s
    assert b.take(100.0, 1.0, 2.0) and b.take(100.0, 1.0, 2.0) and not b.take(100.0, 1.0, 2.0)  # capped at burst


def test_keyed_buckets_are_per_key_lru_bounded_and_count_refusals() -> None:
    t = [0.0]
    k = KeyedBuckets(1.0, 1, max_keys=2, clock=lambda: t[0])
    assert k.take("a") == 0.0 and k.take("a") == 1.0 and k.hits == 1
    assert k.take("b") == 0.0 and k.take("c") == 0.0  # "a" evicted (least recently used)
    assert k.take("a") == 0.0  # a fresh bucket


def test_bounded_map_evicts_the_oldest_only_for_new_keys() -> None:
    m: BoundedMap[str, int] = BoundedMap(2)
    assert not m.put("a", 1) and not m.put("b", 2)
    assert not m.put("a", 3) and list(m) == ["a", "b"]  # overwrite keeps its place, evicts nothing
    assert m.put("c", 4) and list(m) == ["b", "c"]
    assert not m.put_last("b", 5) and list(m) == ["c", "b"]  # moved to the end
    assert m.sweep(lambda v: v > 4) == 1 and dict(m) == {"c": 4}


def test_route_table_entries() -> None:
    r = RouteTable()
    r.set_first(b"x", 1, 50.0, "a", 3)
    e = r[b"x"]
    assert r.epoch(e) == 1 and r.distance(e) == 3 and r.primary(e) == "a" and r.has_room(e, 2)
    r.add_backup(b"x", e, "b", 2)
    e = r[b"x"]
    assert r.vector(e) == [("a", 3), ("b", 2)] and not r.has_room(e, 2) and r.claims(e, "b")
    r.originate(b"h", 1, 10.0)
    assert r.primary(r[b"h"]) is None and r.routed_count() == 1 and r.expire_from == 10.0
    assert r.purge("a") == 1 and r.vector(r[b"x"]) == [("b", 2)] and r.distance(r[b"x"]) == 2
    r.drop_next_hop(b"x", r[b"x"], "b")
    assert r.next_hops(r[b"x"]) == () and r.distance(r[b"x"]) == 2
    assert r.expire(20.0) == [b"h"] and r.expire_from == 50.0
    assert r.evict_first_expiring() == b"x" and not r
