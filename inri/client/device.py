"""The device side: register at a home relay (or the same route key at 2-3), export push credentials,
receive (live or pull), ack.

State (keys, device id, each home's URL and device secret, unexported tokens) lives in a JSON file with
mode 0600 when a `state_path` is given, so a device survives restarts; a single-home device's file keeps
the form it had before homes in two places (issue 42). Tokens are handed to home apps once each:
`export_credential` moves them out of the state.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from inri.client.credential import DeviceKeys, PushCredential, _write_private, open_sealed
from inri.client.errors import ApiError
from inri.client.failover import REREGISTER_AFTER_S, Failover
from inri.common.b64url import b64d, b64e
from inri.protocol.codec import encode_registration
from inri.protocol.messages import Registration

# The state file's form with several homes (`homes`); a single-home device's file keeps the form it had
# before issue 42 (no `v`), so older SDKs and scripts that read `relay_url` still read it.
STATE_VERSION = 2


@dataclass(frozen=True)
class Message:
    """A delivered push, decrypted.

    `undecryptable` is True (and `plaintext` empty) when the ciphertext does not open with this
    device's seal key: anyone holding a push credential can send such a message, so it is handed over
    like any other (the app sees its id and acks it to delete it) instead of failing the whole batch
    or ending the stream.
    """

    id: str
    plaintext: bytes
    received_at: float
    undecryptable: bool = False
    kind: str = "inri"  # "webpush" for a Web Push message
    body: bytes = b""  # a Web Push message's raw body as the sender sent it (aes128gcm, or re-framed aesgcm)
    encoding: str | None = None  # "aes128gcm" | "aesgcm"
    urgency: str | None = None
    topic: str | None = None
    endpoint_id: str | None = None
    ttl: int | None = None  # a Web Push message's seconds left (its TTL counted from the entry relay's acceptance)


@dataclass(frozen=True)
class WebPushEndpoint:
    """A Web Push endpoint minted at the home relay (hand `url` to a Web Push app server)."""

    endpoint_id: str  # hex
    url: str
    restricted: bool  # bound to one VAPID key
    vapid_key: str | None  # base64url, as given

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WebPushEndpoint:
        """From the relay's JSON answer."""
        return cls(str(d["endpoint_id"]), str(d["url"]), bool(d["restricted"]), d.get("vapid_key"))


@dataclass(frozen=True)
class WakeHook:
    """A device's wake hook as its home relay holds it (docs/gateway.md)."""

    url: str
    created: float  # unix time


@dataclass
class Home:
    """One home relay of a device: its API URL, the device secret it issued (None: not registered) and the
    epoch of the device's registration it holds (behind the device's own after the device registered again
    while this home was down: the device brings it up to date before streaming from it)."""

    relay_url: str
    secret: str | None = None
    epoch: int = 0


# A device registers the same route key at 1 to MAX_HOMES home relays (issue 42, "homes in two places").
MAX_HOMES = 3
# Push ids a multi-home device remembers to drop duplicates (the same push stored at two homes).
SEEN_MAX = 65_536
# Acks waiting to be sent to one of the other homes, at most; and ids per ack request (the API's limit).
ACK_QUEUE_MAX = 10_000
MAX_ACK_IDS = 500
DEFAULT_LIFETIME_S = 7 * 24 * 3600
# Close codes of a home's stream that mean the home went away (RFC 6455 section 7.4.1: 1001 going away,
# 1006 closed without a close frame, as a killed relay's socket is; 1011 internal error; RFC 6455's
# registry: 1012 service restart, 1013 try again later, 1014 bad gateway). Any other close (normal,
# 4429 rate limited, ...) is reconnected without counting as a failure of the home.
HOME_GONE_CLOSES = frozenset({1001, 1006, 1011, 1012, 1013, 1014})


def _home_urls(relay_url: str | Sequence[str]) -> list[str]:
    urls = [relay_url] if isinstance(relay_url, str) else list(relay_url)
    urls = [u.rstrip("/") for u in urls]
    if not 1 <= len(urls) <= MAX_HOMES:
        raise ValueError(f"a device has 1 to {MAX_HOMES} home relays, {len(urls)} given")
    if len(set(urls)) != len(urls):
        raise ValueError("the same home relay is given twice")
    return urls


class DeviceClient:
    """One device registered at one home relay, or the same route key at 2-3 (docs/api.md, "Homes in
    two places"): the route id is then anycast, every home holds the same tokens, and the device streams
    from every home, drops duplicates by push id and acks at every home."""

    def __init__(self, relay_url: str | Sequence[str], *, state_path: str | Path | None = None,
                 timeout_s: float = 10.0, reregister_after: float = REREGISTER_AFTER_S) -> None:
        """reregister_after: seconds a home must stay failed (its stream dropped, or unreachable) before a
        device with several homes registers again at its next epoch at the live ones (0: never)."""
        self.homes = [Home(u) for u in _home_urls(relay_url)]
        self.state_path = Path(state_path) if state_path else None
        self.timeout_s = timeout_s
        self.failover = Failover(len(self.homes), reregister_after)
        self.lifetime_s = DEFAULT_LIFETIME_S  # of the registrations the device signs when it registers again
        self.keys = DeviceKeys()
        self.device_id: str | None = None
        self.tokens: list[bytes] = []
        self.duplicates_dropped = 0  # messages a second home delivered again (same push id), dropped
        self._seen: OrderedDict[str, bool] = OrderedDict()  # push id -> acked (bounded: SEEN_MAX)
        self._http: httpx.AsyncClient | None = None
        self._reg: Registration | None = None  # signed for keys.epoch: the same one at every home
        self._homes_changed = trio.Event()  # a home came up or failed (wakes the stream's failover task)
        if self.state_path is not None and self.state_path.exists():
            self._load()

    @property
    def relay_url(self) -> str:
        """The first home relay's URL."""
        return self.homes[0].relay_url

    @property
    def secret(self) -> str | None:
        """The device secret the first home issued."""
        return self.homes[0].secret

    async def aclose(self) -> None:
        """Close the HTTP client (the device's state stays on disk)."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> DeviceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- state ------------------------------------------------------------------------------------

    @classmethod
    def from_state(cls, state_path: str | Path, **kw: Any) -> DeviceClient:
        """A device from its state file (its home relays' URLs are in it); kw as for the constructor."""
        d = json.loads(Path(state_path).read_text(encoding="utf-8"))
        urls = [h["relay_url"] for h in d["homes"]] if "homes" in d else d["relay_url"]
        return cls(urls, state_path=state_path, **kw)

    def _load(self) -> None:
        """Read the state file: the single-home form (`relay_url` and `device_secret` at the top, as every
        state file was before issue 42 and a single-home device's still is) or the multi-home one (`v` 2,
        `homes`)."""
        assert self.state_path is not None
        d = json.loads(self.state_path.read_text(encoding="utf-8"))
        self.keys = DeviceKeys.from_dict(d["keys"])
        self.device_id = d.get("device_id")
        # A home's epoch is in the file only once the device registered again while that home was down;
        # before that, every home holds the device's epoch.
        saved = ([Home(str(h["relay_url"]).rstrip("/"), h.get("device_secret"), int(h.get("epoch", self.keys.epoch)))
                  for h in d["homes"]]
                 if "homes" in d else [Home(str(d["relay_url"]).rstrip("/"), d.get("device_secret"), self.keys.epoch)])
        if len(saved) == 1 and len(self.homes) == 1:
            self.homes[0].secret = saved[0].secret  # one home: the URL given wins (a relay that moved)
            self.homes[0].epoch = saved[0].epoch
        else:
            by_url = {h.relay_url: h for h in saved}
            for h in self.homes:
                if h.relay_url in by_url:
                    h.secret, h.epoch = by_url[h.relay_url].secret, by_url[h.relay_url].epoch
        self.tokens = [b64d(t, "token", 16) for t in d.get("tokens", [])]

    def _save(self) -> None:
        if self.state_path is None:
            return
        state: dict[str, Any] = {"keys": self.keys.to_dict(), "device_id": self.device_id,
                                 "tokens": [b64e(t) for t in self.tokens]}
        if len(self.homes) == 1:  # the single-home form every SDK version reads (and scripts edit)
            state |= {"relay_url": self.relay_url, "device_secret": self.secret}
        else:
            state |= {"v": STATE_VERSION, "homes": [
                {"relay_url": h.relay_url, "device_secret": h.secret}
                | ({"epoch": h.epoch} if h.epoch != self.keys.epoch else {}) for h in self.homes]}
        _write_private(self.state_path, json.dumps(state))

    def _auth(self, home: Home | None = None) -> dict[str, str]:
        secret = (home or self.homes[0]).secret
        if secret is None:
            raise RuntimeError("device is not registered")
        return {"authorization": f"Bearer {secret}"}

    async def _call(self, method: str, path: str, home: Home | None = None, **kw: Any) -> Any:
        if self._http is None:  # one client for every call (building one costs more than a request)
            self._http = httpx.AsyncClient(timeout=self.timeout_s)
        r = await self._http.request(method, (home or self.homes[0]).relay_url + path, **kw)
        if r.status_code >= 400:
            raise ApiError.from_response(r)
        return r.json() if r.content else None

    async def _at(self, home: Home, method: str, path: str, **kw: Any) -> Any:
        """A device call (authenticated with home's secret) at one home."""
        return await self._call(method, f"/v1/devices/{self.device_id}{path}", home, headers=self._auth(home), **kw)

    def _single_home(self, what: str) -> None:
        if len(self.homes) > 1:
            raise ValueError(f"{what}: a Web Push endpoint is accepted only by the home that minted it, so a "
                             f"device with {len(self.homes)} homes cannot use one (docs/api.md, "
                             "\"Homes in two places\")")

    # -- API --------------------------------------------------------------------------------------

    async def register(self, tokens: int = 50, lifetime_s: int = DEFAULT_LIFETIME_S) -> str:
        """Register at every home relay; returns the device id (the route id, the same at every home).

        The first home issues the tokens; the others are given the same ones (POST .../tokens with
        `tokens`), so a push with any token is accepted at whichever home the mesh delivers it to. When a
        home refuses or cannot be reached, the homes already registered are unregistered again and the
        error is raised: the device is registered at all of its homes or at none."""
        self.lifetime_s, self._reg = lifetime_s, None
        reg = b64e(encode_registration(self._registration()))
        secret = b64e(self.keys.receipt_secret())
        done: list[Home] = []
        try:
            for i, home in enumerate(self.homes):
                body = await self._call("POST", "/v1/devices", home, json={
                    "registration": reg, "tokens": tokens if i == 0 else 1, "receipt_secret": secret})
                self.device_id, home.secret, home.epoch = body["device_id"], body["device_secret"], self.keys.epoch
                done.append(home)
                if i == 0:
                    self.tokens = [b64d(t, "token", 16) for t in body["tokens"]]
                else:
                    await self._at(home, "POST", "/tokens", json={"tokens": [b64e(t) for t in self.tokens]})
        except BaseException:
            with trio.CancelScope(shield=True):
                for home in done:
                    with contextlib.suppress(ApiError, httpx.HTTPError):
                        await self._at(home, "DELETE", "")
                    home.secret = None
            raise
        self._save()
        return str(self.device_id)

    async def refresh(self, lifetime_s: int = DEFAULT_LIFETIME_S) -> int:
        """Re-register under a newer epoch at every home (routes refresh across the mesh); returns the epoch.

        The state file records the new epoch before any home is asked (a restarted device never signs an
        epoch a home already holds); a home that fails keeps its own epoch in the state and raises."""
        self.lifetime_s = lifetime_s
        self._next_epoch()
        for home in self.homes:
            await self._refresh_at(home)
        return self.keys.epoch

    def _registration(self) -> Registration:
        """The device's registration at its current epoch, signed once (every home gets the same one), and
        again once half its lifetime is spent (a home that comes back after days gets a live one)."""
        reg = self._reg
        if reg is None or reg.epoch != self.keys.epoch or time.time() > reg.issued_at + reg.lifetime / 2:
            reg = self._reg = self.keys.registration(self.lifetime_s)
        return reg

    def _next_epoch(self) -> None:
        self.keys.epoch += 1
        self._reg = None
        self._save()  # before any relay holds the new epoch: a restart never signs an older one

    async def _refresh_at(self, home: Home) -> None:
        """Bring one home to the device's current epoch (POST .../registration), and record it.

        `not_newer`: the home holds this epoch already (an earlier answer was lost) or a newer one; either
        way it is not behind. A home that no longer knows the device (401: its data was lost) is
        registered anew, with the device's unexported tokens (those exported before are unknown there).
        httpx.TransportError: the home cannot be reached (it stays behind)."""
        reg = self._registration()
        try:
            await self._at(home, "POST", "/registration", json={
                "registration": b64e(encode_registration(reg)), "receipt_secret": b64e(self.keys.receipt_secret())})
        except ApiError as exc:
            if exc.code == "bad_credentials":
                await self._register_anew(home, reg)
            elif exc.code != "not_newer":
                raise
        home.epoch = reg.epoch
        self._save()

    async def _register_anew(self, home: Home, reg: Registration) -> None:
        """Register at a home that lost the device; `already_registered` (409: it holds the route key
        under a secret this device does not have) is raised."""
        body = await self._call("POST", "/v1/devices", home, json={
            "registration": b64e(encode_registration(reg)), "tokens": 1,
            "receipt_secret": b64e(self.keys.receipt_secret())})
        home.secret = body["device_secret"]
        if self.tokens:
            await self._at(home, "POST", "/tokens", json={"tokens": [b64e(t) for t in self.tokens]})

    async def _bring_up(self, home: Home) -> None:
        """Before a home is streamed from or pulled: bring it to the device's epoch if it fell behind."""
        while home.epoch < self.keys.epoch:  # again if the device registered again meanwhile
            await self._refresh_at(home)

    def _home_up(self, i: int) -> None:
        self.failover.up(i)
        self._homes_changed.set()

    def _home_lost(self, i: int) -> None:
        self.failover.lost(i, trio.current_time())
        self._homes_changed.set()

    async def _reregister(self) -> None:
        """Register again at the next epoch at every live home (a home failed: docs/api.md, "Homes in two
        places"). A home that fails meanwhile stays behind and is brought up when it comes back."""
        now = trio.current_time()
        self._next_epoch()
        for i, home in enumerate(self.homes):
            if self.failover.is_up(i):
                try:
                    await self._refresh_at(home)
                except httpx.TransportError:
                    self._home_lost(i)
                except ApiError:
                    pass  # refused here (e.g. unregistered meanwhile): its stream reports what is wrong
        self.failover.done(now)

    async def _watch_homes(self) -> None:
        """The stream's failover task: register again once the policy says so (inri/client/failover.py)."""
        while True:
            changed = self._homes_changed = trio.Event()
            with trio.move_on_at(self.failover.deadline()):
                await changed.wait()
            if self.failover.due(trio.current_time()):
                await self._reregister()

    async def more_tokens(self, n: int = 50) -> int:
        """n more tokens, issued by the first home and given to the others; returns how many are unexported.

        Tokens are kept (and exportable) only once every home holds them."""
        body = await self._at(self.homes[0], "POST", "/tokens", json={"count": n})
        for home in self.homes[1:]:
            await self._at(home, "POST", "/tokens", json={"tokens": body["tokens"]})
        self.tokens += [b64d(t, "token", 16) for t in body["tokens"]]
        self._save()
        return len(self.tokens)

    async def unregister(self) -> None:
        """Unregister at every home. A home that cannot be reached keeps its place in the state (call again
        to finish); the first such error is raised after the others were unregistered."""
        failed: list[Home] = []
        first: Exception | None = None
        for home in self.homes:
            try:
                await self._at(home, "DELETE", "")
            except ApiError as exc:
                if exc.code != "bad_credentials":  # 401: this home no longer holds the device
                    failed.append(home)
                    first = first or exc
            except httpx.HTTPError as exc:
                failed.append(home)
                first = first or exc
        for home in self.homes:
            if home not in failed:
                home.secret = None
        if first is None:
            self.device_id = None
            self.tokens = []
        self._save()
        if first is not None:
            raise first

    def export_credential(self, n_tokens: int = 20) -> PushCredential:
        """A push credential with n unexported tokens (each token is exported once)."""
        if n_tokens < 1 or n_tokens > len(self.tokens):
            raise ValueError(f"asked for {n_tokens} tokens, {len(self.tokens)} left: call more_tokens()")
        give, self.tokens = self.tokens[:n_tokens], self.tokens[n_tokens:]
        self._save()
        return PushCredential(self.keys.registration(), bytes(self.keys.seal_key.public_key), give)

    async def mint_endpoint(self, vapid_key: str | None = None) -> WebPushEndpoint:
        """A new Web Push endpoint for this device, restricted to vapid_key (base64url P-256) when given.

        Single-home devices only (ValueError otherwise): the endpoint's capability is derived from the
        minting home's secret key, so another home would refuse its pushes."""
        self._single_home("mint_endpoint")
        # The seal key lets a Matrix push gateway at any relay seal notifications to this device.
        req: dict[str, str] = {"seal_key": b64e(bytes(self.keys.seal_key.public_key))}
        if vapid_key is not None:
            req["vapid_key"] = vapid_key
        body = await self._at(self.homes[0], "POST", "/endpoints", json=req)
        return WebPushEndpoint.from_json(body)

    async def list_endpoints(self) -> list[WebPushEndpoint]:
        """This device's live Web Push endpoints, oldest first (at its first home)."""
        body = await self._at(self.homes[0], "GET", "/endpoints")
        return [WebPushEndpoint.from_json(e) for e in body["endpoints"]]

    async def revoke_endpoint(self, endpoint_id: str) -> None:
        """Revoke an endpoint: its senders then get 410 Gone."""
        await self._at(self.homes[0], "DELETE", f"/endpoints/{endpoint_id}")

    async def set_wake_hook(self, url: str, token: bytes) -> WakeHook:
        """Register (or replace) this device's wake hook at every home: its app's gateway URL and the wake
        token (`inri.protocol.wake.seal_wake_token`: the APNs/FCM device token sealed to the gateway's key).
        While the device has no live stream, a home relay POSTs the token to url when mail waits there."""
        body: Any = None
        for home in self.homes:
            body = await self._at(home, "PUT", "/wake", json={"url": url, "token": b64e(token)})
        return WakeHook(str(body["url"]), float(body["created"]))

    async def wake_hook(self) -> WakeHook | None:
        """This device's wake hook (as its first home holds it), or None."""
        body = await self._at(self.homes[0], "GET", "/wake")
        return None if body["url"] is None else WakeHook(str(body["url"]), float(body["created"]))

    async def remove_wake_hook(self) -> None:
        """Remove the wake hook at every home (idempotent): no more wake-ups for this device."""
        for home in self.homes:
            await self._at(home, "DELETE", "/wake")

    def message_from_json(self, item: dict[str, Any]) -> Message:
        """One message as pull and the streams show it (docs/api.md), opened with this device's keys."""
        msg_id, received_at = str(item["id"]), float(item["received_at"])
        if item.get("kind") == "webpush":  # decrypted by the app (RFC 8291 keys are the app's, not ours)
            body = b64d(item["body"], "body")
            if item.get("sealed"):  # a Matrix gateway's notification: sealed to us at the entry relay
                try:
                    body = open_sealed(self.keys.seal_key, body)
                except ValueError:
                    return Message(msg_id, b"", received_at, undecryptable=True, kind="webpush",
                                   endpoint_id=item.get("endpoint_id"))
            return Message(msg_id, b"", received_at, kind="webpush", body=body,
                           encoding=item.get("encoding"), urgency=item.get("urgency"), topic=item.get("topic"),
                           endpoint_id=item.get("endpoint_id"),
                           ttl=int(item["ttl"]) if isinstance(item.get("ttl"), int) else None)
        try:
            plaintext = open_sealed(self.keys.seal_key, b64d(item["ciphertext"], "ciphertext"))
        except ValueError:  # not base64url, not sealed to this device, or tampered with
            return Message(msg_id, b"", received_at, undecryptable=True)
        return Message(msg_id, plaintext, received_at)

    def _first_sight(self, msg_id: str) -> bool:
        """True the first time a push id is seen (a second home's copy of it: False, counted)."""
        if msg_id in self._seen:
            self.duplicates_dropped += 1
            return False
        self._seen[msg_id] = False
        if len(self._seen) > SEEN_MAX:
            self._seen.popitem(last=False)
        return True

    async def pull(self, limit: int = 100) -> list[Message]:
        """Stored, unacknowledged messages (oldest first); undecryptable ones are marked, not raised.

        With several homes, each is asked and a push id held by two of them is listed once; a home that
        cannot be reached is skipped (its error is raised only when no home answered). A home that stays
        unreachable from one pull to another `reregister_after` seconds or more later makes the device
        register again at the live homes, as a stream does; a home behind the device's epoch is brought
        up to it before it is asked."""
        if len(self.homes) == 1:
            body = await self._at(self.homes[0], "GET", "/messages", params={"limit": limit})
            return [self.message_from_json(m) for m in body["messages"]]
        got: dict[str, Message] = {}
        errors: list[Exception] = []
        for i, home in enumerate(self.homes):
            try:
                await self._bring_up(home)
                body = await self._at(home, "GET", "/messages", params={"limit": limit})
            except (ApiError, httpx.HTTPError) as exc:
                if isinstance(exc, httpx.TransportError):
                    self._home_lost(i)
                errors.append(exc)
                continue
            self._home_up(i)
            for item in body["messages"]:
                if str(item["id"]) in got:
                    self.duplicates_dropped += 1
                else:
                    got[str(item["id"])] = self.message_from_json(item)
        if len(errors) == len(self.homes):
            raise errors[0]
        if self.failover.due(trio.current_time()):
            await self._reregister()
        return sorted(got.values(), key=lambda m: m.received_at)[:limit]

    async def ack(self, ids: list[str]) -> int:
        """Acknowledge (delete) messages at every home; returns the most any one home deleted.

        A home that does not hold an id deletes nothing for it; a home that cannot be reached is skipped
        (its error is raised only when no home answered), and a live stream acks there again when that
        home re-sends the message."""
        for i in ids:
            if i in self._seen:
                self._seen[i] = True
        if len(self.homes) == 1:
            return int((await self._at(self.homes[0], "POST", "/ack", json={"ids": ids}))["deleted"])
        deleted: list[int] = []
        errors: list[Exception] = []
        for home in self.homes:
            try:
                deleted.append(int((await self._at(home, "POST", "/ack", json={"ids": ids}))["deleted"]))
            except (ApiError, httpx.HTTPError) as exc:
                errors.append(exc)
        if not deleted:
            raise errors[0]
        return max(deleted)

    @asynccontextmanager
    async def stream(self, *, ack: bool = True) -> AsyncIterator[trio.MemoryReceiveChannel[Message]]:
        """Live messages over the WebSocket stream of every home, decrypted, as a channel:

            async with device.stream() as messages:
                async for m in messages: ...

        A message is acknowledged (deleted at the relay) once the caller has received it from the
        channel (ack=True); with several homes, at every home. A push id a second home delivers again is
        dropped (`duplicates_dropped` counts them) and, once acked, acked at that home too. A message that
        does not decrypt arrives marked `undecryptable` and the stream goes on. Each home's stream
        reconnects with exponential backoff (0.2 s .. 10 s); the relay re-sends whatever was not
        acknowledged, so nothing is lost across reconnects (ids may repeat across reconnects of a
        single-home device). Wrong credentials raise ApiError(bad_credentials).

        With several homes, when one home's stream drops (the home went away, or cannot be reached) and
        stays down `reregister_after` seconds while another home's stream is live, the device registers
        again at its next epoch at the live homes (inri/client/failover.py bounds how often), so that the
        whole mesh routes to them; the failed home is brought to the new epoch before its stream opens
        again (`failover.reregistrations` counts them).
        """
        send, recv = trio.open_memory_channel[Message](0)
        async with trio.open_nursery() as nursery:
            if len(self.homes) > 1:
                now = trio.current_time()
                for i, home in enumerate(self.homes):
                    if home.epoch < self.keys.epoch:  # failed before, and handled: not a new failure
                        self.failover.known_down(i, now)
                nursery.start_soon(self._watch_homes)
            # With several homes, a message received from one is acked at the others by one task per home,
            # in batches, so that a stream never waits on another home's HTTP round trip.
            ackers: dict[str, trio.MemorySendChannel[str]] = {}
            for home in self.homes if len(self.homes) > 1 else []:
                ackers[home.relay_url], queued = trio.open_memory_channel[str](ACK_QUEUE_MAX)
                nursery.start_soon(self._acker, home, queued)
            for home in self.homes:
                nursery.start_soon(self._pump, home, send, ack, ackers)
            try:
                yield recv
            finally:
                nursery.cancel_scope.cancel()

    async def _pump(self, home: Home, out: trio.MemorySendChannel[Message], ack: bool,
                    ackers: dict[str, trio.MemorySendChannel[str]]) -> None:
        url = home.relay_url.replace("http://", "ws://").replace("https://", "wss://")
        url += f"/v1/devices/{self.device_id}/stream"
        headers = [(b"authorization", f"Bearer {home.secret}".encode())]
        several = len(self.homes) > 1
        i = self.homes.index(home)
        backoff = 0.2
        while True:
            try:
                if several:
                    await self._bring_up(home)
                    headers = [(b"authorization", f"Bearer {home.secret}".encode())]  # new if registered anew
                async with open_websocket_url(url, extra_headers=headers) as ws:
                    backoff = 0.2
                    if several:
                        self._home_up(i)
                    while True:
                        data = json.loads(await ws.get_message())
                        if data.get("type") != "message":
                            continue
                        msg = self.message_from_json(data)
                        if several and not self._first_sight(msg.id):
                            if self._seen.get(msg.id):  # acked already (at the other homes): clear it here
                                await ws.send_message(json.dumps({"type": "ack", "ids": [msg.id]}))
                            continue
                        await out.send(msg)
                        if ack:
                            await ws.send_message(json.dumps({"type": "ack", "ids": [msg.id]}))
                            if several:
                                self._seen[msg.id] = True
                                self._ack_elsewhere(home, msg.id, ackers)
            except (ConnectionClosed, HandshakeError, OSError, httpx.TransportError) as exc:
                code = exc.reason.code if isinstance(exc, ConnectionClosed) and exc.reason is not None else None
                if code == 4401:
                    raise ApiError("bad_credentials", 401, "stream refused the device secret") from None
                if several and (not isinstance(exc, ConnectionClosed) or code is None or code in HOME_GONE_CLOSES):
                    self._home_lost(i)
            await trio.sleep(backoff)
            backoff = min(10.0, backoff * 2)

    def _ack_elsewhere(self, got_from: Home, msg_id: str, ackers: dict[str, trio.MemorySendChannel[str]]) -> None:
        """Queue an ack at the homes other than got_from (a full queue drops it: that home re-sends the
        message, and the stream acks it there as a duplicate)."""
        for home in self.homes:
            if home is not got_from:
                with contextlib.suppress(trio.WouldBlock):
                    ackers[home.relay_url].send_nowait(msg_id)

    async def _acker(self, home: Home, queued: trio.MemoryReceiveChannel[str]) -> None:
        """Send the acks queued for home, up to MAX_ACK_IDS a request; one that cannot be reached acks when
        it re-sends the message."""
        async for first in queued:
            ids = [first]
            while len(ids) < MAX_ACK_IDS:
                try:
                    ids.append(queued.receive_nowait())
                except trio.WouldBlock:
                    break
            with contextlib.suppress(ApiError, httpx.HTTPError):
                await self._at(home, "POST", "/ack", json={"ids": ids})


@asynccontextmanager
async def stream_many(
    devices: list[DeviceClient], *, ack: bool = True,
) -> AsyncIterator[trio.MemoryReceiveChannel[tuple[DeviceClient, Message]]]:
    """Live messages of many devices homed at the same relay over ONE WebSocket (`/v1/stream`):

        async with stream_many([dev_a, dev_b]) as messages:
            async for device, message in messages: ...

    One route key per app subscription keeps subscriptions unlinkable to app servers; this keeps them
    cheap on the device (one connection, one keepalive). Acks, reconnects and undecryptable messages
    behave as in `DeviceClient.stream()`. A device the relay refuses raises ApiError(bad_credentials).
    """
    if not devices or len({d.relay_url for d in devices}) != 1:
        raise ValueError("stream_many: give one or more devices homed at the same relay")
    if any(len(d.homes) > 1 for d in devices):
        raise ValueError("stream_many: a device with several homes streams with DeviceClient.stream()")
    by_id = {d.device_id: d for d in devices}
    send, recv = trio.open_memory_channel[tuple[DeviceClient, Message]](0)
    url = devices[0].relay_url.replace("http://", "ws://").replace("https://", "wss://") + "/v1/stream"
    subscribe = json.dumps({"type": "subscribe",
                            "devices": [{"device_id": d.device_id, "auth": d.secret} for d in devices]})

    async def pump() -> None:
        backoff = 0.2
        while True:
            try:
                async with open_websocket_url(url) as ws:
                    await ws.send_message(subscribe)
                    backoff = 0.2
                    while True:
                        data = json.loads(await ws.get_message())
                        if data.get("type") == "refused":
                            raise ApiError("bad_credentials", 401, f"stream refused device {data.get('device_id')}")
                        device = by_id.get(data.get("device_id"))
                        if data.get("type") != "message" or device is None:
                            continue
                        msg = device.message_from_json(data)
                        await send.send((device, msg))
                        if ack:
                            await ws.send_message(json.dumps({"type": "ack", "device_id": device.device_id,
                                                              "ids": [msg.id]}))
            except (ConnectionClosed, HandshakeError, OSError):
                pass
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump)
        try:
            yield recv
        finally:
            nursery.cancel_scope.cancel()
