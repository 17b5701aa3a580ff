"""Wake hooks at the home relay: a content-free POST to the app's gateway when mail waits (docs/gateway.md).

A device that cannot hold a socket (a phone: iOS lets nothing but APNs wake an app) registers a hook
at its home relay: the URL of its app's wake-up gateway and an opaque token (the APNs/FCM device
token sealed to the gateway's key: inri/protocol/wake.py). When a message is stored for a device
with a hook and no live stream, this relay POSTs `{"token": "<base64url>"}` to the hook URL, nothing
else: no push id, no sender, no size, no count. The gateway asks Apple or Google to wake the app,
which then pulls from its home relay (`GET /v1/devices/{id}/messages`) and acknowledges.

When to send is the sans-IO policy's (inri/node/wakepolicy.py: coalescing, rate limit, backoff);
this module owns the hooks (SQLite `wake_hooks`, a copy in memory), the HTTP client (httpx, HTTP/2
when the gateway offers it over TLS) and the one trio task that sends what the policy says is due.

What the gateway answers decides what happens next:

| answer | meaning | here |
|---|---|---|
| 2xx | sent to Apple/Google | the coalescing window starts |
| 410 | the device token is gone (APNs Unregistered/BadDeviceToken, FCM UNREGISTERED, ...) | the hook is deleted |
| 408, 425, 429, 5xx, no answer | try later | retried with backoff, Retry-After honoured |
| any other | this wake-up is refused (a misconfigured gateway) | dropped, the hook stays |

Owners: a hook belongs to a device of the device API (its route id) or to a Mozilla Push user agent
(its uaid: inri/node/agents.py wires that kind in). A message stored for a route id finds its owner
through `resolvers` (a device's own route id by default; a channel's route id -> its uaid); `live` and
`waiting` say per owner kind whether it has a live connection and whether mail still waits. A new kind
of owner adds one resolver and one entry in each table (docs/gateway.md, "Hooks for other owners").

Every path into the hooks runs on the trio thread and is short (dict lookups; a store write when a
hook changes). Times come from `clock` (trio.current_time: MockClock in tests).
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
import math
import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, assert_never
from urllib.parse import urlsplit

import httpx
import structlog
import trio

from inri.common.b64url import b64e
from inri.common.http import retry_after_seconds
from inri.node.config import WakeSection
from inri.node.store import Store
from inri.node.wakepolicy import Owner, OwnerKind, WakeLimits, WakePolicy
from inri.protocol.wake import PAD_BYTES, PAD_STEP, SEAL_OVERHEAD_BYTES, WAKE_TOKEN_MAX_BYTES

log = structlog.get_logger("inri.wake")

HOOK_URL_MAX_CHARS = 512
RETRY_STATUSES = frozenset({408, 425, 429})  # plus every 5xx: the gateway or its provider, later


class HookError(ValueError):
    """A hook refused at registration (the API answers 422 with `code`)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


@dataclass(frozen=True, slots=True)
class Hook:
    """One owner's hook: where to POST, and the sealed token to POST."""

    url: str
    token: bytes
    created: float


class Outcome(enum.Enum):
    """What a gateway's answer means for the hook (module docstring's table)."""

    SENT = "sent"
    GONE = "gone"
    RETRY = "retry"
    REFUSED = "refused"


def classify(status: int) -> Outcome:
    """A gateway's HTTP status -> Outcome."""
    if 200 <= status < 300:
        return Outcome.SENT
    if status == 410:
        return Outcome.GONE
    if status in RETRY_STATUSES or status >= 500:
        return Outcome.RETRY
    return Outcome.REFUSED


def check_token(token: bytes) -> None:
    """A wake token must have one of the padded sizes (inri/protocol/wake.py): the relay cannot open
    it, but a wrong size is a client bug, and uniform sizes keep phones of both platforms alike."""
    inner = len(token) - SEAL_OVERHEAD_BYTES - PAD_BYTES
    if len(token) > WAKE_TOKEN_MAX_BYTES or inner < 0 or inner % PAD_STEP:
        first = PAD_BYTES + SEAL_OVERHEAD_BYTES
        raise HookError("invalid_field", f"token: a wake token sealed to the gateway is {first}, "
                        f"{first + PAD_STEP}, ... {WAKE_TOKEN_MAX_BYTES} bytes (docs/gateway.md)")


def check_hook_url(url: object, *, lab_http_loopback: bool = False) -> str:
    """The hook URL, or HookError: https only, no credentials or fragment, no private or loopback IP
    literal (a device must not make its home relay POST into the relay's own network); with the lab
    switch, http:// and loopback hosts are allowed too."""
    if not isinstance(url, str) or not 0 < len(url) <= HOOK_URL_MAX_CHARS:
        raise HookError("invalid_field", f"url: expected an https URL of at most {HOOK_URL_MAX_CHARS} characters")
    if not url.isascii() or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise HookError("invalid_field", "url: ASCII without spaces or control characters (IDNA-encode the host)")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        raise HookError("invalid_field", "url: not a valid URL") from None
    if not host or parts.username is not None or parts.password is not None or parts.fragment:
        raise HookError("invalid_field", "url: needs a host, and no user:password@ or #fragment")
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    loopback = (ip.is_loopback if ip is not None else host == "localhost" or host.endswith(".localhost"))
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise HookError("invalid_field", "url: hooks are https URLs")
    if loopback:
        if not lab_http_loopback:
            raise HookError("forbidden_hook", "url: loopback hooks are refused ([wake] lab_http_loopback is off)")
    elif scheme == "http":
        raise HookError("invalid_field", "url: hooks are https URLs (http only on loopback, with [wake] "
                        "lab_http_loopback)")
    elif ip is not None and not ip.is_global:
        raise HookError("forbidden_hook", "url: a private, link-local or reserved address is refused")
    return url


def _tag(owner: Owner) -> str:
    """What logs say of an owner: a short hash (no route id, uaid or URL in a log line)."""
    return hashlib.blake2b(owner.key, digest_size=4, person=b"inri-wake-log").hexdigest()


class WakeHooks:
    """Every wake hook of this home relay and the task that sends their wake-ups (module docstring)."""

    def __init__(self, store: Store, config: WakeSection | None = None, *, rng: random.Random | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.store = store
        self.config = config or WakeSection()
        c = self.config
        self.policy = WakePolicy(WakeLimits(c.coalesce_s, c.rate_per_s, c.rate_burst, c.retry_min_s,
                                            c.retry_max_s, c.retry_attempts), rng or random.Random())
        self.clock = clock
        self._transport = transport  # tests: an in-process gateway (httpx.ASGITransport)
        self.counters: dict[str, int] = {}
        # Per owner kind: is there a live connection (then no wake-up), does mail wait (else none).
        self.live: dict[OwnerKind, Callable[[bytes], bool]] = {OwnerKind.DEVICE: lambda k: store.stream_open(k)}
        self.waiting: dict[OwnerKind, Callable[[bytes], bool]] = {OwnerKind.DEVICE: lambda k: store.mailbox_size(k) > 0}
        # Route id with new mail -> the owner whose hook applies; the first answer that is not None wins.
        self.resolvers: list[Callable[[bytes], Owner | None]] = [lambda rid: Owner(OwnerKind.DEVICE, rid)]
        self._hooks: dict[Owner, Hook] = {}
        # Hooks per owner kind: a resolver that costs a query skips the query when its kind has none.
        self._kinds: dict[OwnerKind, int] = dict.fromkeys(OwnerKind, 0)
        kinds = {int(k) for k in OwnerKind}
        for kind, key, url, token, created in store.wake_hooks():
            if kind in kinds:  # a kind this relay does not know (a newer version's) is kept, not used
                self._put(Owner(OwnerKind(kind), key), Hook(url, token, created))
        self._poke = trio.Event()

    def _put(self, owner: Owner, hook: Hook) -> None:
        if owner not in self._hooks:
            self._kinds[owner.kind] += 1
        self._hooks[owner] = hook

    def _drop(self, owner: Owner) -> bool:
        if self._hooks.pop(owner, None) is None:
            return False
        self._kinds[owner.kind] -= 1
        return True

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def has_hooks(self, kind: OwnerKind | None = None) -> bool:
        """True when any owner (of this kind) has a hook (a relay without phones skips every wake-up check)."""
        return bool(self._hooks) if kind is None else self._kinds[kind] > 0

    def owners(self, kind: OwnerKind) -> list[bytes]:
        """The keys of the owners of this kind that have a hook."""
        return [o.key for o in self._hooks if o.kind == kind]

    def stats(self) -> dict[str, int]:
        """Counters of the hooks and of the policy, for /metrics."""
        return {**self.policy.counters, **self.counters, "hooks": len(self._hooks)}

    # -- hooks (the device API; the Mozilla Push `wake_hook` message alike) -----------------------------

    def hook(self, owner: Owner) -> Hook | None:
        """owner's hook, if it has one."""
        return self._hooks.get(owner)

    def set_hook(self, owner: Owner, url: object, token: bytes, now: float) -> Hook:
        """Register or replace owner's hook (HookError for a URL or token refused); now: wall clock."""
        checked = check_hook_url(url, lab_http_loopback=self.config.lab_http_loopback)
        check_token(token)
        self.store.set_wake_hook(owner.kind, owner.key, checked, token, now)
        hook = Hook(checked, token, now)
        self._put(owner, hook)
        self._count("hooks_set")
        if not self._live(owner) and self._waiting(owner):  # mail waits already: wake with the new hook
            self._mail(owner)
        return hook

    def remove_hook(self, owner: Owner) -> bool:
        """Delete owner's hook; False when it had none."""
        self.policy.forget(owner)
        gone = self._drop(owner)
        return self.store.delete_wake_hook(owner.kind, owner.key) or gone

    # -- events from the relay --------------------------------------------------------------------

    def _owner(self, route_id: bytes) -> Owner | None:
        for resolve in self.resolvers:
            owner = resolve(route_id)
            if owner is not None:
                return owner if owner in self._hooks else None
        return None

    def _live(self, owner: Owner) -> bool:
        live = self.live.get(owner.kind)
        return live is not None and live(owner.key)

    def _waiting(self, owner: Owner) -> bool:
        waiting = self.waiting.get(owner.kind)
        return waiting is None or waiting(owner.key)

    def _mail(self, owner: Owner) -> None:
        self.policy.mail(owner, self.clock())
        self._poke.set()

    def message_stored(self, route_id: bytes) -> None:
        """A message for route_id is committed to its mailbox here (the service's Delivered effect)."""
        if not self._hooks:
            return  # the common case on a relay without phones: one check per delivered push
        owner = self._owner(route_id)
        if owner is not None and not self._live(owner) and self._waiting(owner):  # a TTL 0 push is not kept
            self._mail(owner)

    def acked(self, route_id: bytes) -> None:
        """route_id's owner acknowledged messages (rule W2: the coalescing window ends)."""
        if not self._hooks:
            return
        owner = self._owner(route_id)
        if owner is not None:
            self.policy.acked(owner, self.clock(), not self._live(owner) and self._waiting(owner))
            self._poke.set()

    def stream_closed(self, route_id: bytes) -> None:
        """route_id's last live stream closed: messages it left unacknowledged wake the device."""
        if not self._hooks:
            return
        owner = self._owner(route_id)
        if owner is not None:
            self.disconnected(owner)

    def disconnected(self, owner: Owner) -> None:
        """owner's live connection closed (a user agent's WebSocket): mail it left unacknowledged wakes it."""
        if owner in self._hooks and not self._live(owner) and self._waiting(owner):
            self._mail(owner)

    def forget_route(self, route_id: bytes) -> None:
        """The device unregistered: its hook goes with it."""
        self.remove_hook(Owner(OwnerKind.DEVICE, route_id))

    # -- the task ---------------------------------------------------------------------------------

    def _verify(self) -> ssl.SSLContext | bool:
        if not self.config.ca_file:
            return True
        return ssl.create_default_context(cafile=self.config.ca_file)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send due wake-ups until cancelled. First, owners with mail waiting from before a restart."""
        c = self.config
        limiter = trio.CapacityLimiter(c.concurrency)
        async with httpx.AsyncClient(http2=True, verify=self._verify(), timeout=c.timeout_s,
                                     follow_redirects=False, transport=self._transport) as client, \
                trio.open_nursery() as nursery:
            for owner in list(self._hooks):
                if not self._live(owner) and self._waiting(owner):
                    self.policy.mail(owner, self.clock())
            task_status.started()
            while True:
                self._poke = trio.Event()  # before take_due: an event while we work is not lost
                for owner in self.policy.take_due(self.clock()):
                    hook = self._hooks.get(owner)
                    if hook is None:
                        self.policy.forget(owner)
                    elif self._live(owner):
                        self._count("skipped_stream_open")
                        self.policy.skipped(owner)
                    elif not self._waiting(owner):
                        self._count("skipped_nothing_waiting")
                        self.policy.skipped(owner)
                    else:
                        nursery.start_soon(self._send, client, limiter, owner, hook)
                when = self.policy.get_timer()
                with trio.move_on_at(math.inf if when is None else when):
                    await self._poke.wait()

    async def _send(self, client: httpx.AsyncClient, limiter: trio.CapacityLimiter, owner: Owner, hook: Hook) -> None:
        async with limiter:
            outcome, retry_after = await self._post(client, hook)
        self._count("requests_" + outcome.value)
        now = self.clock()
        match outcome:
            case Outcome.SENT:
                self.policy.sent(owner, now)
            case Outcome.RETRY:
                if not self.policy.failed(owner, now, retry_after):
                    log.warning("wake-up given up after retries", owner=_tag(owner),
                                attempts=self.config.retry_attempts)
            case Outcome.REFUSED:
                self.policy.dropped(owner)
            case Outcome.GONE:
                self.policy.forget(owner)
                if self._hooks.get(owner) == hook:  # not replaced by a new hook while we waited
                    self._drop(owner)
                self.store.delete_wake_hook(owner.kind, owner.key, hook.token)
                self._count("hooks_gone")
                log.info("wake hook dropped: the gateway says its token is gone", owner=_tag(owner))
            case _:
                assert_never(outcome)
        self._poke.set()

    async def _post(self, client: httpx.AsyncClient, hook: Hook) -> tuple[Outcome, float | None]:
        """One wake-up request: its Outcome and the gateway's Retry-After (the body is never read)."""
        body: dict[str, Any] = {"token": b64e(hook.token)}
        # httpx's timeout bounds each phase (connect, each read, each write); this bounds the whole request.
        with trio.move_on_after(self.config.timeout_s):
            try:
                async with client.stream("POST", hook.url, json=body) as r:
                    return classify(r.status_code), retry_after_seconds(r.headers.get("retry-after"))
            except (httpx.HTTPError, OSError, ssl.SSLError):
                return Outcome.RETRY, None
        return Outcome.RETRY, None
