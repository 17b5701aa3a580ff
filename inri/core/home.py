"""In-memory HomeStore: the home relay's registrations, tokens, spends and mailboxes.

Used by the simulator and the tests; the daemon has the same contract on SQLite (inri.node.store).
Both keep their receipt keys in a `ReceiptKeyring` (rule F5c), so they sign alike.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Container

from nacl.signing import SigningKey

from inri.core.budget import KeyedBuckets
from inri.protocol.messages import Push, ReceiptStatus, Registration, WebPushMeta
from inri.protocol.webpush import EndpointToken, TokenVersion, capability, push_tag, vapid_key_hash

# Per-endpoint limit at the home relay (config [webpush] endpoint_rate_per_s / endpoint_burst in the daemon).
ENDPOINT_RATE_PER_S = 1.0
ENDPOINT_BURST = 20
# A TTL 0 message stored for an open stream is kept this long for the device's ack.
TTL0_GRACE_S = 60


# Rule F5c: a superseded receipt key is kept this long after the registration that carried it expired.
# Pushes in custody are re-sent with their registration until their custody deadline (300 s by default,
# counted from acceptance), so one accepted just before the registration expired still reaches the home
# after it; an hour covers any custody deadline a relay is likely to be configured with.
RECEIPT_KEY_GRACE_S = 3600.0
# Rule F5c: superseded receipt keys kept per route id, the earliest-expiring dropped first. A device that
# rotates its receipt key at every refresh has this many credentials in the wild whose pushes are still
# answered (older ones get `not home`); it bounds what one device can make its home store.
SUPERSEDED_KEYS_MAX = 8


# Rule F5c: `until` of a superseded key its device had Web Push endpoints for when it rotated: held while the
# device stays registered. An endpoint URL embeds the registration it was minted under and outlives it
# (rule C1b: a browser keeps a subscription for months and cannot be told of a new URL), so a push to a
# URL from before the rotation must still be answered under that registration's key.
WHILE_REGISTERED = float("inf")


class ReceiptKeyring:
    """Rule F5c: the receipt keys a home holds, per route id: the current registration's, and each
    superseded one until RECEIPT_KEY_GRACE_S after its registration expired, or while the device stays
    registered when it had Web Push endpoints at the rotation (WHILE_REGISTERED); at most
    SUPERSEDED_KEYS_MAX, the earliest to expire (then the earliest superseded) dropped first.

    A push carries the registration its credential was made with; its receipt must verify under that
    registration's receipt key at every relay on the way back (rule F5). A home that signed with the key
    it holds now would have every push made with a credential from before a rotation answered with a
    receipt the path refuses as forged, and the home scored down and cut for it. Both home stores
    (MemoryHomeStore, the daemon's Store) keep their keys here, so they answer alike; the daemon's
    Store also writes them to disk. Times are wall-clock seconds (registrations' issued_at/expires_at).
    """

    __slots__ = ("_keys", "_current")

    def __init__(self) -> None:
        # route id -> public receipt key -> (signing key, until when it is held), the current key and then
        # the superseded ones in the order they were superseded
        self._keys: dict[bytes, dict[bytes, tuple[SigningKey, float]]] = {}
        self._current: dict[bytes, bytes] = {}  # route id -> its current public receipt key

    def held(self, route_id: bytes) -> Container[bytes]:
        """The public receipt keys held for route_id (empty: none)."""
        return self._keys.get(route_id, {})

    def install(self, route_id: bytes, secret: bytes, superseded_until: float | None, now: float) -> None:
        """The device handed over `secret` (a receipt key seed): it signs from now on. The key it replaces,
        if another, is kept until superseded_until (its registration's expiry: RECEIPT_KEY_GRACE_S is added
        here; WHILE_REGISTERED: until `forget`), or dropped when that is None; keys held past their time
        are dropped (now: wall clock)."""
        key = SigningKey(secret)
        pub = bytes(key.verify_key)
        keys = self._keys.setdefault(route_id, {})
        old = self._current.get(route_id)
        if old is not None and old != pub:
            signer, _ = keys.pop(old)
            if superseded_until is not None:
                keys[old] = (signer, superseded_until + RECEIPT_KEY_GRACE_S)
        keys[pub] = (key, float("inf"))
        self._current[route_id] = pub
        self._prune(route_id, now)

    def keep(self, route_id: bytes, secret: bytes, until: float, now: float) -> None:
        """Hold `secret` as a superseded key of route_id until `until` (already including its grace): a key
        read back from disk, or one handed over with an older registration than the current one."""
        key = SigningKey(secret)
        pub = bytes(key.verify_key)
        keys = self._keys.setdefault(route_id, {})
        if pub not in keys:
            keys[pub] = (key, until)
            self._prune(route_id, now)

    def _prune(self, route_id: bytes, now: float) -> None:
        keys = self._keys[route_id]
        current = self._current.get(route_id)
        old = sorted((until, i, pub) for i, (pub, (_, until)) in enumerate(keys.items()) if pub != current)
        drop = [pub for until, _, pub in old if until < now]
        live = len(old) - len(drop)
        drop += [pub for _, _, pub in old[len(drop):len(drop) + max(0, live - SUPERSEDED_KEYS_MAX)]]
        for pub in drop:
            del keys[pub]
        if not keys:
            del self._keys[route_id]

    def prune(self, now: float) -> None:
        """Drop every superseded key held past its time (wall clock)."""
        for rid in list(self._keys):
            self._prune(rid, now)

    def superseded(self, route_id: bytes) -> list[tuple[bytes, float]]:
        """(seed, until) of each superseded key of route_id, in the order they were superseded (what the
        daemon's Store writes to disk, and reads back in that order with `keep`)."""
        current = self._current.get(route_id)
        return [(bytes(signer), until) for pub, (signer, until) in self._keys.get(route_id, {}).items()
                if pub != current]

    def forget(self, route_id: bytes) -> None:
        """Drop every key of route_id (its device unregistered)."""
        self._keys.pop(route_id, None)
        self._current.pop(route_id, None)

    def sign(self, route_id: bytes, message: bytes, receipt_key: bytes | None) -> bytes | None:
        """See `inri.core.api.HomeStore.sign_receipt`."""
        if receipt_key is None:
            receipt_key = self._current.get(route_id)
            if receipt_key is None:
                return None
        got = self._keys.get(route_id, {}).get(receipt_key)
        return None if got is None else got[0].sign(message).signature


def tag_ok(home_key: bytes, push: Push, meta: WebPushMeta, vapid_key: bytes | None) -> bool:
    """True when the push's tag proves its sender knew the endpoint's capability (constant time).

    Either token version's (inri/protocol/webpush.py), the current one first: each has its own capability
    and tag, so neither passes for the other."""
    hashed = vapid_key_hash(vapid_key)
    return any(hmac.compare_digest(meta.tag, push_tag(
        capability(home_key, push.route_id, meta.endpoint_id, version), push.push_id, push.ciphertext, meta.ttl_s,
        meta.urgency, meta.encoding, meta.topic, hashed, version)) for version in (TokenVersion.V2, TokenVersion.V1))


class MemoryHomeStore:
    """Tokens are one-use: spent once, by one push id; the same push id again gets DUPLICATE."""

    def __init__(self, mailbox_max: int = 1000, home_key: bytes | None = None) -> None:
        self._regs: dict[bytes, Registration] = {}
        self._receipt_keys = ReceiptKeyring()  # the devices' receipt keys, current and superseded (F5c)
        self._tokens: dict[bytes, set[bytes]] = {}  # route id -> unspent tokens
        self._spent: dict[bytes, dict[bytes, bytes]] = {}  # route id -> token -> push id that spent it
        self.mailboxes: dict[bytes, dict[bytes, tuple[bytes, float]]] = {}  # push id -> (ciphertext, t)
        self._mailbox_max = mailbox_max
        # Web Push: the key capabilities derive from, minted endpoints (route id -> endpoint id ->
        # restricting VAPID key), revoked endpoints, route ids that unregistered, open device streams.
        self.home_key = home_key if home_key is not None else os.urandom(32)
        self.endpoints: dict[bytes, dict[bytes, bytes | None]] = {}
        self._revoked: dict[tuple[bytes, bytes], bytes | None] = {}  # -> its VAPID key
        self._gone: set[bytes] = set()
        self.connected: set[bytes] = set()
        self.wp_meta: dict[bytes, tuple[WebPushMeta, float]] = {}  # push id -> (meta, expires_at)
        self._endpoint_buckets = KeyedBuckets(ENDPOINT_RATE_PER_S, ENDPOINT_BURST, clock=lambda: 0.0)

    def add_registration(
        self, registration: Registration, tokens: list[bytes], receipt_secret: bytes | None = None
    ) -> None:
        """Home a registration here (or refresh it) and add tokens for it.

        receipt_secret: the 32-byte seed of the device's receipt key pair (the registration carries its
        public half); this home signs its receipts for the route id with it (rule F5c: a newer
        registration's key becomes the current one and the one it replaces is kept until the registration
        that carried it expires, or while the device stays registered when it has Web Push endpoints; an
        older registration's is kept until its own expires).
        """
        rid = registration.route_id
        old = self._regs.get(rid)
        current = old is None or registration.epoch >= old.epoch
        if receipt_secret is not None:
            if current:
                until = (None if old is None else WHILE_REGISTERED if self.endpoints.get(rid)
                         else old.expires_at)
                self._receipt_keys.install(rid, receipt_secret, until, registration.issued_at)
            else:
                self._receipt_keys.keep(rid, receipt_secret, registration.expires_at + RECEIPT_KEY_GRACE_S,
                                        registration.issued_at)
        if current:
            self._regs[rid] = registration
        self._tokens.setdefault(rid, set()).update(tokens)
        self._spent.setdefault(rid, {})
        self.mailboxes.setdefault(rid, {})

    def remove(self, route_id: bytes) -> None:
        """Unregister: forget everything about the route id (its Web Push endpoints answer GONE)."""
        for table in (self._regs, self._tokens, self._spent, self.mailboxes):
            table.pop(route_id, None)
        if self.endpoints.pop(route_id, None) is not None:
            self._gone.add(route_id)  # its receipt keys stay: GONE receipts are signed too
        else:
            self._receipt_keys.forget(route_id)

    def mint_endpoint(self, route_id: bytes, vapid_key: bytes | None, now: float = 0.0) -> EndpointToken:
        """A new Web Push endpoint of a route id homed here (restricted to vapid_key when given)."""
        eid = os.urandom(16)
        self.endpoints.setdefault(route_id, {})[eid] = vapid_key
        return EndpointToken.mint(self.home_key, route_id, eid, vapid_key)

    def revoke_endpoint(self, route_id: bytes, endpoint_id: bytes) -> bool:
        """Revoke an endpoint: later pushes to it get GONE. False when it is not one of route_id's."""
        eps = self.endpoints.get(route_id, {})
        if endpoint_id not in eps:
            return False
        self._revoked[(route_id, endpoint_id)] = eps.pop(endpoint_id)
        return True

    def accept_webpush(self, push: Push, now: float) -> ReceiptStatus | None:
        """See `inri.core.api.HomeStore.accept_webpush`."""
        meta = push.webpush
        rid = push.route_id
        assert meta is not None
        if rid not in self._regs:
            return ReceiptStatus.GONE if rid in self._gone else None
        box = self.mailboxes[rid]
        if push.push_id in box:
            return ReceiptStatus.DUPLICATE
        eps = self.endpoints.get(rid, {})
        if meta.endpoint_id not in eps:
            key = (rid, meta.endpoint_id)
            if key in self._revoked and tag_ok(self.home_key, push, meta, self._revoked[key]):
                return ReceiptStatus.GONE
            return ReceiptStatus.UNKNOWN_ENDPOINT
        if not tag_ok(self.home_key, push, meta, eps[meta.endpoint_id]):
            return ReceiptStatus.UNKNOWN_ENDPOINT
        self._endpoint_buckets.clock = lambda: now
        if self._endpoint_buckets.take((rid + meta.endpoint_id).hex()):
            return ReceiptStatus.RATE_LIMITED
        remaining = max(0, meta.ttl_s - meta.age_s)  # TTL runs from the entry relay's acceptance
        if remaining == 0 and rid not in self.connected:
            return ReceiptStatus.EXPIRED  # RFC 8030: accepted, dropped (nobody to hand it to now)
        if meta.topic is not None:
            for pid, (old, _exp) in list(self.wp_meta.items()):
                if pid in box and old.endpoint_id == meta.endpoint_id and old.topic == meta.topic:
                    del box[pid], self.wp_meta[pid]
        if len(box) >= self._mailbox_max:
            return ReceiptStatus.MAILBOX_FULL
        box[push.push_id] = (push.ciphertext, now)
        self.wp_meta[push.push_id] = (meta, now + remaining)
        return ReceiptStatus.STORED

    def is_home(self, route_id: bytes) -> bool:
        return route_id in self._regs

    def homed(self) -> list[Registration]:
        """Every registration homed here (a restarted relay originates them again, as the daemon does)."""
        return list(self._regs.values())

    def receipt_keys(self, route_id: bytes) -> Container[bytes] | None:
        """See `inri.core.api.HomeStore.receipt_keys`."""
        if route_id in self._regs or route_id in self._gone:
            return self._receipt_keys.held(route_id)
        return None

    def sign_receipt(self, route_id: bytes, message: bytes, receipt_key: bytes | None) -> bytes | None:
        """See `inri.core.api.HomeStore.sign_receipt`."""
        return self._receipt_keys.sign(route_id, message, receipt_key)

    def accept_push(
        self, route_id: bytes, token: bytes, push_id: bytes, ciphertext: bytes, now: float
    ) -> ReceiptStatus:
        spent = self._spent.get(route_id)
        if spent is None:
            return ReceiptStatus.UNKNOWN_TOKEN
        by = spent.get(token)
        if by is not None:
            return ReceiptStatus.DUPLICATE if by == push_id else ReceiptStatus.SPENT
        unspent = self._tokens[route_id]
        if token not in unspent:
            return ReceiptStatus.UNKNOWN_TOKEN
        box = self.mailboxes[route_id]
        if len(box) >= self._mailbox_max:
            return ReceiptStatus.MAILBOX_FULL
        unspent.discard(token)
        spent[token] = push_id
        box[push_id] = (ciphertext, now)
        return ReceiptStatus.STORED
