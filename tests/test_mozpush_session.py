"""The sans-IO Mozilla Push session (inri/node/mozpush.py) against a memory backend: its rules one by one,
and hypothesis feeding it arbitrary and protocol-shaped messages (nothing raises, every reply is JSON,
one Close at most and nothing after it)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from inri.common.b64url import b64e
from inri.node.mozpush import (
    ChannelAdded,
    Close,
    CloseCode,
    Identified,
    Limits,
    Notification,
    Output,
    RegisterRefused,
    Send,
    Session,
    SessionState,
    TooManyChannels,
    Wake,
    WakeHookRefused,
    notification_fields,
)
from inri.protocol.messages import ContentEncoding
from inri.protocol.wake import WAKE_TOKEN_MAX_BYTES


class MemoryAgents:
    """An AgentBackend in memory."""

    def __init__(self, channels_max: int = 3) -> None:
        self.agents: dict[bytes, dict[bytes, bytes]] = {}  # uaid -> channel id -> route id
        self.mail: list[tuple[bytes, Notification]] = []  # (uaid, notification), oldest first
        self.nacks: list[bytes] = []
        self.hooks: dict[bytes, tuple[str, bytes]] = {}  # uaid -> (url, token)
        self.channels_max = channels_max

    def channels(self, uaid: bytes) -> list[bytes] | None:
        got = self.agents.get(uaid)
        return None if got is None else list(got.values())

    def register(self, uaid: bytes, channel_id: bytes, key: bytes | None, client: str) -> tuple[str, bytes]:
        if key is not None and len(key) != 65:
            raise RegisterRefused(400, "bad key")
        chans = self.agents.setdefault(uaid, {})
        if channel_id not in chans and len(chans) >= self.channels_max:
            raise TooManyChannels
        rid = chans.setdefault(channel_id, uuid.uuid4().bytes)
        return f"https://relay.example/wp/v1/{rid.hex()}", rid

    def unregister(self, uaid: bytes, channel_id: bytes) -> bytes | None:
        return self.agents.get(uaid, {}).pop(channel_id, None)

    def pending(self, uaid: bytes, limit: int) -> list[Notification]:
        return [n for u, n in self.mail if u == uaid][:limit]

    def ack(self, uaid: bytes, channel_id: bytes, version: bytes, code: int | None) -> bool:
        before = len(self.mail)
        self.mail = [(u, n) for u, n in self.mail if not (u == uaid and n.version == version)]
        return len(self.mail) < before

    def nack(self, uaid: bytes, version: bytes, code: int | None) -> None:
        self.nacks.append(version)

    def wake_hook(self, uaid: bytes) -> tuple[str, float] | None:
        got = self.hooks.get(uaid)
        return None if got is None else (got[0], 1.0)

    def set_wake_hook(self, uaid: bytes, url: object, token: bytes, client: str) -> tuple[str, float]:
        if not isinstance(url, str) or not url.startswith("https://"):
            raise WakeHookRefused(422, "invalid_field", "url: hooks are https URLs")
        self.hooks[uaid] = (url, token)
        return url, 1.0

    def remove_wake_hook(self, uaid: bytes, client: str) -> None:
        self.hooks.pop(uaid, None)


def _sent(outputs: list[Output]) -> list[dict[str, Any]]:
    return [json.loads(o.text) for o in outputs if isinstance(o, Send)]


def _ready(backend: MemoryAgents, limits: Limits | None = None) -> tuple[Session, bytes]:
    s = Session(backend, limits or Limits(), 0.0)
    out = s.receive_text('{"messageType":"hello","use_webpush":true}', 0.0)
    assert s.state == SessionState.READY and isinstance(out[1], Identified) and isinstance(out[2], Wake)
    assert s.uaid is not None
    return s, s.uaid


def test_hello_register_notify_ack_window_and_ping() -> None:
    backend = MemoryAgents()
    s, uaid = _ready(backend, Limits(inflight_max=2))
    ch = str(uuid.uuid4())
    out = s.receive_text(json.dumps({"messageType": "register", "channelID": ch.upper(), "key": "BA" + "A" * 85}), 1.0)
    assert _sent(out)[0] == {"messageType": "register", "channelID": ch, "status": 200,
                             "pushEndpoint": _sent(out)[0]["pushEndpoint"]} and isinstance(out[1], ChannelAdded)
    for i in range(3):
        backend.mail.append((uaid, Notification(uuid.UUID(ch).bytes, bytes([i]) * 16, b"body%d" % i,
                                                ContentEncoding.AES128GCM)))
    first = [json.loads(t) for t in s.poll()]
    assert [n["version"] for n in first] == [(bytes([i]) * 16).hex() for i in range(2)]  # the window: 2
    assert s.poll() == [] and s.more
    woke = s.receive_text(json.dumps({"messageType": "ack", "updates": [
        {"channelID": ch, "version": first[0]["version"], "code": 100}]}), 2.0)
    assert woke == [Wake()]
    assert [json.loads(t)["version"] for t in s.poll()] == [(bytes([2]) * 16).hex()]
    assert s.receive_text("{}", 3.0) == [Send("{}")]
    assert s.receive_text('{"messageType":"ping"}', 50.0) == [Send("{}")]
    assert s.receive_text("{}", 60.0) == [Close(CloseCode.PING_TOO_OFTEN, "at most one ping per 45 s")]
    assert s.receive_text("{}", 200.0) == []  # closed: nothing more


def test_aesgcm_bodies_go_back_to_their_headers() -> None:
    framed = b"aesgcm\nEncryption: salt=c2FsdA\nCrypto-Key: dh=ZGg\n" + b"\x01\x02"
    assert notification_fields(framed, ContentEncoding.AESGCM) == (
        "AQI", {"encoding": "aesgcm", "encryption": "salt=c2FsdA", "crypto_key": "dh=ZGg"})
    assert notification_fields(b"", ContentEncoding.AES128GCM) is None


def test_wake_hook_is_set_read_and_removed_and_a_refusal_is_a_status_not_a_close() -> None:
    """MP7 (INRI's extension): the reply carries a status; only the message's own shape can close."""
    backend = MemoryAgents()
    s, uaid = _ready(backend)

    def ask(msg: dict[str, Any]) -> list[dict[str, Any]]:
        return _sent(s.receive_text(json.dumps(msg), 1.0))

    none = {"messageType": "wake_hook", "status": 200, "url": None, "created": None}
    assert ask({"messageType": "wake_hook"}) == [none]
    url, token = "https://gw.example/v1/wake", b"t" * 560
    hook = {"messageType": "wake_hook", "status": 200, "url": url, "created": 1.0}
    assert ask({"messageType": "wake_hook", "url": url, "token": b64e(token)}) == [hook]
    assert backend.hooks[uaid] == (url, token) and ask({"messageType": "wake_hook"}) == [hook]
    refused = {"messageType": "wake_hook", "status": 422, "code": "invalid_field"}
    for msg in ({"url": "http://gw.example/v1/wake", "token": b64e(token)},  # the backend refuses it
                {"url": url, "token": "not base64url!"}, {"url": url, "token": 7}, {"url": url},
                {"url": url, "token": b64e(b"t" * (WAKE_TOKEN_MAX_BYTES + 1))}):
        got = ask({"messageType": "wake_hook", **msg})
        assert len(got) == 1 and {k: got[0][k] for k in refused} == refused and got[0]["error"], (msg, got)
    assert backend.hooks[uaid] == (url, token)  # refusals change nothing
    assert ask({"messageType": "wake_hook", "url": None, "token": "ignored"}) == [none]
    assert uaid not in backend.hooks and s.state == SessionState.READY
    s2 = Session(MemoryAgents(), Limits(), 0.0)
    assert s2.receive_text('{"messageType":"wake_hook"}', 0.0)[0].code == CloseCode.OUT_OF_ORDER  # type: ignore[union-attr]


def test_hello_timeout_and_order() -> None:
    s = Session(MemoryAgents(), Limits(hello_timeout_s=5.0), 10.0)
    assert s.hello_deadline == 15.0
    assert s.timed_out() == [Close(CloseCode.TIMEOUT, "no hello in time")]
    s2 = Session(MemoryAgents(), Limits(), 0.0)
    assert s2.receive_text('{"messageType":"ack","updates":[]}', 0.0)[0].code == CloseCode.OUT_OF_ORDER  # type: ignore[union-attr]


_MESSAGE = st.one_of(
    st.text(max_size=60),
    st.fixed_dictionaries({"messageType": st.sampled_from(
        ["hello", "register", "unregister", "ack", "nack", "ping", "broadcast_subscribe", "notification", "wake_hook",
         "x"])},
        optional={"uaid": st.one_of(st.none(), st.text(max_size=40), st.uuids().map(str)),
                  "channelID": st.one_of(st.text(max_size=40), st.uuids().map(str), st.integers()),
                  "key": st.one_of(st.text(max_size=100), st.integers()),
                  "updates": st.one_of(st.integers(), st.lists(st.dictionaries(
                      st.sampled_from(["channelID", "version", "code"]),
                      st.one_of(st.text(max_size=40), st.integers(), st.uuids().map(str))), max_size=3)),
                  "version": st.one_of(st.text(max_size=40), st.integers()),
                  "code": st.one_of(st.integers(), st.text(max_size=5), st.booleans()),
                  "broadcasts": st.one_of(st.dictionaries(st.text(max_size=5), st.text(max_size=5)), st.integers()),
                  "channelIDs": st.lists(st.uuids().map(str), max_size=5),
                  "url": st.one_of(st.none(), st.text(max_size=40), st.just("https://gw.example/"), st.integers()),
                  "token": st.one_of(st.none(), st.text(max_size=40), st.binary(max_size=600).map(b64e),
                                     st.integers())}).map(json.dumps),
    st.just("{}"),
)


@given(st.lists(st.tuples(_MESSAGE, st.floats(min_value=0, max_value=100)), max_size=12))
def test_any_messages_never_raise_and_close_once(messages: list[tuple[str, float]]) -> None:
    backend = MemoryAgents()
    s = Session(backend, Limits(channels_max=2), 0.0)
    closes = 0
    now = 0.0
    for text, step in messages:
        now += step
        out = s.receive_text(text, now)
        out += [Send(t) for t in s.poll()]
        for o in out:
            if isinstance(o, Send):
                assert isinstance(json.loads(o.text), dict)
            if isinstance(o, Close):
                closes += 1
                assert o is out[-1] or all(not isinstance(x, Send) for x in out[out.index(o):])
        if closes:
            assert s.state == SessionState.CLOSED
    assert closes <= 1
