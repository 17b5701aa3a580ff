"""The device side: register at a home relay, export push credentials, receive (live or pull), ack.

State (keys, device id and secret, unexported tokens) lives in a JSON file with mode 0600 when a
`state_path` is given, so a device survives restarts. Tokens are handed to home apps once each:
`export_credential` moves them out of the state.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from inri.client.credential import DeviceKeys, PushCredential, _write_private, open_sealed
from inri.client.errors import ApiError
from inri.common.b64url import b64d, b64e
from inri.protocol.codec import encode_registration


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


class DeviceClient:
    """One device registered at one home relay."""

    def __init__(self, relay_url: str, *, state_path: str | Path | None = None, timeout_s: float = 10.0) -> None:
        self.relay_url = relay_url.rstrip("/")
        self.state_path = Path(state_path) if state_path else None
        self.timeout_s = timeout_s
        self.keys = DeviceKeys()
        self.device_id: str | None = None
        self.secret: str | None = None
        self.tokens: list[bytes] = []
        self._http: httpx.AsyncClient | None = None
        if self.state_path is not None and self.state_path.exists():
            self._load()

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
    def from_state(cls, state_path: str | Path) -> DeviceClient:
        """A device from its state file (the relay URL is in it)."""
        d = json.loads(Path(state_path).read_text(encoding="utf-8"))
        return cls(d["relay_url"], state_path=state_path)

    def _load(self) -> None:
        assert self.state_path is not None
        d = json.loads(self.state_path.read_text(encoding="utf-8"))
        self.keys = DeviceKeys.from_dict(d["keys"])
        self.device_id, self.secret = d.get("device_id"), d.get("device_secret")
        self.tokens = [b64d(t, "token", 16) for t in d.get("tokens", [])]

    def _save(self) -> None:
        if self.state_path is not None:
            _write_private(self.state_path, json.dumps({
                "relay_url": self.relay_url, "keys": self.keys.to_dict(), "device_id": self.device_id,
                "device_secret": self.secret, "tokens": [b64e(t) for t in self.tokens]}))

    def _auth(self) -> dict[str, str]:
        if self.secret is None:
            raise RuntimeError("device is not registered")
        return {"authorization": f"Bearer {self.secret}"}

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        if self._http is None:  # one client for every call (building one costs more than a request)
            self._http = httpx.AsyncClient(timeout=self.timeout_s)
        r = await self._http.request(method, self.relay_url + path, **kw)
        if r.status_code >= 400:
            raise ApiError.from_response(r)
        return r.json() if r.content else None

    # -- API --------------------------------------------------------------------------------------

    async def register(self, tokens: int = 50, lifetime_s: int = 7 * 24 * 3600) -> str:
        """Register at the relay; returns the device id."""
        reg = self.keys.registration(lifetime_s)
        body = await self._call("POST", "/v1/devices",
                                json={"registration": b64e(encode_registration(reg)), "tokens": tokens,
                                      "receipt_secret": b64e(self.keys.receipt_secret())})
        self.device_id, self.secret = body["device_id"], body["device_secret"]
        self.tokens = [b64d(t, "token", 16) for t in body["tokens"]]
        self._save()
        return str(self.device_id)

    async def refresh(self, lifetime_s: int = 7 * 24 * 3600) -> int:
        """Re-register under a newer epoch (routes refresh across the mesh); returns the epoch."""
        self.keys.epoch += 1
        reg = self.keys.registration(lifetime_s)
        await self._call("POST", f"/v1/devices/{self.device_id}/registration", headers=self._auth(),
                         json={"registration": b64e(encode_registration(reg)),
                               "receipt_secret": b64e(self.keys.receipt_secret())})
        self._save()
        return self.keys.epoch

    async def more_tokens(self, n: int = 50) -> int:
        body = await self._call("POST", f"/v1/devices/{self.device_id}/tokens", headers=self._auth(), json={"count": n})
        self.tokens += [b64d(t, "token", 16) for t in body["tokens"]]
        self._save()
        return len(self.tokens)

    async def unregister(self) -> None:
        await self._call("DELETE", f"/v1/devices/{self.device_id}", headers=self._auth())
        self.device_id = self.secret = None
        self.tokens = []
        self._save()

    def export_credential(self, n_tokens: int = 20) -> PushCredential:
        """A push credential with n unexported tokens (each token is exported once)."""
        if n_tokens < 1 or n_tokens > len(self.tokens):
            raise ValueError(f"asked for {n_tokens} tokens, {len(self.tokens)} left: call more_tokens()")
        give, self.tokens = self.tokens[:n_tokens], self.tokens[n_tokens:]
        self._save()
        return PushCredential(self.keys.registration(), bytes(self.keys.seal_key.public_key), give)

    async def mint_endpoint(self, vapid_key: str | None = None) -> WebPushEndpoint:
        """A new Web Push endpoint for this device, restricted to vapid_key (base64url P-256) when given."""
        # The seal key lets a Matrix push gateway at any relay seal notifications to this device.
        req: dict[str, str] = {"seal_key": b64e(bytes(self.keys.seal_key.public_key))}
        if vapid_key is not None:
            req["vapid_key"] = vapid_key
        body = await self._call("POST", f"/v1/devices/{self.device_id}/endpoints", headers=self._auth(), json=req)
        return WebPushEndpoint.from_json(body)

    async def list_endpoints(self) -> list[WebPushEndpoint]:
        """This device's live Web Push endpoints, oldest first."""
        body = await self._call("GET", f"/v1/devices/{self.device_id}/endpoints", headers=self._auth())
        return [WebPushEndpoint.from_json(e) for e in body["endpoints"]]

    async def revoke_endpoint(self, endpoint_id: str) -> None:
        """Revoke an endpoint: its senders then get 410 Gone."""
        await self._call("DELETE", f"/v1/devices/{self.device_id}/endpoints/{endpoint_id}", headers=self._auth())

    async def set_wake_hook(self, url: str, token: bytes) -> WakeHook:
        """Register (or replace) this device's wake hook: its app's gateway URL and the wake token
        (`inri.protocol.wake.seal_wake_token`: the APNs/FCM device token sealed to the gateway's key).
        While the device has no live stream, its home relay POSTs the token to url when mail waits."""
        body = await self._call("PUT", f"/v1/devices/{self.device_id}/wake", headers=self._auth(),
                                json={"url": url, "token": b64e(token)})
        return WakeHook(str(body["url"]), float(body["created"]))

    async def wake_hook(self) -> WakeHook | None:
        """This device's wake hook, or None."""
        body = await self._call("GET", f"/v1/devices/{self.device_id}/wake", headers=self._auth())
        return None if body["url"] is None else WakeHook(str(body["url"]), float(body["created"]))

    async def remove_wake_hook(self) -> None:
        """Remove the wake hook (idempotent): no more wake-ups for this device."""
        await self._call("DELETE", f"/v1/devices/{self.device_id}/wake", headers=self._auth())

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

    async def pull(self, limit: int = 100) -> list[Message]:
        """Stored, unacknowledged messages (oldest first); undecryptable ones are marked, not raised."""
        body = await self._call("GET", f"/v1/devices/{self.device_id}/messages", headers=self._auth(),
                                params={"limit": limit})
        return [self.message_from_json(m) for m in body["messages"]]

    async def ack(self, ids: list[str]) -> int:
        body = await self._call("POST", f"/v1/devices/{self.device_id}/ack", headers=self._auth(), json={"ids": ids})
        return int(body["deleted"])

    @asynccontextmanager
    async def stream(self, *, ack: bool = True) -> AsyncIterator[trio.MemoryReceiveChannel[Message]]:
        """Live messages over the WebSocket stream, decrypted, as a channel:

            async with device.stream() as messages:
                async for m in messages: ...

        A message is acknowledged (deleted at the relay) once the caller has received it from the
        channel (ack=True). A message that does not decrypt arrives marked `undecryptable` and the
        stream goes on. The stream reconnects with exponential backoff (0.2 s .. 10 s); the relay
        re-sends whatever was not acknowledged, so nothing is lost across reconnects (ids may repeat).
        Wrong credentials raise ApiError(bad_credentials).
        """
        send, recv = trio.open_memory_channel[Message](0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, send, ack)
            try:
                yield recv
            finally:
                nursery.cancel_scope.cancel()

    async def _pump(self, out: trio.MemorySendChannel[Message], ack: bool) -> None:
        url = self.relay_url.replace("http://", "ws://").replace("https://", "wss://")
        url += f"/v1/devices/{self.device_id}/stream"
        headers = [(b"authorization", f"Bearer {self.secret}".encode())]
        backoff = 0.2
        while True:
            try:
                async with open_websocket_url(url, extra_headers=headers) as ws:
                    backoff = 0.2
                    while True:
                        data = json.loads(await ws.get_message())
                        if data.get("type") != "message":
                            continue
                        msg = self.message_from_json(data)
                        await out.send(msg)
                        if ack:
                            await ws.send_message(json.dumps({"type": "ack", "ids": [msg.id]}))
            except (ConnectionClosed, HandshakeError, OSError) as exc:
                if isinstance(exc, ConnectionClosed) and exc.reason is not None and exc.reason.code == 4401:
                    raise ApiError("bad_credentials", 401, "stream refused the device secret") from None
            await trio.sleep(backoff)
            backoff = min(10.0, backoff * 2)


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
