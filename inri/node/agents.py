"""The relay's side of Mozilla Push user agents (the `AgentBackend` of inri/node/mozpush.py).

Each channel of a user agent is an INRI registration homed at this relay: the relay makes its route key
(one per channel, the private default, as the SDK does per app subscription) and its receipt key, signs
its registration, homes it like any device (RelayService.register_device: the mesh learns its route id)
and mints its Web Push endpoint with the store's minting function (the one `POST /v1/devices/{id}/
endpoints` uses), restricted to the channel's VAPID key when one was given. Pushes enter at any relay
and cross the mesh with custody; at home they land in the channel's mailbox like any Web Push message.

Endpoint lifetime (docs/browsers.md): the endpoint URL embeds the registration it was minted under,
which expires after `registration_lifetime_s` (at most 30 days), and a browser cannot be told of a new
URL. So the relay re-signs each channel's registration (same route key, next epoch) when two thirds of
its lifetime have passed; the gossip of each new epoch keeps the route live at every relay, and an entry
relay accepts a push under the URL's expired registration while it holds such a live newer route (rule
C1b, inri/core/custody.py). An agent not seen for `agent_idle_max_s` (60 days, as autopush drops a
user agent) loses its channels: senders then get 410.

Wake hooks (rule MP7, docs/browsers.md "Waking a phone"): an agent may register one wake hook on its
connection, kept by the relay's WakeHooks (inri/node/wake.py) under (OwnerKind.UAID, uaid). This module
wires that kind in: a channel's route id resolves to its agent, the agent is live while its WebSocket is
bound (MozPushServer.by_uaid, through `connected`) and has mail while unexpired messages wait. Deliveries
and acks reach the hooks as every device's do (the service's Delivered effect, RelayService.ack); the
close of an agent's connection comes through `disconnected`. An agent that sets a hook is saved (a uaid is
otherwise saved with its first channel), and its hook goes when the agent is dropped as idle.

Order of writes (crash safety): a new channel's row (with its route key) is saved first, then its device,
then its endpoint; a register retried after a crash finishes what is missing. Unregister removes the
device first (senders get 410 at once), then the row. A hook is saved before its agent's row. Rows left
without a device, and hooks left without an agent, are removed at start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
import trio
from cryptography.hazmat.primitives.asymmetric import ec
from nacl.signing import SigningKey

from inri.node.agentstore import AgentStore, Channel
from inri.node.mozpush import Limits, Notification, RegisterRefused, TooManyChannels, WakeHookRefused
from inri.node.ratelimit import RateLimiter
from inri.node.service import RegistrationError, RelayService
from inri.node.wake import HookError
from inri.node.wakepolicy import Owner, OwnerKind
from inri.protocol import limits
from inri.protocol.codec import make_registration
from inri.protocol.keys import route_id_for
from inri.protocol.messages import ContentEncoding, Registration
from inri.protocol.webpush import EndpointToken

log = structlog.get_logger("inri.agents")

CLOCK_SKEW_S = 60  # registrations are issued a minute early (relays' clocks differ), as the SDK does
REFRESH_AT = 2 / 3  # a channel's registration is re-signed when this share of its lifetime has passed
REFRESH_BATCH = 500  # registrations re-signed per turn of the refresh loop (then it yields)
SWEEP_INTERVAL_S = 3600.0  # the loop looks for idle agents at least this often

# (route id, endpoint token, VAPID key) -> the endpoint's signed URL (inri.node.webpush.endpoint_url, so every
# URL of this relay is built in one place).
EndpointUrl = Callable[[bytes, EndpointToken, bytes | None], str]


class Agents:
    """User agents homed here (see the module docstring); implements mozpush.AgentBackend."""

    def __init__(self, service: RelayService, endpoint_url: EndpointUrl, *, session_limits: Limits,
                 registration_lifetime_s: int = limits.MAX_LIFETIME_S - CLOCK_SKEW_S,
                 agent_idle_max_s: float = 60 * 86400.0, register_rate: RateLimiter | None = None) -> None:
        self.service = service
        self.store = service.store
        self.agents = AgentStore(service.store)
        self.endpoint_url = endpoint_url
        self.session_limits = session_limits
        self.lifetime_s = registration_lifetime_s
        self.idle_max_s = agent_idle_max_s
        self.register_rate = register_rate
        self.counts: dict[str, int] = {}  # inri_mozpush_* counters
        self.connected: Callable[[bytes], bool] = lambda uaid: False  # the WebSocket side sets it
        self._wake = trio.Event()  # set when a channel is added: the loop looks at its refresh time
        hooks = service.wake
        hooks.resolvers.insert(0, self._hook_owner)  # first: the device resolver claims every route id
        hooks.live[OwnerKind.UAID] = lambda uaid: self.connected(uaid)
        hooks.waiting[OwnerKind.UAID] = self.has_mail

    def _count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def _now(self) -> float:
        return self.service.wall_clock()

    # -- AgentBackend -----------------------------------------------------------------------------

    def channels(self, uaid: bytes) -> list[bytes] | None:
        if not self.agents.known(uaid, self._now()):
            return None
        return self.agents.route_ids(uaid)

    def register(self, uaid: bytes, channel_id: bytes, key: bytes | None, client: str) -> tuple[str, bytes]:
        if key is not None:
            if len(key) != 65 or key[0] != 4:
                raise RegisterRefused(400, "key: expected an uncompressed P-256 point (65 bytes, 0x04...)")
            try:
                ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), key)
            except ValueError:
                raise RegisterRefused(400, "key: not a point on P-256") from None
        ch = self.agents.channel(uaid, channel_id)
        if ch is None:
            # A new channel is a registration gossiped to the whole mesh: limited per client address.
            if self.register_rate is not None and self.register_rate.take(client):
                raise RegisterRefused(429, "too many registrations from this address; retry later")
            if self.agents.channel_count(uaid) >= self.session_limits.channels_max:
                raise TooManyChannels
            route_key = SigningKey.generate()
            ch = Channel(uaid, channel_id, route_id_for(bytes(route_key.verify_key)), bytes(route_key), None)
            now = self._now()
            self.agents.add_channel(ch, now, now + self.lifetime_s * REFRESH_AT)
            self._wake.set()
            self._count("channels_registered")
        rid = ch.route_id
        if self.store.registration(rid) is None:
            receipt = SigningKey.generate()
            try:
                self.service.register_device(self._sign(ch.route_key, 1, None, bytes(receipt.verify_key)), 0,
                                             bytes(receipt))
            except RegistrationError as exc:  # cannot happen with a fresh route key: said, not hidden
                raise RegisterRefused(500, f"registration refused: {exc.detail}") from None
        if ch.endpoint_id is None:
            tok = self.store.mint_endpoint(rid, key, self._now())
            self.agents.set_endpoint(rid, tok.endpoint_id)
        else:
            live = [(t, k) for t, k in self.store.endpoints(rid) if t.endpoint_id == ch.endpoint_id]
            if not live:
                raise RegisterRefused(410, "this channel was unregistered")
            tok, given = live[0]
            if given != key:
                raise RegisterRefused(409, "this channelID is registered with another key")
        return self.endpoint_url(rid, tok, key), rid

    def unregister(self, uaid: bytes, channel_id: bytes) -> bytes | None:
        rid = self.agents.route_of(uaid, channel_id)
        if rid is None:
            return None
        self.service.unregister(rid)  # its endpoint answers 410 from now on
        self.agents.remove_channel(rid)
        self._count("channels_unregistered")
        return rid

    def pending(self, uaid: bytes, limit: int) -> list[Notification]:
        rows = self.agents.pending(uaid, self._now(), limit)
        return [Notification(c, p, b, ContentEncoding(e)) for c, p, b, e in rows]

    def ack(self, uaid: bytes, channel_id: bytes, version: bytes, code: int | None) -> bool:
        rid = self.agents.route_of(uaid, channel_id)
        deleted = 0 if rid is None else self.service.ack(rid, [version])
        self._count(f"acks_{code if code in (100, 101, 102) else 'other'}")
        return deleted > 0

    def nack(self, uaid: bytes, version: bytes, code: int | None) -> None:
        self._count(f"nacks_{code if code in (301, 302, 303) else 'other'}")
        log.info("nack", version=version.hex(), code=code)

    def wake_hook(self, uaid: bytes) -> tuple[str, float] | None:
        hook = self.service.wake.hook(Owner(OwnerKind.UAID, uaid))
        return None if hook is None else (hook.url, hook.created)

    def set_wake_hook(self, uaid: bytes, url: object, token: bytes, client: str) -> tuple[str, float]:
        self._limit_hooks(client)
        now = self._now()
        try:
            hook = self.service.wake.set_hook(Owner(OwnerKind.UAID, uaid), url, token, now)
        except HookError as exc:  # the device API's 422, with the same codes
            raise WakeHookRefused(422, exc.code, exc.detail) from None
        self.agents.add_agent(uaid, now)  # the hook is its uaid's reason to be kept (MP1 saves none without)
        return hook.url, hook.created

    def remove_wake_hook(self, uaid: bytes, client: str) -> None:
        self._limit_hooks(client)
        self.service.wake.remove_hook(Owner(OwnerKind.UAID, uaid))

    def _limit_hooks(self, client: str) -> None:
        # Each change is a store write: limited per client address, as the device API's PUT/DELETE .../wake.
        if self.register_rate is not None and self.register_rate.take(client):
            raise WakeHookRefused(429, "rate_limited", "too many wake hook changes from this address; retry later")

    # -- what the wake hooks ask (inri/node/wake.py) ------------------------------------------------

    def _hook_owner(self, route_id: bytes) -> Owner | None:
        """The hook owner of a channel's route id: its agent; None for any other route id (and no query
        while no agent has a hook)."""
        if not self.service.wake.has_hooks(OwnerKind.UAID):
            return None
        uaid = self.agents.agent_of(route_id)
        return None if uaid is None else Owner(OwnerKind.UAID, uaid)

    def has_mail(self, uaid: bytes) -> bool:
        """True while the agent has stored, unexpired messages (acknowledged ones are deleted)."""
        return self.agents.has_mail(uaid, self._now())

    def disconnected(self, uaid: bytes) -> None:
        """The agent's connection closed: its idle time counts from now, and mail it left wakes it."""
        self.agents.seen(uaid, self._now())
        self.service.wake.disconnected(Owner(OwnerKind.UAID, uaid))

    def status(self) -> dict[str, Any]:
        agents, channels = self.agents.counts()
        return {"agents": agents, "channels": channels}

    # -- registrations ----------------------------------------------------------------------------

    def _sign(self, seed: bytes, epoch: int, old: Registration | None, receipt_key: bytes | None) -> Registration:
        issued = int(self._now()) - CLOCK_SKEW_S
        return make_registration(SigningKey(seed), epoch, issued, self.lifetime_s + CLOCK_SKEW_S,
                                 receipt_key if old is None else old.receipt_key)

    def refresh_due(self) -> int:
        """Re-sign the registrations due (a batch); returns how many."""
        now = self._now()
        done = 0
        for ch in self.agents.due(now, REFRESH_BATCH):
            old = self.store.registration(ch.route_id)
            if old is None:  # its device is gone (unregistered meanwhile): so is the channel
                self.agents.remove_channel(ch.route_id)
                continue
            try:
                self.service.refresh_registration(self._sign(ch.route_key, old.epoch + 1, old, None))
            except RegistrationError as exc:
                log.error("channel registration not re-signed", route=ch.route_id.hex(), error=exc.detail)
                self.agents.set_refresh(ch.route_id, now + SWEEP_INTERVAL_S)
                continue
            self.agents.set_refresh(ch.route_id, now + self.lifetime_s * REFRESH_AT)
            done += 1
        self._count("registrations_refreshed", done)
        return done

    def drop_idle(self) -> int:
        """Remove agents not seen for agent_idle_max_s (and not connected now); returns how many."""
        gone = 0
        for uaid in self.agents.idle(self._now() - self.idle_max_s):
            if self.connected(uaid):
                continue
            for rid in self.agents.route_ids(uaid):
                self.service.unregister(rid)
            self.agents.remove_agent(uaid)
            self.service.wake.remove_hook(Owner(OwnerKind.UAID, uaid))
            gone += 1
        self._count("agents_expired", gone)
        return gone

    def remove_orphans(self) -> int:
        """Channel rows whose device is gone (a crash inside register or unregister), and hooks whose agent
        is (a crash inside set_wake_hook); how many were removed."""
        rows = self.agents.orphans()
        for rid in rows:
            self.agents.remove_channel(rid)
        hooks = [u for u in self.service.wake.owners(OwnerKind.UAID) if not self.agents.exists(u)]
        for uaid in hooks:
            self.service.wake.remove_hook(Owner(OwnerKind.UAID, uaid))
        return len(rows) + len(hooks)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Re-sign registrations as they fall due and drop idle agents, until cancelled."""
        orphans = self.remove_orphans()
        if orphans:
            log.info("channels and wake hooks left incomplete by a crash removed", rows=orphans)
        task_status.started()
        next_sweep = self._now()
        while True:
            while self.refresh_due() == REFRESH_BATCH:
                await trio.sleep(0)
            if self._now() >= next_sweep:
                self.drop_idle()
                next_sweep = self._now() + SWEEP_INTERVAL_S
            due = self.agents.next_due()
            until = min(next_sweep, due if due is not None else float("inf"))
            self._wake = trio.Event()
            with trio.move_on_after(max(0.0, until - self._now())):
                await self._wake.wait()
