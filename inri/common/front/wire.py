"""A connection's bytes: any trio stream, and a faster way for plain TCP sockets.

Why the socket's file descriptor (measured, issue 16 item 2): trio's stream methods yield to the
scheduler on every call, even when the data is there or the socket buffer has room. On a plain
`trio.SocketStream` the front reads and writes the descriptor itself and waits (trio's wait_readable /
wait_writable) only when there is nothing to read or no room to write; a committed push's 202 is then
written by the committing task in one call, without waking the connection's task. Every other stream
(`trio.SSLStream`, the memory streams of the tests) goes through its own async methods, unchanged.
"""

from __future__ import annotations

import os

import trio

__all__ = ["CLOSED_ERRORS", "Closed", "FdWire", "RECEIVE_BYTES", "Wire", "wire_for"]

RECEIVE_BYTES = 65536


class Closed(Exception):
    """The client closed the connection or broke the protocol mid-request: stop serving it."""


# What ends a connection without being an error of ours.
CLOSED_ERRORS = (Closed, trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class Wire:
    """A connection's byte stream through its trio Stream methods."""

    __slots__ = ("closed", "stream")
    sync = False  # True: try_send can write without waiting (the after-commit answers rely on it)

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.closed = False

    async def handshake(self) -> None:
        """The TLS handshake, for a trio.SSLStream (nothing to do for others)."""
        if isinstance(self.stream, trio.SSLStream):
            await self.stream.do_handshake()

    def try_receive(self) -> bytes | None:
        """Bytes available now without waiting, b"" at the end, None when a read would wait."""
        return None

    async def receive(self, *, wait_first: bool = False) -> bytes:
        """Some bytes (b"" at the end of the stream). wait_first: data is unlikely to be there yet."""
        data = await self.stream.receive_some(RECEIVE_BYTES)
        return data if type(data) is bytes else bytes(data)  # memory streams hand out bytearrays

    def try_send(self, data: bytes) -> int:
        """Bytes of data written now without waiting (0 for a stream that cannot)."""
        return 0

    async def send(self, data: bytes) -> None:
        """All of data."""
        await self.stream.send_all(data)

    async def send_eof(self) -> None:
        """Half-close (TCP FIN) where the stream can; a TLS stream cannot, and then keeps going."""
        if isinstance(self.stream, trio.abc.HalfCloseableStream):
            await self.stream.send_eof()

    async def aclose(self) -> None:
        """Close, waiting at most a second for a TLS close_notify to leave."""
        self.closed = True
        with trio.move_on_after(1.0):
            await self.stream.aclose()
            return
        await trio.aclose_forcefully(self.stream)


class FdWire(Wire):
    """A plain TCP connection read and written on its descriptor (module docstring)."""

    __slots__ = ("fd",)
    sync = True

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream)
        self.fd = stream.socket.fileno()

    def try_receive(self) -> bytes | None:
        if self.closed:
            raise trio.ClosedResourceError("connection closed")
        try:
            return os.read(self.fd, RECEIVE_BYTES)
        except BlockingIOError:
            return None

    async def receive(self, *, wait_first: bool = False) -> bytes:
        while True:
            if wait_first:
                wait_first = False
            else:
                data = self.try_receive()
                if data is not None:
                    return data
            await trio.lowlevel.wait_readable(self.fd)

    def try_send(self, data: bytes) -> int:
        # Never write a descriptor after close: its number may already belong to another connection.
        if self.closed:
            raise trio.ClosedResourceError("connection closed")
        try:
            return os.write(self.fd, data)
        except BlockingIOError:
            return 0

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self.try_send(view)  # type: ignore[arg-type]  # os.write takes any buffer
            if n:
                view = view[n:]
            else:
                await trio.lowlevel.wait_writable(self.fd)


def wire_for(stream: trio.abc.Stream) -> Wire:
    """The fastest wire for stream: its descriptor for a plain TCP socket, its methods otherwise."""
    if type(stream) is trio.SocketStream:
        return FdWire(stream)
    return Wire(stream)
