"""A raw Mozilla Push client for tests and benchmarks: wsproto frames over a trio TCP stream, the protocol's
JSON written by hand from its description (docs/browsers.md), no push library. One idle client holds
only its socket and a small object (no task), so a benchmark can open thousands."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)


@dataclass(frozen=True)
class Closed:
    """The server closed the connection (code; 1006: the socket ended without a close frame)."""

    code: int
    reason: str = ""


class MPClient:
    """One WebSocket connection speaking the protocol (see the module docstring)."""

    def __init__(self, stream: trio.SocketStream, ws: WSConnection) -> None:
        self.stream, self.ws = stream, ws
        self.text: list[str] = []
        self.subprotocol: str | None = None
        self.pongs = 0

    @classmethod
    async def connect(cls, url: str, subprotocols: tuple[str, ...] = ("push-notification",)) -> MPClient:
        u = urlsplit(url)
        stream = await trio.open_tcp_stream(u.hostname or "127.0.0.1", u.port or 80)
        ws = WSConnection(ConnectionType.CLIENT)
        client = cls(stream, ws)
        await stream.send_all(ws.send(Request(host=f"{u.hostname}:{u.port}", target=u.path or "/",
                                              subprotocols=list(subprotocols))))
        while True:
            data = await stream.receive_some(65536)
            if not data:
                raise ConnectionError("closed during the handshake")
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    client.subprotocol = event.subprotocol
                    return client
                if isinstance(event, RejectConnection):
                    raise ConnectionError(f"refused: HTTP {event.status_code}")

    async def send(self, message: dict[str, Any] | str) -> None:
        text = message if isinstance(message, str) else json.dumps(message)
        await self.stream.send_all(self.ws.send(TextMessage(data=text)))

    async def send_bytes(self, data: bytes) -> None:
        await self.stream.send_all(self.ws.send(BytesMessage(data=data)))

    async def ping(self, payload: bytes = b"p") -> None:
        """A WebSocket (not application) ping; the answer counts in `pongs`."""
        await self.stream.send_all(self.ws.send(Ping(payload=payload)))

    async def recv(self) -> dict[str, Any] | Closed:
        """The next message as JSON, or Closed."""
        while True:
            for event in self.ws.events():
                if isinstance(event, TextMessage):
                    self.text.append(event.data)
                    if event.message_finished:
                        text, self.text = "".join(self.text), []
                        got: dict[str, Any] = json.loads(text)
                        return got
                elif isinstance(event, CloseConnection):
                    try:
                        await self.stream.send_all(self.ws.send(event.response()))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    return Closed(event.code, event.reason or "")
                elif isinstance(event, Pong):
                    self.pongs += 1
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                return Closed(1006)
            self.ws.receive_data(data)

    async def hello(self, uaid: str | None = None, **extra: Any) -> dict[str, Any]:
        msg: dict[str, Any] = {"messageType": "hello", "use_webpush": True, "broadcasts": {}, **extra}
        if uaid is not None:
            msg["uaid"] = uaid
        await self.send(msg)
        got = await self.recv()
        assert isinstance(got, dict), got
        return got

    async def aclose(self) -> None:
        await self.stream.aclose()
