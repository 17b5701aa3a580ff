"""Receipt keys across a rotation (issue 43, docs/protocol.md rule F5c): a push made with a credential
from before its device rotated its receipt key, or with a registration the home never held, never gets
an honest relay scored down or cut, in the engine (MiniNet, a hypothesis property over what a sender
may send), in both home stores alike, and in the simulator (stale-sender-1k, reduced)."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import VerifyKey
from typing_extensions import override

from inri.core.api import CustodyStatus
from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import RECEIPT_KEY_GRACE_S, SUPERSEDED_KEYS_MAX, MemoryHomeStore
from inri.core.testing import MiniNet
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key, receipt_signed_bytes, receipts_signed_bytes
from inri.protocol.messages import (
    ContentEncoding,
    Push,
    Receipt,
    ReceiptBatch,
    ReceiptStatus,
    Registration,
    RouteError,
    RouteErrorReason,
    Urgency,
    WebPushMeta,
)
from inri.protocol.webpush import push_tag, vapid_key_hash
from simulations.scenario import load
from simulations.sim import run_scenario

LIFETIME = 3600
T0 = int(time.time())  # the daemon's store reads its keys back at wall-clock time (expired ones dropped)
# Short custody, so that a push answered `not home` settles (at its deadline) within a test's run.
CFG = dataclasses.replace(EngineConfig(), custody_deadline_s=20.0)


class Device:
    """A device's route key and the registrations it signed, each with its own receipt key."""

    def __init__(self) -> None:
        self.key = new_signing_key()
        self.regs: list[tuple[Registration, bytes]] = []  # (registration, receipt key seed)

    def sign(self, epoch: int, issued_at: int, *, with_key: bool = True) -> tuple[Registration, bytes]:
        seed = os.urandom(32)
        reg = make_registration(self.key, epoch, issued_at, LIFETIME, receipt_public_key(seed) if with_key else None)
        return reg, seed

    def rotate(self, issued_at: int = 0) -> tuple[Registration, bytes]:
        """The next epoch with a new receipt key (what docs/api.md "Refresh" lets a device do)."""
        got = self.sign(len(self.regs) + 1, issued_at)
        self.regs.append(got)
        return got


def _home(net: MiniNet, i: int, reg: Registration, seed: bytes, tokens: list[bytes]) -> None:
    net.homes[i].add_registration(reg, tokens, seed)
    net.apply(str(i), net.engines[i].register(reg, net.now))


def _scores_untouched(net: MiniNet) -> None:
    """No relay scored a neighbour down, cut one or refused a receipt."""
    for e in net.engines:
        bad = {k: v for k, v in e.counters.items()
               if k.startswith("score_") or k in ("peer_cut_score", "receipt_refused")}
        assert not bad, (e.relay_id, bad)
        assert all(s >= 0 for s in e.peer_scores().values()), (e.relay_id, e.peer_scores())


def _line(kinds: dict[int, type[Engine]] | None = None) -> tuple[MiniNet, Device]:
    """0 - 1 - 2 - 3, a device homed at 3 that registered with one receipt key and then rotated it (kinds: the
    relays built from a subclass of Engine)."""
    net = MiniNet(4, [(0, 1), (1, 2), (2, 3)], config=CFG, kinds=kinds)
    net.run_until(1.0)
    dev = Device()
    _home(net, 3, *dev.rotate(), [b"a" * 16, b"b" * 16, b"c" * 16])
    net.run_until(2.0)
    _home(net, 3, *dev.rotate(), [b"d" * 16])
    net.run_until(3.0)
    return net, dev


def test_a_push_made_with_the_credential_from_before_a_rotation_is_delivered_under_its_own_key() -> None:
    net, dev = _line()
    old, new = dev.regs[0][0], dev.regs[1][0]
    pids = [net.engines[0].inject_push(reg, tok, b"x", net.now) for reg, tok in
            ((old, b"a" * 16), (old, b"z" * 16), (new, b"b" * 16))]
    for r in pids:
        net.apply("0", r.effects)
    net.run_until(net.now + 3.0)
    assert [net.custody.get(r.push_id or b"") for r in pids] == [
        CustodyStatus.DELIVERED, CustodyStatus.UNKNOWN_TOKEN, CustodyStatus.DELIVERED]
    # Each receipt verifies under the receipt key of the registration its push carried.
    receipts = {m.push_id: m for src, _, m in net.sent if src == "3" and isinstance(m, Receipt)}
    for r, reg in zip(pids, (old, old, new), strict=True):
        got = receipts[r.push_id or b""]
        assert reg.receipt_key is not None and got.signature is not None
        VerifyKey(reg.receipt_key).verify(receipt_signed_bytes(got.push_id, reg.route_id, got.status), got.signature)
    _scores_untouched(net)


def test_a_home_that_batches_receipts_signs_each_batch_under_its_pushes_own_key() -> None:
    """Rule F5b with F5c: one round's pushes of one route made with two credentials get one batch each."""
    net, dev = _line()
    net.engines[3].hold_receipts()
    old, new = dev.regs[0][0], dev.regs[1][0]
    for reg, tok in ((old, b"a" * 16), (old, b"b" * 16), (new, b"c" * 16), (new, b"d" * 16)):
        net.apply("0", net.engines[0].inject_push(reg, tok, b"x", net.now).effects)
    net.run_until(net.now + 0.1)  # at the home, answers held
    assert net.engines[3].receipts_held()
    net.apply("3", net.engines[3].flush_receipts(net.now))
    batches = [m for src, _, m in net.sent if src == "3" and isinstance(m, ReceiptBatch)]
    assert len(batches) == 2
    for b in batches:
        keys = [reg.receipt_key for reg in (old, new) if reg.receipt_key is not None]
        assert sum(_verifies(k, receipts_signed_bytes(b.route_id, b.items), b.signature) for k in keys) == 1
    net.run_until(net.now + 2.0)
    assert sorted(net.custody.values()) == [CustodyStatus.DELIVERED] * 4
    _scores_untouched(net)


def _verifies(key: bytes, msg: bytes, sig: bytes) -> bool:
    try:
        VerifyKey(key).verify(msg, sig)
    except Exception:  # noqa: BLE001 - nacl's BadSignatureError
        return False
    return True


def test_a_registration_the_home_never_held_is_refused_not_home_and_scores_nobody() -> None:
    """The device signs epoch 3 with a receipt key it never hands over: its home answers `not home`, stores
    nothing and spends no token; the custodian keeps retrying along the route (no ring search) and settles
    `unknown_registration` at the deadline; nobody on the path is scored."""
    net, dev = _line()
    ghost, _ = dev.sign(3, 0)
    res = net.engines[0].inject_push(ghost, b"c" * 16, b"x", net.now)
    assert res.push_id is not None
    net.apply("0", res.effects)
    net.run_until(net.now + 5.0)
    assert res.push_id not in net.custody  # unsigned answers settle nothing before the deadline
    errors = [m for _, _, m in net.sent if isinstance(m, RouteError) and m.push_id == res.push_id]
    assert errors and {m.reason for m in errors} == {RouteErrorReason.NOT_HOME}
    assert not any(isinstance(m, Push) and m.push_id == res.push_id and m.ring for _, _, m in net.sent)
    net.run_until(net.now + CFG.custody_deadline_s)
    assert net.custody[res.push_id] == CustodyStatus.UNKNOWN_REGISTRATION
    assert net.homes[3].mailboxes[dev.regs[0][0].route_id] == {}
    # The token it carried was not spent: the current credential pushes with it.
    ok = net.engines[0].inject_push(dev.regs[1][0], b"c" * 16, b"y", net.now)
    net.apply("0", ok.effects)
    net.run_until(net.now + 2.0)
    assert net.custody[ok.push_id or b""] == CustodyStatus.DELIVERED
    _scores_untouched(net)


def test_at_the_home_itself_a_registration_it_never_held_settles_unknown_registration_at_once() -> None:
    net, dev = _line()
    ghost, _ = dev.sign(3, 0)
    res = net.engines[3].inject_push(ghost, b"c" * 16, b"x", net.now)
    net.apply("3", res.effects)
    assert net.custody[res.push_id or b""] == CustodyStatus.UNKNOWN_REGISTRATION


class Swapper(Engine):
    """A hostile relay that swaps the registration of every push it forwards for the device's other one."""

    swap: dict[bytes, Registration] = {}  # route id -> the registration its pushes leave with (set by the test)

    @override
    def _on_push(self, peer: str, msg: Push, now: float) -> list[Any]:
        reg = msg.registration
        if reg is not None and reg.route_id in self.swap and self.swap[reg.route_id] != reg:
            msg = dataclasses.replace(msg, registration=self.swap[reg.route_id])
        return super()._on_push(peer, msg, now)


def test_a_relay_that_swaps_a_pushs_registration_is_the_one_that_pays() -> None:
    """The receipt then verifies under the swapped registration's key (the relays behind the swapper pass
    it), not under the push's own: the relay before the swapper refuses it and scores the swapper, never
    an honest relay."""
    net, dev = _line({1: Swapper})
    swapper = net.engines[1]
    assert isinstance(swapper, Swapper)
    swapper.swap = {dev.regs[0][0].route_id: dev.regs[0][0]}  # current pushes leave it as superseded ones
    res = net.engines[0].inject_push(dev.regs[1][0], b"a" * 16, b"x", net.now)
    net.apply("0", res.effects)
    net.run_until(net.now + 1.0)
    assert net.engines[0].counters.get("score_bad_receipt", 0) >= 1  # the swapper, scored by its upstream
    assert net.engines[0].peer_scores()["1"] < 0
    for i in (2, 3):
        assert not any(k.startswith("score_") for k in net.engines[i].counters), net.engines[i].counters


# -- the property: whatever an unprivileged sender sends --------------------------------------------------

EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (1, 3)]  # a ring of 5 with a chord: two paths to most homes


@st.composite
def sends(draw: st.DrawFn) -> list[tuple[int, str, str, bool]]:
    """Pushes: (entry relay, registration, token, Web Push) for each, up to 12."""
    regs = st.sampled_from(["epoch1", "epoch2", "epoch3", "ghost", "no_key", "tampered", "own", "expired"])
    tokens = st.sampled_from(["issued", "again", "made_up"])
    return draw(st.lists(st.tuples(st.integers(0, 4), regs, tokens, st.booleans()), min_size=1, max_size=12))


@settings(max_examples=100)
@given(home=st.integers(0, 4), rotations=st.integers(0, 2), batched=st.booleans(), plan=sends())
def test_no_sender_can_get_an_honest_relay_scored_down_whatever_it_pushes(
        home: int, rotations: int, batched: bool, plan: list[tuple[int, str, str, bool]]) -> None:
    """A sender holding every credential the device ever handed out (and tokens it made up) and one device
    of its own, which signs registrations it never registers, pushes each at any relay, native or Web
    Push: every push settles with the status its credential calls for, and no relay scores a
    neighbour down, refuses a receipt or cuts a link."""
    net = MiniNet(5, EDGES, config=CFG)
    net.run_until(1.0)
    dev, own = Device(), Device()
    issued = [os.urandom(16) for _ in range(4)]
    _home(net, home, *dev.rotate(), issued)
    for _ in range(rotations):
        net.run_until(net.now + 1.0)
        _home(net, home, *dev.rotate(), [])
    other = (home + 2) % 5
    _home(net, other, *own.rotate(), [b"o" * 16])
    ep = net.homes[home].mint_endpoint(dev.regs[0][0].route_id, None)
    if batched:
        net.engines[home].hold_receipts()
    net.run_until(net.now + 1.0)
    current = len(dev.regs)
    want: dict[bytes, set[CustodyStatus]] = {}
    unused = list(issued)
    for relay, which, tok, webpush in plan:
        reg, expect = _credential(dev, own, which, current, int(net.now))
        token = {"issued": unused.pop() if unused else issued[0], "again": issued[0], "made_up": os.urandom(16)}[tok]
        meta = None
        if webpush:
            token = bytes(16)
            pid = os.urandom(16)
            tag = push_tag(ep.cap, pid, b"x", 60, Urgency.NORMAL, ContentEncoding.AES128GCM, None, vapid_key_hash(None))
            meta = WebPushMeta(ep.endpoint_id, tag if tok != "made_up" else os.urandom(16), 60, Urgency.NORMAL,
                               ContentEncoding.AES128GCM, None)
            res = net.engines[relay].inject_push(reg, token, b"x", net.now, push_id=pid, webpush=meta)
        else:
            res = net.engines[relay].inject_push(reg, token, b"x", net.now)
        net.apply(str(relay), res.effects)
        if res.push_id is None:
            assert which in ("tampered", "expired"), (which, res.reason)
            continue
        if webpush:
            expect = _webpush_expectation(expect, tok, which)
        want[res.push_id] = expect
    for _ in range(40):  # a home that holds receipts flushes once per round (the daemon: per group commit)
        net.run_until(net.now + 1.0)
        if batched:
            net.apply(str(home), net.engines[home].flush_receipts(net.now))
    net.run_until(net.now + CFG.custody_deadline_s)
    for pid, allowed in want.items():
        assert net.custody.get(pid) in allowed, (pid.hex(), net.custody.get(pid), allowed)
    _scores_untouched(net)


def _credential(dev: Device, own: Device, which: str, current: int,
                now: int) -> tuple[Registration, set[CustodyStatus]]:
    """The registration a sender pushes with, and the statuses the push may settle with."""
    held = {CustodyStatus.DELIVERED, CustodyStatus.SPENT, CustodyStatus.UNKNOWN_TOKEN}
    refused = {CustodyStatus.UNKNOWN_REGISTRATION}
    match which:
        case "epoch1" | "epoch2" | "epoch3":
            n = int(which[-1])
            if n <= current:
                return dev.regs[n - 1][0], held
            return dev.sign(n, now)[0], refused  # an epoch the device signed but never registered
        case "ghost":
            return dev.sign(current + 1, now)[0], refused
        case "no_key":  # nobody can judge its receipts: the home's current key signs
            return dev.sign(current + 1, now, with_key=False)[0], held
        case "tampered":
            reg = dev.regs[-1][0]
            return dataclasses.replace(reg, signature=bytes(64)), set()
        case "own":  # the sender's own device, registered at another home
            return own.regs[0][0], held
        case "expired":
            return make_registration(dev.key, current + 1, 0, 1), set()  # expired at t = 1 (virtual clock)
    raise AssertionError(which)


def _webpush_expectation(expect: set[CustodyStatus], tok: str, which: str) -> set[CustodyStatus]:
    if expect == {CustodyStatus.UNKNOWN_REGISTRATION}:
        return expect
    if which == "own":  # an endpoint of another device: no such endpoint at that home
        return {CustodyStatus.UNKNOWN_ENDPOINT}
    if tok == "made_up":  # a forged tag
        return {CustodyStatus.UNKNOWN_ENDPOINT}
    return {CustodyStatus.DELIVERED, CustodyStatus.RATE_LIMITED}


# -- both home stores keep the same keys --------------------------------------------------------------


class Stores:
    """The two HomeStore implementations behind one small interface (the daemon's and the simulator's)."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self.mem = MemoryHomeStore()
        self.sql: Any = None
        if kind == "sqlite":
            from inri.node.store import Store

            self.sql = Store(path)

    @property
    def store(self) -> Any:
        return self.mem if self.sql is None else self.sql

    def add(self, reg: Registration, seed: bytes) -> None:
        if self.sql is None:
            self.mem.add_registration(reg, [b"t" * 16], seed)
        elif self.sql.registration(reg.route_id) is None:
            assert self.sql.add_device(reg, b"d" * 32, [b"t" * 16], 0.0, seed)
        else:
            assert self.sql.refresh_registration(reg, seed)

    def remove(self, rid: bytes) -> None:
        if self.sql is None:
            self.mem.remove(rid)
        else:
            self.sql.remove_device(rid)

    def mint(self, rid: bytes) -> None:
        if self.sql is None:
            self.mem.mint_endpoint(rid, None)
        else:
            self.sql.mint_endpoint(rid, None, 0.0)

    def reopen(self) -> None:
        if self.sql is not None:
            from inri.node.store import Store

            self.sql.close()
            self.sql = Store(self.path)


@pytest.fixture(params=["memory", "sqlite"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    s = Stores(request.param, tmp_path / "s.sqlite3")
    yield s
    if s.sql is not None:
        s.sql.close()


def _signs_with(store: Any, rid: bytes, key: bytes | None) -> bool:
    msg = receipt_signed_bytes(b"p" * 16, rid, ReceiptStatus.STORED)
    sig = store.sign_receipt(rid, msg, key)
    return sig is not None and key is not None and _verifies(key, msg, sig)


def test_both_stores_keep_a_superseded_key_and_sign_under_the_key_asked_for(stores: Stores) -> None:
    dev = Device()
    (r1, s1), (r2, s2) = dev.rotate(T0), dev.rotate(T0 + 10)
    rid = r1.route_id
    assert stores.store.receipt_keys(rid) is None  # not homed here: not this relay's business
    stores.add(r1, s1)
    stores.add(r2, s2)
    stores.reopen()  # the daemon's store reads them back from disk
    keys = stores.store.receipt_keys(rid)
    assert r1.receipt_key in keys and r2.receipt_key in keys
    assert receipt_public_key(os.urandom(32)) not in keys
    assert _signs_with(stores.store, rid, r1.receipt_key) and _signs_with(stores.store, rid, r2.receipt_key)
    msg = receipt_signed_bytes(b"p" * 16, rid, ReceiptStatus.STORED)
    assert _verifies(r2.receipt_key or b"", msg, stores.store.sign_receipt(rid, msg, None))  # None: the current key
    assert stores.store.sign_receipt(rid, msg, receipt_public_key(os.urandom(32))) is None


def test_both_stores_keep_at_most_the_cap_and_drop_keys_whose_registration_expired(stores: Stores) -> None:
    dev = Device()
    regs = [dev.rotate(T0 + i) for i in range(SUPERSEDED_KEYS_MAX + 3)]
    for reg, seed in regs:
        stores.add(reg, seed)
    stores.reopen()
    rid = regs[0][0].route_id
    keys = stores.store.receipt_keys(rid)
    held = [reg for reg, _ in regs if reg.receipt_key in keys]
    assert held == [reg for reg, _ in regs[-(SUPERSEDED_KEYS_MAX + 1):]]  # the newest ones, the current among them
    # Once the registration that carried a superseded key expired (and its grace passed), it goes.
    late, late_seed = dev.sign(len(regs) + 1, regs[0][0].expires_at + int(RECEIPT_KEY_GRACE_S) + 100)
    dev.regs.append((late, late_seed))
    stores.add(late, late_seed)
    if stores.sql is not None:
        stores.sql.prune(late.issued_at)
    stores.reopen()
    keys = stores.store.receipt_keys(rid)
    assert [r for r, _ in dev.regs if r.receipt_key in keys] == [late]


def test_both_stores_keep_an_unregistered_devices_keys_only_while_its_endpoints_answer_gone(stores: Stores) -> None:
    dev, other = Device(), Device()
    for d, mint in ((dev, True), (other, False)):
        r1, s1 = d.rotate(T0)
        r2, s2 = d.rotate(T0 + 10)
        stores.add(r1, s1)
        stores.add(r2, s2)
        if mint:
            stores.mint(r1.route_id)
        stores.remove(r1.route_id)
    stores.reopen()
    gone = stores.store.receipt_keys(dev.regs[0][0].route_id)
    assert gone is not None and all(r.receipt_key in gone for r, _ in dev.regs)
    assert stores.store.receipt_keys(other.regs[0][0].route_id) is None


def test_both_stores_keep_a_superseded_key_while_web_push_endpoints_minted_under_it_may_come(
        stores: Stores) -> None:
    """An endpoint URL outlives its registration (rule C1b): a device with Web Push endpoints when it
    rotates keeps the superseded key while it stays registered; one without loses it with its grace.
    The cap still holds, the earliest superseded dropped first, in the same order after a restart."""
    dev, plain = Device(), Device()
    for d, mint in ((dev, True), (plain, False)):
        reg, seed = d.rotate(T0)
        stores.add(reg, seed)
        if mint:
            stores.mint(reg.route_id)
        stores.add(*d.rotate(T0 + 10))
    late = dev.regs[0][0].expires_at + int(RECEIPT_KEY_GRACE_S) + 100
    for d in (dev, plain):  # a rotation long after the first registration and its grace ran out
        stores.add(*d.rotate(late))
    if stores.sql is not None:
        stores.sql.prune(late)
    stores.reopen()
    kept = stores.store.receipt_keys(dev.regs[0][0].route_id)
    assert [r for r, _ in dev.regs if r.receipt_key in kept] == [r for r, _ in dev.regs]
    assert _signs_with(stores.store, dev.regs[0][0].route_id, dev.regs[0][0].receipt_key)
    dropped = stores.store.receipt_keys(plain.regs[0][0].route_id)
    assert [r for r, _ in plain.regs if r.receipt_key in dropped] == [plain.regs[-1][0]]  # both expired
    for i in range(SUPERSEDED_KEYS_MAX):
        stores.add(*dev.rotate(late + 1 + i))
    stores.reopen()
    kept = stores.store.receipt_keys(dev.regs[0][0].route_id)
    assert [r for r, _ in dev.regs if r.receipt_key in kept] == [r for r, _ in dev.regs[-SUPERSEDED_KEYS_MAX - 1:]]


def test_a_web_push_endpoint_from_before_a_rotation_is_delivered_after_its_registration_expired() -> None:
    """docs/protocol.md rules C1b and F5c: an endpoint minted under registration 1, whose device then
    rotated its receipt key twice, the second time long after registration 1 and its grace expired. A
    push to it entered three hops from the home is accepted (C1b: routes of a newer epoch are live) and
    delivered, its receipt signed under registration 1's key; nobody is scored down."""
    net = MiniNet(4, [(0, 1), (1, 2), (2, 3)], config=CFG)
    dev = Device()
    seed1 = os.urandom(32)
    first = make_registration(dev.key, 1, 0, 100, receipt_public_key(seed1))
    _home(net, 3, first, seed1, [])
    tok = net.homes[3].mint_endpoint(first.route_id, None)
    net.run_until(60)
    seed2 = os.urandom(32)
    _home(net, 3, make_registration(dev.key, 2, 60, 10_000, receipt_public_key(seed2)), seed2, [])
    late = int(first.expires_at + RECEIPT_KEY_GRACE_S + 100)
    net.run_until(late)
    seed3 = os.urandom(32)
    _home(net, 3, make_registration(dev.key, 3, late, 10_000, receipt_public_key(seed3)), seed3, [])
    net.run_until(late + 5)
    pid = os.urandom(16)
    tag = push_tag(tok.cap, pid, b"old url", 60, Urgency.NORMAL, ContentEncoding.AES128GCM, None,
                   vapid_key_hash(None))
    meta = WebPushMeta(tok.endpoint_id, tag, 60, Urgency.NORMAL, ContentEncoding.AES128GCM, None)
    res = net.engines[0].inject_push(first, bytes(16), b"old url", net.now, push_id=pid, webpush=meta)
    net.apply("0", res.effects)
    net.run_until(net.now + 5)
    assert net.custody.get(pid) == CustodyStatus.DELIVERED, net.custody.get(pid)
    got = next(m for src, _, m in net.sent if src == "3" and isinstance(m, Receipt) and m.push_id == pid)
    assert got.signature is not None and _verifies(first.receipt_key or b"", receipt_signed_bytes(
        pid, first.route_id, got.status), got.signature)
    _scores_untouched(net)


def test_a_database_from_before_rule_f5c_opens_and_keeps_rotating(tmp_path: Path) -> None:
    """No schema version change: the new table is created in a database that lacks it."""
    from inri.node.store import SCHEMA_VERSION, Store

    path = tmp_path / "old.sqlite3"
    dev = Device()
    (r1, s1), (r2, s2) = dev.rotate(T0), dev.rotate(T0 + 10)
    store = Store(path)
    assert store.add_device(r1, b"d" * 32, [b"t" * 16], 0.0, s1)
    store.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE superseded_receipt_keys")
    db.commit()
    db.close()
    store = Store(path)
    assert store.refresh_registration(r2, s2)
    store.close()
    store = Store(path)
    keys = store.receipt_keys(r1.route_id)
    assert keys is not None and r1.receipt_key in keys and r2.receipt_key in keys
    assert store._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0] == str(SCHEMA_VERSION)
    store.close()


# -- the simulator ---------------------------------------------------------------------------------------


def test_the_stale_sender_cuts_no_honest_relay_in_the_simulator() -> None:
    """stale-sender-1k reduced to 200 relays: its pushes settle as their credentials call for, no relay is
    scored down, and the honest pushes are all delivered."""
    base = load("stale-sender-1k")
    sc = dataclasses.replace(base, topology=dataclasses.replace(base.topology, relays=200),
                             workload=dataclasses.replace(base.workload, registrations=40, pushes=300),
                             adversaries=(dataclasses.replace(base.adversaries[0], end_s=60.0),), duration_s=110.0)
    s: dict[str, Any] = run_scenario(sc).summary
    assert sum(s["stale_pushes"].values()) > 100
    assert s["cuts_of_honest"] == 0 and s["score_penalties"] == {}, s
    settled = s["stale_settled"]
    assert set(settled["superseded_own"]) == {"delivered"}
    assert set(settled["superseded_seen"]) == {"unknown_token"}
    assert set(settled["unregistered"]) == {"unknown_registration"}
    assert s["stale_pending_at_end"] == 0
    assert s["delivery_ratio"] == 1.0


def test_the_stale_sender_scenario_is_packaged_and_refuses_a_mesh_without_refreshes() -> None:
    from simulations.scenario import ScenarioError, from_dict

    sc = load("stale-sender-1k")
    assert [a.kind for a in sc.adversaries] == ["stale_sender"] and sc.workload.rotate_receipt_keys
    with pytest.raises(ScenarioError, match="refresh_interval_s"):
        from_dict({"name": "x", "adversaries": [{"kind": "stale_sender"}]})

