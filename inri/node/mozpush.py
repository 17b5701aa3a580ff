"""The Mozilla Push WebSocket protocol (autopush's "autoconnect"), sans-IO: text in, messages and actions out.

Firefox (any build, `dom.push.serverURL`) and Sunup (the UnifiedPush distributor for Android) speak it to
their push server over one WebSocket (subprotocol `push-notification`), JSON messages with a
`messageType`. Read from autopush-rs (autoconnect-common/src/protocol.rs, autoconnect-ws-sm) and from
Firefox's client (PushServiceWebSocket.sys.mjs); docs/browsers.md has the whole description. `Session`
holds one connection's state and nothing else: no socket, no clock (every call takes `now`, trio time in
the relay), and the relay's side (user agents, channels, mailboxes) behind the synchronous
`AgentBackend` contract, as the engine has `HomeStore`. The driver (inri/node/mozpush_ws.py) carries
out what comes back, in order.

Rules (each cited where it is implemented):

- MP1 `hello` comes first, within `hello_timeout_s`, and once. A `uaid` this relay does not know (or
  none, or not a UUID) gets a new one, unsaved until its first channel (Firefox rotates an unused uaid on
  every connection, bug 1617136); Firefox then drops its subscriptions and resubscribes. A known uaid
  resumes its channels and gets every stored message, oldest first. `channelIDs` (older clients) are
  ignored, but more than `channels_max` of them close the connection. Reply: `hello` with `uaid`,
  `status` 200, `use_webpush` true, `broadcasts` {} (no broadcasts are served).
- MP2 `register` (`channelID` a UUID, optional `key`: the VAPID public key, base64url, padding allowed):
  `register` with `status` 200 and the `pushEndpoint`; the same channelID again gets the same endpoint.
  A bad key answers status 400, a key other than the channel's 409, a rate limit 429 (the connection
  stays); a channel past `channels_max` closes it (TOO_MANY_CHANNELS).
- MP3 `unregister`: `unregister` with `status` 200 (also for an unknown channel); senders then get 410.
- MP4 `notification` (`channelID`, `version`, `data` base64url, `headers` encoding / crypto_key /
  encryption) for each stored message, at most `inflight_max` unacknowledged at a time; `ack`
  (`updates`: channelID, version, code) deletes a message (whatever the code: 101 and 102 say it cannot
  be shown, and it would fail again), `nack` (version, code) is logged and counted and the message stays
  stored (offered again on the next connection).
- MP5 `{}` (or `messageType` "ping") is answered `{}`, at most once per `ping_min_interval_s` (45 s, as
  autopush); a ping sooner closes the connection (PING_TOO_OFTEN). `broadcast_subscribe` is accepted,
  without an answer.
- MP6 Anything else closes the connection with a `CloseCode`: not JSON, not an object, a field of the
  wrong type (MALFORMED), an unknown `messageType` (UNKNOWN_TYPE), a message before `hello` or a second
  `hello` (OUT_OF_ORDER), a binary message (UNSUPPORTED_DATA), a message over `message_max_bytes`
  (TOO_BIG). A closed session answers nothing more.
- MP7 (INRI's extension, docs/browsers.md "Waking a phone") `wake_hook`, after `hello`: the agent's wake
  hook (docs/gateway.md), authenticated as everything on the connection is, by the uaid. With a `url`
  string and a `token` (base64url, a wake token sealed to the gateway) it sets or replaces the hook, with
  `url` null it removes it, without `url` it reads it; the reply is `wake_hook` with `status` 200, `url` and
  `created` (nulls when there is none). A refusal (a URL or token the relay does not accept, a rate
  limit) is the same reply with another `status`, a stable `code` and an `error` text, and the connection
  stays: as a `register` refused (MP2), what the client asked for is wrong, not the protocol. Standard
  clients never send it, so for them MP6 is unchanged.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import os
import uuid
from dataclasses import dataclass
from typing import Any, Protocol, assert_never

from inri.common.b64url import b64d
from inri.protocol.messages import ContentEncoding
from inri.protocol.wake import WAKE_TOKEN_MAX_BYTES
from inri.protocol.webpush import ENCODING_NAME

SUBPROTOCOL = "push-notification"  # what Firefox asks for (PushServiceWebSocket: `this._ws.protocol`)
UAID_MAX_CHARS = 128  # Firefox refuses a longer uaid (handleHelloReply); we never parse one longer
KEY_MAX_CHARS = 200  # a 65-byte P-256 point is 88 base64url characters with padding
PUSH_ID_BYTES = 16


class MessageType(enum.StrEnum):
    """`messageType` values (autoconnect-common protocol.rs), and INRI's extension WAKE_HOOK (MP7)."""

    HELLO = "hello"
    REGISTER = "register"
    UNREGISTER = "unregister"
    BROADCAST_SUBSCRIBE = "broadcast_subscribe"
    ACK = "ack"
    NACK = "nack"
    PING = "ping"
    NOTIFICATION = "notification"
    WAKE_HOOK = "wake_hook"


class CloseCode(enum.IntEnum):
    """WebSocket close codes the relay ends a Mozilla Push connection with (docs/browsers.md). Firefox
    reconnects after any of them (with backoff) except 4774, which the relay never sends."""

    GOING_AWAY = 1001  # the relay is stopping
    UNSUPPORTED_DATA = 1003  # a binary message
    TOO_BIG = 1009  # a message over message_max_bytes
    INTERNAL = 1011  # a bug on the relay's side (logged)
    MALFORMED = 4400  # not JSON, not an object, a field missing or of the wrong type
    UNKNOWN_TYPE = 4404  # a messageType a client does not send
    OUT_OF_ORDER = 4405  # a message before hello, or a second hello
    TIMEOUT = 4408  # no hello within hello_timeout_s, or silent longer than idle_timeout_s
    REPLACED = 4409  # a newer connection for the same uaid took over
    TOO_MANY_CHANNELS = 4413  # a register (or a hello's channelIDs) past channels_max
    PING_TOO_OFTEN = 4429  # an application ping sooner than ping_min_interval_s after the last


class SessionState(enum.IntEnum):
    """Where a session is (MP1)."""

    AWAITING_HELLO = 0
    READY = 1
    CLOSED = 2


# -- what a session hands its driver -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send this text message."""

    text: str


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection with this code (after the messages before it)."""

    code: CloseCode
    reason: str


@dataclass(frozen=True, slots=True)
class Identified:
    """hello succeeded: this connection now serves uaid (a newer one replaces an older: MP1) and these
    route ids (its channels), whose deliveries should wake it."""

    uaid: bytes
    route_ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ChannelAdded:
    """A channel of this connection's agent was registered: wake the connection for its deliveries."""

    route_id: bytes


@dataclass(frozen=True, slots=True)
class ChannelRemoved:
    """A channel of this connection's agent was unregistered."""

    route_id: bytes


@dataclass(frozen=True, slots=True)
class Wake:
    """Stored messages may wait: call `Session.poll` (from the task that writes notifications)."""


Output = Send | Close | Identified | ChannelAdded | ChannelRemoved | Wake


# -- the relay's side -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Notification:
    """One stored Web Push message of a channel, as the backend reads it."""

    channel_id: bytes  # 16-byte UUID
    version: bytes  # the push id (hex on the wire)
    body: bytes  # as the entry relay framed it (inri/node/webpush.py frame_body)
    encoding: ContentEncoding


class RegisterRefused(Exception):
    """A register answered with a status other than 200 (the connection stays open)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class TooManyChannels(Exception):
    """The agent holds channels_max channels already (MP2: the connection is closed)."""


class WakeHookRefused(Exception):
    """A wake_hook answered with a status other than 200 (MP7: the connection stays open)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


class AgentBackend(Protocol):
    """The relay's user agents, their channels and mailboxes (inri/node/agents.py; tests use a memory one).

    Calls are synchronous and short (an SQLite transaction at most), like the engine's HomeStore."""

    def channels(self, uaid: bytes) -> list[bytes] | None:
        """The route ids of a known agent's channels (and it was seen now); None for an unknown uaid."""
        ...

    def register(self, uaid: bytes, channel_id: bytes, key: bytes | None, client: str) -> tuple[str, bytes]:
        """(push endpoint URL, route id) of the channel, made if new (the agent too). key: the raw VAPID
        public key. Raises RegisterRefused, TooManyChannels."""
        ...

    def unregister(self, uaid: bytes, channel_id: bytes) -> bytes | None:
        """Remove the channel (senders then get 410); its route id, None when there was no such channel."""
        ...

    def pending(self, uaid: bytes, limit: int) -> list[Notification]:
        """The agent's stored, unexpired messages, oldest first."""
        ...

    def ack(self, uaid: bytes, channel_id: bytes, version: bytes, code: int | None) -> bool:
        """Delete an acknowledged message; False when the agent has no such message."""
        ...

    def nack(self, uaid: bytes, version: bytes, code: int | None) -> None:
        """Log and count a negative acknowledgement (the message stays stored)."""
        ...

    def wake_hook(self, uaid: bytes) -> tuple[str, float] | None:
        """(url, created) of the agent's wake hook; None when it has none."""
        ...

    def set_wake_hook(self, uaid: bytes, url: object, token: bytes, client: str) -> tuple[str, float]:
        """Set or replace the agent's wake hook (the agent is saved if it was not); (url, created).
        Raises WakeHookRefused."""
        ...

    def remove_wake_hook(self, uaid: bytes, client: str) -> None:
        """Delete the agent's wake hook (nothing when it has none). Raises WakeHookRefused."""
        ...


@dataclass(frozen=True, slots=True)
class Limits:
    """A session's bounds ([mozpush] in the relay's configuration)."""

    hello_timeout_s: float = 10.0
    ping_min_interval_s: float = 45.0
    channels_max: int = 100
    inflight_max: int = 32
    message_max_bytes: int = 16 * 1024


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


def channel_text(channel_id: bytes) -> str:
    """A channelID as the server writes it: lower-case, hyphenated (as autopush serialises a Uuid)."""
    return str(uuid.UUID(bytes=channel_id))


def _uuid(value: object) -> bytes | None:
    """16 bytes of a UUID string (any case, hyphens or not), None for anything else."""
    if not isinstance(value, str) or len(value) > 45:
        return None
    try:
        return uuid.UUID(value).bytes
    except ValueError:
        return None


def _version(value: object) -> bytes | None:
    """The push id of a `version` (32 hex characters), None for anything else."""
    if not isinstance(value, str) or len(value) != 2 * PUSH_ID_BYTES:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def _code(value: object) -> int | None:
    """An optional integer `code`; ValueError when present and not an integer."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
        raise ValueError("code must be an integer")
    return value


def decode_key(text: object) -> bytes:
    """MP2: a register's `key`, base64url with or without padding (Firefox pads it) -> raw bytes;
    ValueError for anything else. The P-256 point itself is checked by the backend."""
    if not isinstance(text, str) or not text or len(text) > KEY_MAX_CHARS:
        raise ValueError("key must be a base64url string")
    try:
        return base64.urlsafe_b64decode(text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("key is not base64url") from None


def notification_fields(body: bytes, encoding: ContentEncoding) -> tuple[str, dict[str, str]] | None:
    """MP4: (data, headers) of a stored body; None for a push without data.

    aes128gcm goes as sent (its salt and key are in the body); aesgcm was re-framed by the entry relay
    (`aesgcm\\nEncryption: ..\\nCrypto-Key: ..\\n` + body, inri/node/webpush.py) and goes back to the
    encryption / crypto_key headers Firefox's PushCrypto reads."""
    if not body:
        return None
    headers = {"encoding": ENCODING_NAME[encoding]}
    if encoding == ContentEncoding.AESGCM:
        lines = body.split(b"\n", 3)
        if len(lines) == 4 and lines[0] == b"aesgcm":
            try:
                enc, key = lines[1].decode("ascii"), lines[2].decode("ascii")
            except UnicodeDecodeError:
                enc = key = ""
            if enc.startswith("Encryption: ") and key.startswith("Crypto-Key: "):
                headers["encryption"] = enc[len("Encryption: "):]
                headers["crypto_key"] = key[len("Crypto-Key: "):]
                body = lines[3]
    return base64.urlsafe_b64encode(body).rstrip(b"=").decode("ascii"), headers


class ProtocolViolation(Exception):
    """A client message that ends the connection (MP6)."""

    def __init__(self, code: CloseCode, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


class Session:
    """One Mozilla Push connection's protocol state (see the module docstring for the rules)."""

    # Slots: a relay holds tens of thousands of idle sessions (benchmarks/bench_mozpush.py).
    __slots__ = ("backend", "limits", "client", "state", "uaid", "hello_deadline", "last_ping", "sent", "more")

    def __init__(self, backend: AgentBackend, limits: Limits, now: float, client: str = "") -> None:
        self.backend = backend
        self.limits = limits
        self.client = client  # the rate-limit key of the client's address (register, MP2)
        self.state = SessionState.AWAITING_HELLO
        self.uaid: bytes | None = None
        self.hello_deadline = now + limits.hello_timeout_s
        self.last_ping = -float("inf")
        # push id -> channel id of notifications sent and not acknowledged (MP4), in sending order
        self.sent: dict[bytes, bytes] = {}
        self.more = False  # the last poll left messages behind (the window was full)

    # -- input ------------------------------------------------------------------------------------

    def receive_text(self, text: str, now: float) -> list[Output]:
        """One text message from the client; what to do, in order."""
        if self.state == SessionState.CLOSED:
            return []
        try:
            return self._receive(text, now)
        except ProtocolViolation as exc:
            return self._close(exc.code, exc.reason)

    def receive_bytes(self) -> list[Output]:
        """A binary message (MP6: the protocol is text only)."""
        if self.state == SessionState.CLOSED:
            return []
        return self._close(CloseCode.UNSUPPORTED_DATA, "binary messages are not part of the protocol")

    def timed_out(self) -> list[Output]:
        """MP1: the hello deadline passed (the driver calls this once it has; a ready session ignores it)."""
        if self.state != SessionState.AWAITING_HELLO:
            return []
        return self._close(CloseCode.TIMEOUT, "no hello in time")

    def _close(self, code: CloseCode, reason: str) -> list[Output]:
        self.state = SessionState.CLOSED
        return [Close(code, reason)]

    def _receive(self, text: str, now: float) -> list[Output]:
        if len(text) > self.limits.message_max_bytes:
            raise ProtocolViolation(CloseCode.TOO_BIG, f"messages are at most {self.limits.message_max_bytes} bytes")
        try:
            msg = json.loads(text)
        except (ValueError, RecursionError):
            raise ProtocolViolation(CloseCode.MALFORMED, "not JSON") from None
        if not isinstance(msg, dict):
            raise ProtocolViolation(CloseCode.MALFORMED, "a message is a JSON object")
        kind = msg.get("messageType", MessageType.PING if not msg else None)  # MP5: {} is a ping
        if not isinstance(kind, str):
            raise ProtocolViolation(CloseCode.MALFORMED, "messageType missing or not a string")
        try:
            mtype = MessageType(kind)
        except ValueError:
            raise ProtocolViolation(CloseCode.UNKNOWN_TYPE, f"unknown messageType {kind[:40]!r}") from None
        if self.state == SessionState.AWAITING_HELLO:
            if mtype != MessageType.HELLO:
                raise ProtocolViolation(CloseCode.OUT_OF_ORDER, "hello first")
            return self._hello(msg)
        try:
            match mtype:
                case MessageType.HELLO:
                    raise ProtocolViolation(CloseCode.OUT_OF_ORDER, "hello only once")
                case MessageType.REGISTER:
                    return self._register(msg)
                case MessageType.UNREGISTER:
                    return self._unregister(msg)
                case MessageType.ACK:
                    return self._ack(msg)
                case MessageType.NACK:
                    return self._nack(msg)
                case MessageType.PING:
                    return self._ping(now)
                case MessageType.BROADCAST_SUBSCRIBE:
                    if not isinstance(msg.get("broadcasts"), dict):
                        raise ValueError("broadcasts must be an object")
                    return []  # MP5: accepted; this relay serves no broadcasts
                case MessageType.NOTIFICATION:
                    raise ProtocolViolation(CloseCode.UNKNOWN_TYPE, "notification is a server message")
                case MessageType.WAKE_HOOK:
                    return self._wake_hook(msg)
                case _:
                    assert_never(mtype)
        except ValueError as exc:
            raise ProtocolViolation(CloseCode.MALFORMED, str(exc)) from None

    # Rule MP1.
    def _hello(self, msg: dict[str, Any]) -> list[Output]:
        given, ids = msg.get("uaid"), msg.get("channelIDs")
        if given is not None and not isinstance(given, str):
            raise ProtocolViolation(CloseCode.MALFORMED, "uaid must be a string")
        if ids is not None and not isinstance(ids, list):
            raise ProtocolViolation(CloseCode.MALFORMED, "channelIDs must be a list")
        if ids is not None and len(ids) > self.limits.channels_max:
            raise ProtocolViolation(CloseCode.TOO_MANY_CHANNELS, f"at most {self.limits.channels_max} channels")
        if msg.get("broadcasts") is not None and not isinstance(msg.get("broadcasts"), dict):
            raise ProtocolViolation(CloseCode.MALFORMED, "broadcasts must be an object")
        uaid = _uuid(given) if given is not None and len(given) <= UAID_MAX_CHARS else None
        routes = None if uaid is None else self.backend.channels(uaid)
        if uaid is None or routes is None:
            uaid, routes = os.urandom(16), []  # unsaved until its first channel (MP1)
        self.uaid = uaid
        self.state = SessionState.READY
        reply = {"messageType": "hello", "uaid": uaid.hex(), "status": 200, "use_webpush": True, "broadcasts": {}}
        return [Send(_dumps(reply)), Identified(uaid, tuple(routes)), Wake()]

    # Rule MP2.
    def _register(self, msg: dict[str, Any]) -> list[Output]:
        chid = _uuid(msg.get("channelID"))
        if chid is None:
            raise ValueError("channelID must be a UUID")
        key_text = msg.get("key")
        reply: dict[str, Any] = {"messageType": "register", "channelID": channel_text(chid)}
        try:
            key = None if key_text is None else decode_key(key_text)
            assert self.uaid is not None
            url, route_id = self.backend.register(self.uaid, chid, key, self.client)
        except ValueError as exc:
            return [Send(_dumps({**reply, "status": 400, "pushEndpoint": "", "error": str(exc)}))]
        except RegisterRefused as exc:
            return [Send(_dumps({**reply, "status": exc.status, "pushEndpoint": "", "error": str(exc)}))]
        except TooManyChannels:
            raise ProtocolViolation(CloseCode.TOO_MANY_CHANNELS,
                                    f"at most {self.limits.channels_max} channels") from None
        return [Send(_dumps({**reply, "status": 200, "pushEndpoint": url})), ChannelAdded(route_id)]

    # Rule MP3.
    def _unregister(self, msg: dict[str, Any]) -> list[Output]:
        chid = _uuid(msg.get("channelID"))
        if chid is None:
            raise ValueError("channelID must be a UUID")
        _code(msg.get("code"))
        assert self.uaid is not None
        route_id = self.backend.unregister(self.uaid, chid)
        for pid in [p for p, c in self.sent.items() if c == chid]:
            del self.sent[pid]
        out: list[Output] = [Send(_dumps({"messageType": "unregister", "channelID": channel_text(chid),
                                          "status": 200}))]
        if route_id is not None:
            out.append(ChannelRemoved(route_id))
        return out

    # Rule MP4.
    def _ack(self, msg: dict[str, Any]) -> list[Output]:
        updates = msg.get("updates")
        if not isinstance(updates, list) or not all(isinstance(u, dict) for u in updates):
            raise ValueError("updates must be a list of objects")
        checked = []
        for u in updates:
            chid = _uuid(u.get("channelID"))
            if chid is None or not isinstance(u.get("version"), str):
                raise ValueError("each update has a channelID (UUID) and a version (string)")
            checked.append((chid, _version(u.get("version")), _code(u.get("code"))))
        assert self.uaid is not None
        freed = False
        for chid, version, code in checked:
            if version is None:
                continue  # not a version this relay sent: nothing to delete
            self.backend.ack(self.uaid, chid, version, code)
            freed = self.sent.pop(version, None) is not None or freed
        return [Wake()] if freed and self.more else []

    def _nack(self, msg: dict[str, Any]) -> list[Output]:
        if not isinstance(msg.get("version"), str):
            raise ValueError("version must be a string")
        code = _code(msg.get("code"))
        version = _version(msg.get("version"))
        if version is not None:
            assert self.uaid is not None
            self.backend.nack(self.uaid, version, code)
        return []

    # Rule MP7.
    def _wake_hook(self, msg: dict[str, Any]) -> list[Output]:
        assert self.uaid is not None
        reply: dict[str, Any] = {"messageType": "wake_hook"}
        try:
            if "url" not in msg:
                hook = self.backend.wake_hook(self.uaid)
            elif msg["url"] is None:
                self.backend.remove_wake_hook(self.uaid, self.client)
                hook = None
            else:
                try:
                    token = b64d(msg.get("token"), "token", max_size=WAKE_TOKEN_MAX_BYTES)
                except ValueError as exc:
                    raise WakeHookRefused(422, "invalid_field", str(exc)) from None
                hook = self.backend.set_wake_hook(self.uaid, msg["url"], token, self.client)
        except WakeHookRefused as exc:
            return [Send(_dumps({**reply, "status": exc.status, "code": exc.code, "error": exc.detail}))]
        url, created = (None, None) if hook is None else hook
        return [Send(_dumps({**reply, "status": 200, "url": url, "created": created}))]

    # Rule MP5.
    def _ping(self, now: float) -> list[Output]:
        if now - self.last_ping < self.limits.ping_min_interval_s:
            raise ProtocolViolation(CloseCode.PING_TOO_OFTEN,
                                    f"at most one ping per {self.limits.ping_min_interval_s:g} s")
        self.last_ping = now
        return [Send("{}")]

    # -- output -----------------------------------------------------------------------------------

    def poll(self) -> list[str]:
        """MP4: notification messages for stored messages not sent on this connection yet, oldest first,
        while fewer than inflight_max are unacknowledged. Marked sent at once: send them all, in order."""
        if self.state != SessionState.READY or self.uaid is None:
            return []
        room = self.limits.inflight_max - len(self.sent)
        if room <= 0:
            self.more = True
            return []
        found = self.backend.pending(self.uaid, room + len(self.sent))
        fresh = [n for n in found if n.version not in self.sent]
        self.more = len(fresh) > room or len(found) == room + len(self.sent)
        out = []
        for n in fresh[:room]:
            self.sent[n.version] = n.channel_id
            out.append(_dumps(self._notification(n)))
        return out

    @staticmethod
    def _notification(n: Notification) -> dict[str, Any]:
        msg: dict[str, Any] = {"messageType": "notification", "channelID": channel_text(n.channel_id),
                               "version": n.version.hex()}
        fields = notification_fields(n.body, n.encoding)
        if fields is not None:
            msg["data"], msg["headers"] = fields
        return msg
