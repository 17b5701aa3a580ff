"""In-memory HomeStore: the home relay's registrations, tokens, spends and mailboxes.

Used by the simulator and the tests; the daemon has the same contract on SQLite (inri.node.store).
"""

from __future__ import annotations

import hmac
import os

from nacl.signing import SigningKey

from inri.core.budget import KeyedBuckets
from inri.protocol.messages import Push, ReceiptStatus, Registration, WebPushMeta
from inri.protocol.webpush import EndpointToken, TokenVersion, capability, push_tag, vapid_key_hash

# Per-endpoint limit at the home relay (config [webpush] endpoint_rate_per_s / endpoint_burst in the daemon).
ENDPOINT_RATE_PER_S = 1.0
ENDPOINT_BURST = 20
# A TTL 0 message stored for an open stream is kept this long for the device's ack.
TTL0_GRACE_S = 60


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
        self._receipt_keys: dict[bytes, SigningKey] = {}  # route id -> the device's receipt key
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
        public half); this home signs its receipts for the route id with it.
        """
        rid = registration.route_id
        if receipt_secret is not None:
            self._receipt_keys[rid] = SigningKey(receipt_secret)
        old = self._regs.get(rid)
        if old is None or registration.epoch >= old.epoch:
            self._regs[rid] = registration
        self._tokens.setdefault(rid, set()).update(tokens)
        self._spent.setdefault(rid, {})
        self.mailboxes.setdefault(rid, {})

    def remove(self, route_id: bytes) -> None:
        """Unregister: forget everything about the route id (its Web Push endpoints answer GONE)."""
        for table in (self._regs, self._tokens, self._spent, self.mailboxes):
            table.pop(route_id, None)
        if self.endpoints.pop(route_id, None) is not None:
            self._gone.add(route_id)  # its receipt key stays: GONE receipts are signed too
        else:
            self._receipt_keys.pop(route_id, None)

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

    def sign_receipt(self, route_id: bytes, message: bytes) -> bytes | None:
        """See `inri.core.api.HomeStore.sign_receipt`."""
        key = self._receipt_keys.get(route_id)
        return None if key is None else key.sign(message).signature

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
