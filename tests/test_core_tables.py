"""Core types: TokenBucket/KeyedBuckets (inri.core.budget), BoundedMap and RouteTable (inri.core.tables),
and the hot-path builders readdress/make_send (inri.core.state)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from inri.core.api import Send
from inri.core.budget import KeyedBuckets, TokenBucket
from inri.core.state import make_send, readdress
from inri.core.tables import UNKNOWN_DISTANCE, Arrival, BoundedMap, CompactRouteTable, RouteTable
from inri.protocol.messages import ContentEncoding, Push, Registration, Urgency, WebPushMeta


def test_token_bucket_refills_caps_and_refuses() -> None:
    b = TokenBucket(2.0, 0.0)
    assert b.take(0.0, 1.0, 2.0) and b.take(0.0, 1.0, 2.0)
    assert not b.take(0.0, 1.0, 2.0) and b.wait(1.0) == 1.0
    assert b.take(1.0, 1.0, 2.0)  # one token refilled in 1 s
    assert b.take(100.0, 1.0, 2.0) and b.take(100.0, 1.0, 2.0) and not b.take(100.0, 1.0, 2.0)  # capped at burst


def test_token_bucket_never_refills_negatively_when_the_clock_goes_back() -> None:
    b = TokenBucket(5.0, 10.0)
    assert b.take(1.0, 100.0, 10.0)  # 9 s earlier: no refill, but no debt of 900 tokens either
    assert b.tokens == 4.0 and b.t == 10.0
    assert b.take(10.5, 2.0, 10.0) and b.tokens == 4.0  # + 0.5 s x 2, - 1


def test_token_bucket_caps_exactly_like_min() -> None:
    # take() caps without min(): the result must be the same float, bit for bit (simulator traces)
    for tokens, elapsed, rate, burst in [(0.5, 0.3, 1.0, 3), (2.9, 0.1, 1.0, 3), (2.0, 1.0, 1.0, 3),
                                         (0.1, 0.7, 0.1, 1.0), (399.5, 0.25, 2.0, 400)]:
        b = TokenBucket(tokens, 0.0)
        ok = b.take(elapsed, rate, burst)
        want = min(burst, tokens + elapsed * rate)
        assert ok == (want >= 1.0)
        assert b.tokens == (want - 1.0 if ok else want) and b.t == elapsed


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
    assert r.primary(r[b"h"]) is None and r.routed_count() == 1 and r.earliest_expiry() == 10.0
    assert r.purge("a") == 1 and r.vector(r[b"x"]) == [("b", 2)] and r.distance(r[b"x"]) == 2
    r.drop_next_hop(b"x", r[b"x"], "b")
    assert r.next_hops(r[b"x"]) == () and r.distance(r[b"x"]) == 2
    assert r.expire(20.0) == [b"h"] and r.earliest_expiry() == 50.0
    assert r.evict_first_expiring() == b"x" and not r


@pytest.mark.parametrize("cls", [RouteTable, CompactRouteTable])
def test_route_table_reorders_next_hops_and_sweeps_once_due(cls: Table) -> None:
    """demote and lead rewrite an entry inside the table (F6, F7, G9); sweep removes nothing, and reads
    nothing, before the earliest expiry, then what expire removes."""
    r = cls()
    r.set_first(b"x" * 16, 1, 50.0, "a", 3)
    r.add_backup(b"x" * 16, r[b"x" * 16], "b", 2)
    r.demote(b"x" * 16, r[b"x" * 16], "a")
    assert r.vector(r[b"x" * 16]) == [("b", 2), ("a", 3)] and r.distance(r[b"x" * 16]) == 3
    r.lead(b"x" * 16, r[b"x" * 16], "c", 1, 2)  # a new primary; past route_k the last next hop goes
    assert r.vector(r[b"x" * 16]) == [("c", 1), ("b", 2)] and r.distance(r[b"x" * 16]) == 1
    r.lead(b"x" * 16, r[b"x" * 16], "b", 4, 2)  # a backup moved up; the feasibility distance stays
    assert r.vector(r[b"x" * 16]) == [("b", 4), ("c", 1)] and r.distance(r[b"x" * 16]) == 1
    r.originate(b"h" * 16, 1, 10.0)
    r.pop(b"h" * 16)  # the bound stays at 10 (a lower bound): sweep looks, finds nothing, makes it exact
    assert r.sweep(9.0) == [] and r.earliest_expiry() == 10.0
    assert r.sweep(10.0) == [] and r.earliest_expiry() == 50.0
    assert r.sweep(49.0) == [] and r.earliest_expiry() == 50.0 and len(r) == 1
    assert r.sweep(50.0) == [b"x" * 16] and not r and r.earliest_expiry() == float("inf")


def test_route_table_arrival_classifies_like_the_entry_readers() -> None:
    r = RouteTable()
    r.set_first(b"x", 5, 50.0, "a", 3)
    e = r[b"x"]
    assert r.arrival(e, 6, "b", 1, 2) is Arrival.NEWER
    assert r.arrival(e, 4, "b", 1, 2) is Arrival.STALE
    assert r.arrival(e, 5, "a", 1, 2) is Arrival.REPLAYED  # already a next hop, however close
    assert r.arrival(e, 5, "b", 2, 2) is Arrival.FEASIBLE  # hops 2 < feasibility distance 3, room for 2
    assert r.arrival(e, 5, "b", 3, 2) is Arrival.DUPLICATE  # not strictly closer
    assert r.arrival(e, 5, "b", 2, 1) is Arrival.DUPLICATE  # no room
    assert r.next_hops_of(b"x") == ("a",) and r.next_hops_of(b"nope") == ()
    r.originate(b"h", 1, 10.0)
    assert r.next_hops_of(b"h") == ()


@pytest.mark.parametrize("webpush", [None, WebPushMeta(b"e" * 16, b"t" * 16, 60, Urgency.HIGH,
                                                       ContentEncoding.AES128GCM, "topic")])
def test_readdress_and_make_send_build_what_the_classes_build(webpush: WebPushMeta | None) -> None:
    reg = Registration(b"k" * 32, 1, 0, 100, b"s" * 64)
    push = Push(b"p" * 16, reg.route_id, b"t" * 16, b"c" * 64, 20, 2, 1, 3, reg, webpush)
    got = readdress(push, 7, 9, 4, 0)
    want = Push(b"p" * 16, reg.route_id, b"t" * 16, b"c" * 64, 7, 9, 4, 0, reg, webpush)
    assert type(got) is Push and got == want and hash(got) == hash(want)
    assert dataclasses.astuple(got) == dataclasses.astuple(want)  # every field, also those not compared
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.ttl = 1  # type: ignore[misc]
    s = make_send("b", got, 0.5)
    assert type(s) is Send and s == Send("b", got, 0.5)


Table = type[RouteTable | CompactRouteTable]


def _model_table(seed: int, slots: int, ops: int, cls: Table = CompactRouteTable) -> None:
    """A route table (the compact one by default) against a dict of flat tuples (the old table) under
    random operations: the same entries, lookups, insertion order, expiry lists, purges and evictions."""
    rng = random.Random(seed)
    rids = [rng.randbytes(16) for _ in range(300)] + [b"short", b""]
    peers = [f"p{i}" for i in range(9)]
    table, model = cls(), {}  # type: ignore[var-annotated]
    for _ in range(ops):
        rid, peer = rng.choice(rids), rng.choice(peers)
        op = rng.randrange(10)
        entry = model.get(rid)
        if op < 3:
            expires = float(rng.randrange(1, 100))
            table.set_first(rid, rng.randrange(2**32), expires, peer, rng.randrange(1, 34))
            model[rid] = (table[rid][0], expires, table[rid][2], peer, table[rid][2])
        elif op == 3:
            table.originate(rid, 7, 50.0)
            model[rid] = (7, 50.0, 0)
        elif op == 4 and entry is not None and len(entry) < 3 + 2 * slots and peer not in entry:
            table.add_backup(rid, entry, peer, 3)
            model[rid] = (*entry, peer, 3)
        elif op == 5 and entry is not None and len(entry) > 3:
            victim = rng.choice(entry[3::2])
            table.drop_next_hop(rid, entry, victim)
            i = entry.index(victim)
            model[rid] = entry[:i] + entry[i + 2:]
        elif op == 6:
            assert table.pop(rid, None) == model.pop(rid, None)
        elif op == 7 and rng.random() < 0.1:
            changed = sum(1 for e in model.values() if peer in e)
            for r, e in list(model.items()):
                if peer in e:
                    i = e.index(peer)
                    rest = e[3:i] + e[i + 2:]
                    model[r] = (e[0], e[1], min(rest[1::2]) if rest else UNKNOWN_DISTANCE, *rest)
            assert table.purge(peer) == changed
        elif op == 8 and rng.random() < 0.05:
            now = float(rng.randrange(100))
            gone = [r for r, e in model.items() if e[1] <= now]
            for r in gone:
                del model[r]
            assert table.expire(now) == gone
            assert table.earliest_expiry() == min((e[1] for e in model.values()), default=float("inf"))
        elif op == 9 and rng.random() < 0.05 and model:
            victim = min(model, key=lambda r: model[r][1])
            del model[victim]
            assert table.evict_first_expiring() == victim
        elif op == 9 and rng.random() < 0.05 and model:  # a batch: the earliest expiries, oldest of equals first
            victims = sorted(model, key=lambda r: model[r][1])[:rng.randrange(1, 40)]
            for r in victims:
                del model[r]
            assert table.evict_earliest(len(victims)) == victims
        assert table.get(rid) == model.get(rid) and table.next_hops_of(rid) == (model[rid][3::2] if rid in model
                                                                                   else ())
    assert len(table) == len(model) and list(table.items()) == list(model.items())
    learned = [(r, e) for r, e in model.items() if len(e) > 3 and e[2] > 0]  # a snapshot's rows
    assert sorted(table.export_rows(5.0)) == sorted(
        (r, e[0], e[1] + 5.0, tuple(zip(e[3::2], e[4::2], strict=True))) for r, e in learned)
    assert table.routed_count() == sum(1 for e in model.values() if len(e) > 3)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("cls", [CompactRouteTable, RouteTable])
def test_route_table_matches_a_dict_of_tuples(seed: int, cls: type[RouteTable | CompactRouteTable]) -> None:
    _model_table(seed, 2, 6000, cls)


def test_route_table_takes_more_next_hops_than_its_records_hold() -> None:
    r = CompactRouteTable()
    rid = bytes(range(16))
    r.set_first(rid, 1, 9.0, "a", 5)
    for peer, hops in (("b", 4), ("c", 3), ("d", 2)):
        r.add_backup(rid, r[rid], peer, hops)  # past 2 slots: every record is re-encoded wider
    assert r.vector(r[rid]) == [("a", 5), ("b", 4), ("c", 3), ("d", 2)] and r.next_hops_of(rid) == ("a", "b", "c", "d")
    _model_table(4, 4, 3000)


def test_route_table_grows_its_buckets_and_finds_every_route() -> None:
    r = CompactRouteTable()
    rids = [bytes([i % 256, i // 256]) * 8 for i in range(5000)]  # similar ids, shared byte runs
    for i, rid in enumerate(rids):
        r.set_first(rid, i, 100.0 + i, str(i % 7), 1 + i % 30)
    assert len(r) == 5000 and all(r.epoch(r[rid]) == i for i, rid in enumerate(rids))
    assert r.get(b"\xff" * 16) is None and r.keys() == rids


@pytest.mark.parametrize("cls", [CompactRouteTable, RouteTable])
def test_export_chunks_give_the_routes_of_the_call_while_the_table_changes_between_chunks(cls: Table) -> None:
    """A relay's snapshot reads its routes in chunks and serves pushes between them: routes added,
    widened (more next hops than a record holds: every bucket rebuilt), dropped or grown past a bucket
    doubling meanwhile must not break the read-out or repeat a route, and every route untouched since
    the call comes out once, as it was."""
    rng = random.Random(7)
    table = cls()
    rids = [rng.randbytes(16) for _ in range(3000)]
    for i, rid in enumerate(rids):
        if i % 10 == 0:
            table.originate(rid, 1, 50.0)  # homed here: not exported
        else:
            table.set_first(rid, i, 100.0 + i, f"p{i % 5}", 1 + i % 7)
            if i % 3 == 0:
                table.add_backup(rid, table[rid], f"p{(i + 1) % 5}", 2 + i % 7)
    want = {r[0]: r for r in table.export_rows(1.0)}
    assert len(want) == 2700
    chunks = table.export_chunks(1.0, 100)
    got = list(next(chunks))
    touched = set()
    for rid in rids[1:200]:  # dropped
        table.pop(rid, None)
        touched.add(rid)
    wide = rids[201]
    for peer, hops in (("q1", 5), ("q2", 4), ("q3", 3)):  # past 2 next hops: every record re-encoded
        table.add_backup(wide, table[wide], peer, hops)
    touched.add(wide)
    for _ in range(6000):  # past the bucket count's next doubling
        table.set_first(rng.randbytes(16), 1, 500.0, "p9", 2)
    for chunk in chunks:
        got += chunk
    rows = {r[0]: r for r in got}
    assert len(rows) == len(got)  # no route twice
    assert {r: row for r, row in rows.items() if r in want and r not in touched} == {
        r: row for r, row in want.items() if r not in touched}
