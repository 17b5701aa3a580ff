"""Web Push on the mesh: the frame, the per-push tag and both home stores (memory and SQLite)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from inri.core.api import InjectOutcome
from inri.core.home import MemoryHomeStore
from inri.core.testing import MiniNet
from inri.node.store import Store
from inri.protocol.codec import decode, encode, make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import ContentEncoding, Push, ReceiptStatus, Urgency, WebPushMeta
from inri.protocol.webpush import EndpointToken, push_tag, vapid_key_hash

REG = make_registration(new_signing_key(b"\x07" * 32), 1, 0, 30 * 24 * 3600)
VAPID = b"\x04" + b"\x11" * 64


def _push(tok: EndpointToken, body: bytes, *, ttl: int = 60, topic: str | None = None,
          vapid: bytes | None = None, forge: bool = False) -> Push:
    pid = os.urandom(16)
    cap = os.urandom(16) if forge else tok.cap
    tag = push_tag(cap, pid, body, ttl, Urgency.NORMAL, ContentEncoding.AES128GCM, topic, vapid_key_hash(vapid))
    meta = WebPushMeta(tok.endpoint_id, tag, ttl, Urgency.NORMAL, ContentEncoding.AES128GCM, topic)
    return Push(pid, REG.route_id, bytes(16), body, 16, 0, 0, 0, REG, meta)


def test_frame_carries_the_meta_and_native_frames_keep_their_bytes() -> None:
    tok = EndpointToken.mint(b"k" * 32, REG.route_id, b"e" * 16, None)
    p = _push(tok, b"body", topic="abc")
    assert decode(encode(p)) == p
    native = Push(b"p" * 16, REG.route_id, b"t" * 16, b"c", 3, 0, 0, 0, None)
    assert encode(native)[0] == 0x9B and decode(encode(native)) == native  # still 2 + 9 elements
    raw = encode(p)
    assert raw[0] == 0x9C  # 2 + 10 elements
    assert b"k" * 32 not in raw and tok.cap not in raw  # never the capability nor the home key


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryHomeStore | Store:
    if request.param == "memory":
        s = MemoryHomeStore()
        s.add_registration(REG, [])
        return s
    st = Store(tmp_path / "s.db")
    st.add_device(REG, b"s" * 32, [], 0.0)
    return st


def _box(store: MemoryHomeStore | Store) -> list[bytes]:
    if isinstance(store, Store):
        return [c for _, c, _ in store.pending(REG.route_id)]
    return [c for c, _ in store.mailboxes[REG.route_id].values()]


def _set_stream(store: MemoryHomeStore | Store, open_: bool) -> None:
    if isinstance(store, Store):
        store.stream_open = lambda rid: open_
    elif open_:
        store.connected.add(REG.route_id)
    else:
        store.connected.discard(REG.route_id)


def test_tag_topic_ttl_revocation_and_unregister(store: MemoryHomeStore | Store) -> None:
    now = time.time()
    tok = store.mint_endpoint(REG.route_id, None, now)
    p = _push(tok, b"one")
    assert store.accept_webpush(p, now) == ReceiptStatus.STORED
    assert store.accept_webpush(p, now) == ReceiptStatus.DUPLICATE
    assert store.accept_webpush(_push(tok, b"x", forge=True), now) == ReceiptStatus.UNKNOWN_ENDPOINT
    other = EndpointToken(os.urandom(16), False, bytes(8), tok.cap)
    assert store.accept_webpush(_push(other, b"x"), now) == ReceiptStatus.UNKNOWN_ENDPOINT
    # Topic: the second push with the same topic replaces the first (unacknowledged) one.
    assert store.accept_webpush(_push(tok, b"t1", topic="news"), now) == ReceiptStatus.STORED
    assert store.accept_webpush(_push(tok, b"t2", topic="news"), now) == ReceiptStatus.STORED
    assert sorted(_box(store)) == [b"one", b"t2"]
    # TTL 0: accepted and dropped while the stream is closed (its receipt says so), stored while it is open.
    assert store.accept_webpush(_push(tok, b"z0", ttl=0), now) == ReceiptStatus.EXPIRED
    assert b"z0" not in _box(store)
    _set_stream(store, True)
    assert store.accept_webpush(_push(tok, b"z1", ttl=0), now) == ReceiptStatus.STORED
    assert b"z1" in _box(store)
    # A restricted endpoint's tag binds the VAPID key.
    rtok = store.mint_endpoint(REG.route_id, VAPID, now)
    assert rtok.restricted
    assert store.accept_webpush(_push(rtok, b"r", vapid=VAPID), now) == ReceiptStatus.STORED
    assert store.accept_webpush(_push(rtok, b"r", vapid=None), now) == ReceiptStatus.UNKNOWN_ENDPOINT
    # Revoked: GONE (only with a genuine tag); unregistered device: GONE.
    assert store.revoke_endpoint(REG.route_id, tok.endpoint_id)
    assert store.accept_webpush(_push(tok, b"late"), now) == ReceiptStatus.GONE
    assert store.accept_webpush(_push(tok, b"late", forge=True), now) == ReceiptStatus.UNKNOWN_ENDPOINT
    if isinstance(store, Store):
        store.remove_device(REG.route_id)
    else:
        store.remove(REG.route_id)
    assert store.accept_webpush(_push(rtok, b"r2", vapid=VAPID), now) == ReceiptStatus.GONE


def test_endpoint_rate_limit_at_home(store: MemoryHomeStore | Store) -> None:
    tok = store.mint_endpoint(REG.route_id, None, 0.0)
    answers = [store.accept_webpush(_push(tok, b"b%d" % i, ttl=3600), time.time()) for i in range(40)]
    assert ReceiptStatus.RATE_LIMITED in answers and answers[0] == ReceiptStatus.STORED


def test_a_web_push_crosses_engines_to_its_home() -> None:
    """Relays on the path route the push on its route id; the home checks the tag and stores it."""
    net = MiniNet(4, [(0, 1), (1, 2), (2, 3)])
    home = net.homes[3]
    home.add_registration(REG, [])
    net.apply("3", net.engines[3].register(REG, net.now))
    net.run_until(net.now + 5)
    tok = home.mint_endpoint(REG.route_id, None)
    p = _push(tok, b"cross")
    res = net.engines[0].inject_push(REG, bytes(16), p.ciphertext, net.now, push_id=p.push_id, webpush=p.webpush)
    net.apply("0", res.effects)
    net.run_until(net.now + 5)
    assert [c for c, _ in home.mailboxes[REG.route_id].values()] == [b"cross"]
    assert net.custody[p.push_id] == "delivered"
    assert any(isinstance(m, Push) and m.webpush == p.webpush for _, to, m in net.sent if to == "3")
    forged = _push(tok, b"forged", forge=True)
    res = net.engines[0].inject_push(REG, bytes(16), b"forged", net.now, push_id=forged.push_id,
                                     webpush=forged.webpush)
    net.apply("0", res.effects)
    net.run_until(net.now + 5)
    assert net.custody[forged.push_id] == "unknown_endpoint"


def test_ttl_runs_from_the_entry_relay_not_from_arrival_at_home() -> None:
    """RFC 8030 5.2: a push that waited in custody while its home was down keeps only the TTL it has left.

    The home expires it at entry time + TTL (not arrival + TTL); the frame carries the custody age."""
    net = MiniNet(4, [(0, 1), (1, 2), (2, 3)])
    home = net.homes[3]
    home.add_registration(REG, [])
    net.apply("3", net.engines[3].register(REG, net.now))
    net.run_until(net.now + 5)
    tok = home.mint_endpoint(REG.route_id, None)
    net.kill(3)
    accepted = net.now
    p = _push(tok, b"late", ttl=600)
    res = net.engines[0].inject_push(REG, bytes(16), p.ciphertext, net.now, push_id=p.push_id, webpush=p.webpush)
    net.apply("0", res.effects)
    net.run_until(net.now + 60)
    assert p.push_id not in home.mailboxes.get(REG.route_id, {})
    net.restart(3)
    net.run_until(net.now + 120)
    assert p.push_id in home.mailboxes[REG.route_id], net.custody.get(p.push_id)
    arrived = home.mailboxes[REG.route_id][p.push_id][1]
    expires = home.wp_meta[p.push_id][1]
    assert arrived - accepted > 60
    assert abs(expires - (accepted + 600)) <= 1.5, (accepted, arrived, expires)
    ages = [m.webpush.age_s for _, to, m in net.sent if isinstance(m, Push) and m.webpush and m.push_id == p.push_id]
    assert ages[0] == 0 and max(ages) >= 60


def test_sqlite_home_stores_the_ttl_left_and_drops_a_push_that_expired_on_the_way(tmp_path: Path) -> None:
    st = Store(tmp_path / "s.db")
    st.add_device(REG, b"s" * 32, [], 0.0)
    tok = st.mint_endpoint(REG.route_id, None, 0.0)
    now = time.time()
    p = _push(tok, b"aged", ttl=600)
    assert p.webpush is not None
    aged = Push(p.push_id, p.route_id, p.token, p.ciphertext, 16, 0, 0, 0, REG,
                WebPushMeta(**{**{f: getattr(p.webpush, f) for f in p.webpush.__slots__}, "age_s": 100}))
    assert decode(encode(aged)) == aged  # the age travels in the frame
    assert st.accept_webpush(aged, now) == ReceiptStatus.STORED
    assert abs(st.webpush_meta(REG.route_id)[p.push_id][4] - (now + 500)) < 1
    q = _push(tok, b"expired", ttl=60)
    assert q.webpush is not None
    late = Push(q.push_id, q.route_id, q.token, q.ciphertext, 16, 0, 0, 0, REG,
                WebPushMeta(**{**{f: getattr(q.webpush, f) for f in q.webpush.__slots__}, "age_s": 61}))
    st.stream_open = lambda rid: False
    assert st.accept_webpush(late, now) == ReceiptStatus.EXPIRED  # accepted, dropped: its TTL ran out on the way
    assert _box(st) == [b"aged"]


def _refresh_net(refresh: bool) -> tuple[MiniNet, EndpointToken, object]:
    """A 4-relay line whose home (relay 3) homes a registration of lifetime 100 s; refresh: the home
    re-signs it (epoch 2) at t = 60 and gossips it. The clock then runs past the first one's expiry."""
    key = new_signing_key(b"\x09" * 32)
    first = make_registration(key, 1, 0, 100)
    net = MiniNet(4, [(0, 1), (1, 2), (2, 3)])
    home = net.homes[3]
    home.add_registration(first, [])
    net.apply("3", net.engines[3].register(first, net.now))
    net.run_until(60)
    if refresh:
        second = make_registration(key, 2, 60, 100)
        home.add_registration(second, [])
        net.apply("3", net.engines[3].register(second, net.now))
    net.run_until(130)  # the first registration expired at 100
    return net, home.mint_endpoint(first.route_id, None), first


def test_an_expired_endpoint_registration_is_accepted_while_its_home_refreshes_the_route() -> None:
    """Rule C1b: the URL's registration (epoch 1) expired; the home re-signed it (epoch 2) and every relay
    holds the newer route: a Web Push push carrying the old one is accepted at the far relay and
    delivered. A native push with the same expired registration is still refused."""
    net, tok, first = _refresh_net(refresh=True)
    assert isinstance(first, type(REG))
    pid = os.urandom(16)
    tag = push_tag(tok.cap, pid, b"late", 60, Urgency.NORMAL, ContentEncoding.AES128GCM, None, vapid_key_hash(None))
    meta = WebPushMeta(tok.endpoint_id, tag, 60, Urgency.NORMAL, ContentEncoding.AES128GCM, None)
    res = net.engines[0].inject_push(first, bytes(16), b"late", net.now, push_id=pid, webpush=meta)
    assert res.outcome == InjectOutcome.ACCEPTED, res.reason
    net.apply("0", res.effects)
    net.run_until(net.now + 5)
    assert net.custody[pid] == "delivered"
    native = net.engines[0].inject_push(first, bytes(16), b"native", net.now)
    assert native.outcome == InjectOutcome.BAD_REGISTRATION


def test_an_expired_endpoint_registration_without_a_refresh_is_refused_without_a_search() -> None:
    net, tok, first = _refresh_net(refresh=False)
    assert isinstance(first, type(REG))
    sent = len(net.sent)
    pid = os.urandom(16)
    tag = push_tag(tok.cap, pid, b"gone", 60, Urgency.NORMAL, ContentEncoding.AES128GCM, None, vapid_key_hash(None))
    meta = WebPushMeta(tok.endpoint_id, tag, 60, Urgency.NORMAL, ContentEncoding.AES128GCM, None)
    res = net.engines[0].inject_push(first, bytes(16), b"gone", net.now, push_id=pid, webpush=meta)
    assert res.outcome == InjectOutcome.BAD_REGISTRATION and not res.effects
    net.run_until(net.now + 5)
    assert not [m for _, _, m in net.sent[sent:] if isinstance(m, Push)]


def test_a_web_push_copy_arriving_after_its_ack_topic_replacement_or_expiry_is_a_duplicate(tmp_path: Path) -> None:
    """A custodian re-sends a push whose receipt it did not get (or a backup holder adopts it, rule C8):
    the home must answer `duplicate` also after the message left the mailbox, across a restart, for as long
    as a copy can still come (WP_DEDUP_MIN_S, or the TTL's end); then the record goes."""
    from inri.node.store import WP_DEDUP_MIN_S
    path = tmp_path / "s.db"
    st = Store(path)
    st.add_device(REG, b"s" * 32, [], 0.0)
    st.stream_open = lambda rid: True  # the device streams: even a TTL-0 copy would be stored
    now = time.time()
    tok = st.mint_endpoint(REG.route_id, None, now)
    acked, long_ttl = _push(tok, b"acked", ttl=0), _push(tok, b"long", ttl=2 * int(WP_DEDUP_MIN_S))
    old, new = _push(tok, b"old", topic="t", ttl=3600), _push(tok, b"new", topic="t", ttl=3600)
    expiring = _push(tok, b"expiring", ttl=5)
    for p in (acked, long_ttl, old, new, expiring):
        assert st.accept_webpush(p, now) == ReceiptStatus.STORED
    assert sorted(_box(st)) == [b"acked", b"expiring", b"long", b"new"]
    assert st.ack(REG.route_id, [acked.push_id, long_ttl.push_id]) == 2
    st.prune(now + 10)  # `expiring` ran out (TTL 5 s + the TTL-0 grace is 60 s: not yet)
    assert sorted(_box(st)) == [b"expiring", b"new"]
    st.prune(now + 61)
    assert _box(st) == [b"new"] and st.mailbox_size(REG.route_id) == 1  # the expired one no longer counts
    st.close()
    st = Store(path)  # a restart keeps the record
    st.stream_open = lambda rid: True
    for p in (acked, long_ttl, old, expiring):
        assert st.accept_webpush(p, now + 62) == ReceiptStatus.DUPLICATE, p.ciphertext
    assert _box(st) == [b"new"]  # the late copy of `old` did not replace `new`
    st.prune(now + WP_DEDUP_MIN_S + 120)  # past the window: only the long TTL's record stays
    assert st.accept_webpush(long_ttl, now + WP_DEDUP_MIN_S + 120) == ReceiptStatus.DUPLICATE
    assert st.accept_webpush(acked, now + WP_DEDUP_MIN_S + 120) == ReceiptStatus.STORED
    st.close()
