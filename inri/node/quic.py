"""Relay-to-relay links: aioquic driven sans-IO from trio, each side authenticated by its node key.

One `QuicEndpoint` owns one UDP socket. A receive task routes datagrams to connections by connection
id; each connection has one task that sleeps until its aioquic timer or a wake-up (new datagram, data
to send), then runs timers, drains events and transmits (the pattern of hypercorn's trio UDP server
and dnspython's trio QUIC client).

Key binding (docs/protocol.md, "Links"):
- The server's TLS certificate is self-signed with its Ed25519 node key, so the TLS handshake itself
  (CertificateVerify) proves the server holds that key; the client reads the key off the certificate
  and refuses the link when its node id is not the one it dialled.
- The client proves its own node key in the first frame on stream 0: a signature over a context
  string, the server's certificate key, its own key and its listen address. Binding the server's key
  into the signature means a man in the middle (who must present its own certificate) cannot reuse
  the proof toward the real server. The server answers with an "ok" frame; only then is the link up.

Frames on stream 0 are length-prefixed (4 bytes, big-endian) and at most `limits.MAX_FRAME_BYTES`;
a larger prefix closes the link (a peer cannot make us buffer more than one frame).

Coalescing (issue 16): frames queued on a link are collected, not written to aioquic one by one. The
connection task, once woken, yields one scheduling round so that every task made runnable in the
same round (each forwarding a push, answering a receipt) adds its frames, then hands them to aioquic
in one stream write and asks for datagrams once: frames produced in one round leave in as few
datagrams as QUIC packs them into (about 1,200 bytes each), not one datagram per frame. The receive
loop reads every datagram waiting on the socket (up to RECV_BATCH) before it yields, and hands the
frames they complete straight to the link's handler (Link.deliver_to); once the burst is read, it
transmits what the burst made each connection send (forwarded frames, acknowledgements due) itself,
for every connection whose task sleeps, and only moves that task's timer (QuicEndpoint.touch,
_transmit_burst): no task switch per burst. Datagrams are read and sent without a trio yield each (a
non-blocking dup of the socket). Acknowledgements wait ACK_DELAY_S (10 ms, not aioquic's 1 ms) so
that one ACK covers many packets, and one that waits leaves in the first packet of any data sent
meanwhile (_Connection.flush): an answer carries the ACK of what it answers. On Linux, consecutive
same-size datagrams to one peer leave in one sendmsg with UDP GSO (_send_nowait), off for the
endpoint once the kernel refuses it.

Lab impairment (`LinkImpairment`, `[quic] link_delay_ms / link_jitter_ms / link_loss`, `inri mesh up
--link-delay-ms ...`): the endpoint itself delays every datagram it sends by delay +- jitter (uniform)
and drops a share `loss` of them, so a mesh on loopback has links with a one-way delay, jitter and
loss without the kernel's netem. Both ends impair what they send: each direction of every link gets
the setting. QUIC sees a lossy path and recovers (retransmission after its probe timeout), as it would
on a real one. Never for production relays: off (all 0) by default.
"""

from __future__ import annotations

import datetime
import errno
import ipaddress
import math
import os
import random
import socket
import ssl
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import structlog
import trio
from aioquic import tls
from aioquic._buffer import Buffer  # aioquic.buffer re-exports it without __all__
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection, QuicConnectionState
from aioquic.quic.packet import PACKET_TYPE_INITIAL, pull_quic_header
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from inri.common.addr import format_addr, parse_addr
from inri.common.identity import NodeIdentity
from inri.node.regref import ALPN_REGREF, DEFINE, REF, RegRefError, RegRefReceiver, RegRefSender
from inri.protocol import keys, limits

_REGREF_KINDS = (REF, DEFINE)  # the link frames of inri/2; anything else goes to the relay as it is
ALPN = "inri/1"  # the link protocol; inri/2 adds registration references (regref.py)
AUTH_CONTEXT = b"inri/link-auth/v1\x00"
AUTH_TIMEOUT_S = 5.0  # an inbound connection that has not proved its key by then is dropped
MAX_CONNECTIONS = 512  # per endpoint: bounds memory a flood of handshakes can take
# How long aioquic waits before acknowledging a packet (its default: 1 ms, below any round trip, so
# each packet got an ACK-only datagram of its own). 10 ms, within the 25 ms max_ack_delay it
# advertises: one ACK covers the packets of 10 ms, and it rides on the answer (a receipt back on the
# link a push came in on) when one leaves in time. Data is never delayed: only acknowledgements.
ACK_DELAY_S = 0.010
RECV_BATCH = 64  # datagrams read back to back (no yield between them) before the receive loop yields
# UDP GSO (_send_nowait): Linux's UDP_SEGMENT option (netinet/udp.h; Python's socket module has no
# name for it), at most UDP_MAX_SEGMENTS datagrams per call and one IP datagram's worth of bytes.
UDP_SEGMENT = 103
GSO_MAX_SEGMENTS = 64
GSO_MAX_BYTES = 60_000
_SEGMENT_SIZE = struct.Struct("=H")
# What sendmsg raises when the kernel or the device cannot segment (old kernel, no checksum offload).
_GSO_REFUSED = frozenset((errno.EINVAL, errno.EIO, errno.EMSGSIZE, errno.ENOPROTOOPT, errno.EOPNOTSUPP))
RECV_QUEUE_BYTES = 16 * 1024 * 1024  # frames buffered per link, unread, before it is closed as overloaded
_LEN = struct.Struct(">I")
log = structlog.get_logger("inri.quic")
_STREAM = 0  # the client's first bidirectional stream carries every frame
_CID_BYTES = 8  # the length of the connection ids this endpoint issues (aioquic's default)


# Rule C6: a link whose probe timeout fired this many times in a row (PTO, then the doubled PTO: about
# 3 x (RTT + 26 ms) after the last frame sent on it) reports its peer unresponsive (Link.on_unresponsive).
UNACKED_PTO_COUNT = 2


@dataclass(frozen=True, slots=True)
class LinkImpairment:
    """Lab only: what the endpoint does to every datagram it sends (module docstring)."""

    delay_s: float = 0.0  # one-way delay added to each datagram
    jitter_s: float = 0.0  # +- uniform around delay_s (never below 0): datagrams may overtake each other
    loss: float = 0.0  # share of datagrams dropped, independently

    def __post_init__(self) -> None:
        if not (self.delay_s >= 0 and self.jitter_s >= 0 and 0 <= self.loss < 1):
            raise ValueError("link impairment needs delay >= 0, jitter >= 0 and 0 <= loss < 1")

    @property
    def active(self) -> bool:
        return bool(self.delay_s or self.jitter_s or self.loss)


class ConnectError(Exception):
    """A link could not be opened: timeout, refusal, or the peer is not the node we dialled."""


class LinkClosed(Exception):
    """The link is gone (peer closed, idle timeout, protocol error, or we closed it)."""


def _certificate(identity: NodeIdentity) -> tuple[Any, Any]:
    """A self-signed certificate over the node key (the key binding, not a CA trust chain)."""
    key = Ed25519PrivateKey.from_private_bytes(identity.seed)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity.node_id)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .sign(key, None)
    )
    return cert, key


def _peer_key(quic: QuicConnection) -> bytes | None:
    # aioquic exposes no public accessor for the peer certificate; tls.Context keeps it here.
    cert = getattr(quic.tls, "_peer_certificate", None)
    if cert is None:
        return None
    try:
        return bytes(cert.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    except (ValueError, TypeError, AttributeError):
        return None  # not an Ed25519 certificate: not an INRI relay


_OK = msgpack.packb(["ok"])


def parse_auth(frame: bytes, server_key: bytes) -> tuple[bytes, str] | None:
    """A client's key proof -> (client key, listen addr), or None when it is anything else.

    Valid: msgpack [key (32 B), listen_addr (str), signature over _auth_bytes(server_key, key,
    listen_addr)] from a key other than the server's own.
    """
    try:
        msg = msgpack.unpackb(frame, raw=False, use_list=True)
    except Exception:  # noqa: BLE001 - any garbage is an auth failure, never a crash
        return None
    if not (isinstance(msg, list) and len(msg) == 3):
        return None
    key, addr, sig = msg
    if not (isinstance(key, bytes) and len(key) == limits.KEY_BYTES and key != server_key):
        return None
    if not (isinstance(addr, str) and len(addr) <= limits.MAX_ADDR_CHARS and isinstance(sig, bytes)):
        return None
    if not keys.verify(key, _auth_bytes(server_key, key, addr), sig):
        return None
    return key, addr


def _auth_bytes(server_key: bytes, client_key: bytes, listen_addr: str) -> bytes:
    return AUTH_CONTEXT + server_key + client_key + listen_addr.encode()


class Link:
    """One authenticated relay-to-relay connection carrying whole frames (bytes) both ways.

    `send` queues the frame in aioquic and wakes the connection task (QUIC flow control paces the
    wire; the caller bounds what it queues). `receive` waits for the next frame and raises LinkClosed
    once the connection is gone.
    """

    def __init__(self, conn: _Connection, peer_key: bytes, listen_addr: str, outbound: bool) -> None:
        self._conn = conn
        self.peer_key = peer_key
        self.peer_node_id = keys.node_id_for(peer_key)
        self.remote_addr = format_addr(*conn.addr[:2])
        self.listen_addr = listen_addr  # where the peer accepts links ("" if it said none)
        self.outbound = outbound
        self.opened_at = time.monotonic()

    async def send(self, frame: bytes) -> None:
        """Queue one frame (at most limits.MAX_FRAME_BYTES); raises LinkClosed when the link is gone."""
        self._conn.send_frame(frame)
        await trio.lowlevel.checkpoint()

    def send_nowait(self, frame: bytes, reg: bytes | None = None) -> None:
        """Queue one frame without yielding (raises LinkClosed when the link is gone).

        reg: a push frame's registration (the msgpack bytes it ends with), which an `inri/2` link
        sends once and then refers to (node/regref.py)."""
        if reg is None:
            self._conn.send_frame(frame)
        else:
            self._conn.send_push(frame, reg)

    @property
    def regref(self) -> bool:
        """True when this link refers to registrations it sent before (link protocol inri/2)."""
        return self._conn.regref_tx is not None

    @property
    def send_backlog(self) -> int:
        """Bytes queued to the peer and not yet acknowledged by it (what a send queue bound limits)."""
        return self._conn.send_backlog()

    @property
    def rtt(self) -> dict[str, float] | None:
        """aioquic's round-trip estimate of this link in ms (RFC 9002: `smoothed`, `variance`, `min`, and
        `pto`, its probe timeout: how late a lost packet's data arrives), None before its first sample."""
        loss = self._conn.quic._loss  # noqa: SLF001 - aioquic has no public accessor for its RTT estimate
        if not loss._rtt_initialized:  # noqa: SLF001 - see above
            return None
        return {"smoothed": round(loss._rtt_smoothed * 1000, 2), "variance": round(loss._rtt_variance * 1000, 2),  # noqa: SLF001
                "min": round(loss._rtt_min * 1000, 2), "pto": round(loss.get_probe_timeout() * 1000, 2)}  # noqa: SLF001

    def receive_nowait(self) -> bytes | None:
        """The next frame if one has arrived (None: none yet); raises LinkClosed once the link is gone."""
        try:
            frame = self._conn.frames_rx.receive_nowait()
        except trio.WouldBlock:
            return None
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise LinkClosed(self._conn.close_reason) from None
        self._conn.queued -= len(frame)
        return frame

    def on_unresponsive(self, handler: Callable[[], None]) -> None:
        """Call handler when the peer stops acknowledging: QUIC's probe timeout fired UNACKED_PTO_COUNT
        times in a row (rule C6, docs/protocol.md); again after it acknowledged something meanwhile."""
        self._conn.on_unresponsive = handler

    def deliver_to(self, handler: Callable[[bytes], None]) -> None:
        """From now on, hand every frame to handler as soon as it arrives (frames already queued first),
        in the task that reads the datagrams; `receive` then only waits for the link to close."""
        while (frame := self.receive_nowait()) is not None:
            handler(frame)
        self._conn.on_frame = handler

    async def receive(self) -> bytes:
        """The next frame from the peer."""
        try:
            frame = await self._conn.frames_rx.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise LinkClosed(self._conn.close_reason) from None
        self._conn.queued -= len(frame)
        return frame

    @property
    def closed(self) -> bool:
        return self._conn.closed

    async def aclose(self, reason: str = "closed") -> None:
        """Close the connection (the peer sees LinkClosed)."""
        self._conn.close(reason)
        await trio.lowlevel.checkpoint()


class _Connection:
    """One aioquic connection and the state our link protocol keeps on it."""

    def __init__(self, endpoint: QuicEndpoint, quic: QuicConnection, addr: tuple[Any, ...], outbound: bool) -> None:
        self.endpoint = endpoint
        self.quic = quic
        self.addr = addr
        self.outbound = outbound
        self.wake = trio.Event()
        self.closed = False
        self.close_reason = ""
        self.rx_buf = bytearray()
        self.handshake_done = trio.Event()
        self.authed: Link | None = None
        self.auth_result = trio.Event()
        send, recv = trio.open_memory_channel[bytes](math.inf)
        self.frames_tx = send
        self.frames_rx = recv
        self.queued = 0
        self.tx: list[bytes] = []  # frames (length prefix, frame, ...) queued since the last flush
        self.tx_bytes = 0
        self.pending_close: tuple[int, str] | None = None  # (error code, reason) for the next round
        # Set by Link.deliver_to: frames go to this callback as they are parsed, not through frames_rx
        # (no task switch per frame batch).
        self.on_frame: Callable[[bytes], None] | None = None
        self.on_unresponsive: Callable[[], None] | None = None  # Link.on_unresponsive (rule C6)
        self.unresponsive_reported = False
        # While the connection task sleeps: the cancel scope of its sleep, whose deadline is aioquic's
        # timer. The receive loop transmits for a sleeping connection itself and only moves that
        # deadline (QuicEndpoint._transmit_burst): no task switch per burst of datagrams.
        self.sleep_scope: trio.CancelScope | None = None
        # Datagrams aioquic produced that the socket had no room for (sent first, by the connection task).
        self.unsent: list[tuple[bytes, tuple[Any, ...]]] = []
        # Registration references (regref.py), once the handshake chose inri/2.
        self.regref_tx: RegRefSender | None = None
        self.regref_rx: RegRefReceiver | None = None

    # -- driving aioquic --------------------------------------------------------------------------

    def poke(self) -> None:
        self.wake.set()

    def send_frame(self, frame: bytes) -> None:
        if self.closed:
            raise LinkClosed(self.close_reason)
        if len(frame) > limits.MAX_FRAME_BYTES:
            raise ValueError(f"frame of {len(frame)} bytes exceeds {limits.MAX_FRAME_BYTES}")
        if not self.tx:
            self.endpoint.touch(self)  # flushed once per scheduling round or receive burst (module docstring)
        self.tx += (_LEN.pack(len(frame)), frame)
        self.tx_bytes += 4 + len(frame)

    def send_push(self, frame: bytes, reg: bytes) -> None:
        """send_frame for a push frame ending with its registration reg: by reference on an inri/2 link."""
        tx = self.regref_tx
        if (tx is not None and not self.closed and frame.endswith(reg)
                and len(frame) + 6 <= limits.MAX_FRAME_BYTES):  # the table changes only for a frame sent
            whole = len(frame)
            frame = tx.pack(frame, reg)
            stats = self.endpoint.stats
            stats["regref_sent"] += 1
            if frame[0] != REF:
                stats["regref_defined"] += 1
            stats["regref_bytes_saved"] += whole - len(frame)
        self.send_frame(frame)

    def flush(self) -> None:
        """Hand every queued frame to aioquic in one stream write; an acknowledgement that is waiting
        (ACK_DELAY_S) leaves with them, in their first packet, rather than alone later."""
        if self.tx and not self.closed:
            quic = self.quic
            quic.send_stream_data(_STREAM, b"".join(self.tx))
            # aioquic writes an ACK frame into a 1-RTT packet only once its delay is over (space.ack_at);
            # acknowledging earlier is always allowed (RFC 9000 13.2.1), and costs nothing here.
            space = quic._spaces.get(tls.Epoch.ONE_RTT)  # noqa: SLF001 - no public way to ask for it
            if space is not None and space.ack_at is not None and quic._handshake_complete:  # noqa: SLF001
                space.ack_at = min(space.ack_at, trio.current_time())
        self.tx.clear()
        self.tx_bytes = 0

    def send_backlog(self) -> int:
        # aioquic keeps every byte written to a stream until the peer acknowledges it and has no
        # public accessor for that amount; its stream sender tracks it as [_buffer_start, _buffer_stop).
        stream = self.quic._streams.get(_STREAM)  # noqa: SLF001 - see above
        if stream is None:
            return self.tx_bytes
        sender = stream.sender
        return self.tx_bytes + int(sender._buffer_stop - sender._buffer_start)  # noqa: SLF001 - see above

    def close(self, reason: str, error_code: int = 0) -> None:
        if not self.closed:
            # Frames queued before the close (an error frame that explains it) go out first: aioquic
            # sends nothing but CONNECTION_CLOSE once close() is called, so the connection task
            # transmits the flushed stream data, then closes (delivery stays best effort: a lost
            # packet is not retransmitted after the close).
            self.flush()
            self.close_reason = reason
            self.pending_close = (error_code, reason[:100])
            self.poke()
            self._mark_closed(reason)

    def _mark_closed(self, reason: str) -> None:
        self.closed = True
        self.close_reason = self.close_reason or reason
        self.frames_tx.close()
        self.handshake_done.set()
        self.auth_result.set()

    async def run(self) -> None:
        """Drive this connection until it terminates."""
        ep = self.endpoint
        try:
            await self._drive()
        except Exception as exc:  # noqa: BLE001 - a broken connection ends itself, never the endpoint
            ep.stats["connection_errors"] = ep.stats.get("connection_errors", 0) + 1
            log.warning("connection failed", error=repr(exc)[:200])
            self.close_reason = self.close_reason or "internal error"
        finally:
            self._mark_closed(self.close_reason or "terminated")
            ep.forget(self)

    async def _drive(self) -> None:
        ep = self.endpoint
        while True:
            # A fresh event before transmitting: a poke during the awaits below is never lost.
            self.wake = trio.Event()
            self.flush()
            await ep.transmit(self)
            if self.pending_close is not None:
                code, phrase = self.pending_close
                self.pending_close = None
                self.quic.close(error_code=code, reason_phrase=phrase)
                await ep.transmit(self)
            # aioquic has no public "terminated" flag; the state leaves CLOSING/DRAINING for this.
            if self.quic._state == QuicConnectionState.TERMINATED:  # noqa: SLF001 - see above
                break
            timer = self.quic.get_timer()
            with trio.move_on_at(timer if timer is not None else math.inf) as scope:
                self.sleep_scope = scope
                try:
                    await self.wake.wait()
                finally:
                    self.sleep_scope = None
            # One more round: tasks woken with us (forwarding pushes, answering receipts) queue their
            # frames too, and all of them go out in one flush.
            await trio.lowlevel.cancel_shielded_checkpoint()
            now = trio.current_time()
            timer = self.quic.get_timer()  # the receive loop may have moved it meanwhile
            if timer is not None and now >= timer:
                self.quic.handle_timer(now)
                self._check_acknowledged()
            self.process_events()

    def _check_acknowledged(self) -> None:
        """Rule C6: report the peer unresponsive once QUIC's probe timeout has fired UNACKED_PTO_COUNT
        times in a row (nothing acknowledged meanwhile: aioquic resets the count on every ACK). aioquic
        has no public accessor for the count; its loss recovery keeps it as _pto_count."""
        count = int(self.quic._loss._pto_count)  # noqa: SLF001 - see above
        if count < UNACKED_PTO_COUNT:
            self.unresponsive_reported = False
        elif not self.unresponsive_reported and not self.closed:
            self.unresponsive_reported = True
            if self.on_unresponsive is not None:
                self.on_unresponsive()

    def process_events(self) -> None:
        while True:
            ev = self.quic.next_event()
            if ev is None:
                break
            if isinstance(ev, events.HandshakeCompleted):
                if ev.alpn_protocol == ALPN_REGREF:
                    self.regref_tx, self.regref_rx = RegRefSender(), RegRefReceiver()
                self.handshake_done.set()
            elif isinstance(ev, events.StreamDataReceived):
                if ev.stream_id != _STREAM:
                    self.close("unexpected stream", error_code=1)
                    return
                self.rx_buf += ev.data
                self._drain_frames()
            elif isinstance(ev, events.ConnectionIdIssued):
                self.endpoint.cids[ev.connection_id] = self
            elif isinstance(ev, events.ConnectionIdRetired):
                self.endpoint.cids.pop(ev.connection_id, None)
            elif isinstance(ev, events.ConnectionTerminated):
                self._mark_closed(ev.reason_phrase or f"terminated (error {ev.error_code})")
        # The peer closed the connection: aioquic reports it (ConnectionTerminated) only once its draining
        # period ends, three probe timeouts later, but nothing sent on the link arrives any more. Closed
        # now: a relay that restarted and whose link a neighbour refused as a duplicate saw it up for
        # that long, and pushes it sent on it waited for a custody re-send (issue 43). aioquic has no
        # public accessor for the state or the close it received.
        if not self.closed and self.quic._state is QuicConnectionState.DRAINING:  # noqa: SLF001 - see above
            got = self.quic._close_event  # noqa: SLF001 - see above
            self._mark_closed(got.reason_phrase if got is not None and got.reason_phrase else "closed by the peer")

    def _drain_frames(self) -> None:
        buf = self.rx_buf
        pos = 0  # frames are sliced at an offset and the buffer trimmed once: no memmove per frame
        end = len(buf)
        try:
            while end - pos >= 4 and not self.closed:
                (n,) = _LEN.unpack_from(buf, pos)
                if n > limits.MAX_FRAME_BYTES:
                    self.close("frame too large", error_code=2)
                    return
                if end - pos < 4 + n:
                    return
                frame = bytes(buf[pos + 4 : pos + 4 + n])
                pos += 4 + n
                if self.authed is None:
                    self._handle_auth(frame)
                    continue
                if self.regref_rx is not None and frame and frame[0] in _REGREF_KINDS:  # inri/2 (regref.py)
                    try:
                        frame = self.regref_rx.expand(frame)
                    except RegRefError as exc:
                        log.warning("link protocol violation", error=str(exc))
                        self.close(str(exc)[:100], error_code=5)
                        return
                if self.on_frame is not None:
                    try:
                        self.on_frame(frame)
                    except Exception:  # the handler's bug must not break the connection
                        log.exception("frame handler failed", size=n)
                else:
                    if self.queued + n > RECV_QUEUE_BYTES:
                        self.close("receive queue overloaded", error_code=3)
                        return
                    self.queued += n
                    self.frames_tx.send_nowait(frame)
        finally:
            del buf[:pos]

    def _handle_auth(self, frame: bytes) -> None:
        ep = self.endpoint
        if self.outbound:
            if frame == _OK:
                key = _peer_key(self.quic)
                if key is not None:
                    self.authed = Link(self, key, format_addr(*self.addr[:2]), outbound=True)
                    self.auth_result.set()
                    return
            self.close("link auth refused", error_code=4)
            return
        proof = parse_auth(frame, ep.identity.public_key)
        if proof is None:
            self.close("bad link auth", error_code=4)
            return
        self.send_frame(msgpack.packb(["ok"]))
        self.authed = Link(self, proof[0], proof[1], outbound=False)
        self.auth_result.set()
        ep.spawn_link(self.authed)


class QuicEndpoint:
    """One UDP socket, every QUIC connection on it, and the key that authenticates them."""

    def __init__(self, identity: NodeIdentity, *, idle_timeout_s: float = 30.0, listen_addr: str = "",
                 impairment: LinkImpairment | None = None, rng: random.Random | None = None,
                 regref: bool = True) -> None:
        self.identity = identity
        self.regref = regref  # offer link protocol inri/2 (registration references; [quic] registration_refs)
        # Lab link impairment (module docstring); None or all 0: datagrams leave at once, as in production.
        self.impairment = impairment if impairment is not None and impairment.active else None
        self._rng = rng or random.Random()
        self.idle_timeout_s = idle_timeout_s
        self.listen_addr = listen_addr  # announced to peers we dial; set from bind() when empty
        self.cids: dict[bytes, _Connection] = {}
        self._conns: set[_Connection] = set()
        self._sock: trio.socket.SocketType | None = None
        # The same UDP socket (a dup of its descriptor, non-blocking) for reads and writes that do not
        # pass through trio's scheduler: trio's socket methods yield once per datagram; these wait
        # (wait_readable / wait_writable) only when the socket has nothing to read or no room.
        self._raw: socket.socket | None = None
        self._nursery: trio.Nursery | None = None
        self._on_link: Callable[[Link], Awaitable[None]] | None = None
        self.local_addr: tuple[str, int] = ("", 0)
        cert, key = _certificate(identity)
        self._server_config = self._config(is_client=False)
        self._server_config.certificate = cert
        self._server_config.private_key = key
        self._client_config = self._config(is_client=True)
        self.stats = {"datagrams_in": 0, "datagrams_out": 0, "send_calls": 0, "bad_datagrams": 0, "refused": 0,
                      "regref_sent": 0, "regref_defined": 0, "regref_bytes_saved": 0,
                      "datagrams_impaired_lost": 0}
        # UDP GSO (_send_nowait): on Linux until the kernel refuses it once; datagrams per call at most.
        self.gso = sys.platform == "linux"
        self.gso_max_segments = GSO_MAX_SEGMENTS
        self.gso_max_bytes = GSO_MAX_BYTES
        # Connections with something to transmit since the receive loop started its current burst of
        # datagrams (None outside a burst): it transmits for them once the burst is read (touch).
        self._burst: dict[_Connection, None] | None = None

    def _config(self, *, is_client: bool) -> QuicConfiguration:
        alpn = [ALPN_REGREF, ALPN] if self.regref else [ALPN]  # the first both sides speak (the server's order)
        cfg = QuicConfiguration(is_client=is_client, alpn_protocols=alpn, idle_timeout=self.idle_timeout_s)
        if is_client:
            cfg.verify_mode = ssl.CERT_NONE  # we check the key binding ourselves (_peer_key)
        return cfg

    async def bind(self, host: str, port: int) -> None:
        """Open the UDP socket (port 0: ephemeral; read local_addr)."""
        family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
        sock = trio.socket.socket(family, trio.socket.SOCK_DGRAM)
        await sock.bind((host, port))
        self._sock = sock
        self._raw = socket.socket(fileno=os.dup(sock.fileno()))
        self._raw.setblocking(False)
        self.local_addr = sock.getsockname()[:2]
        if not self.listen_addr:
            self.listen_addr = format_addr(*self.local_addr)

    async def serve(
        self,
        on_link: Callable[[Link], Awaitable[None]] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the receive loop until cancelled; each authenticated inbound link runs on_link(link).

        With on_link None, inbound links are refused (a client-only endpoint, e.g. a probe).
        """
        if self._sock is None:
            raise RuntimeError("bind() first")
        self._on_link = on_link
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._receive_loop()
        finally:
            self._nursery = None
            for conn in list(self._conns):
                conn.close("endpoint closed")
            self._sock.close()
            if self._raw is not None:
                self._raw.close()

    async def _receive_loop(self) -> None:
        """Read datagrams: every one that is waiting (up to RECV_BATCH) before yielding, each handed to
        its connection at once; the connections transmit what they answer once per round (coalescing)."""
        raw = self._raw
        assert raw is not None
        while True:
            await trio.lowlevel.wait_readable(raw)
            burst: dict[_Connection, None] = {}
            self._burst = burst
            more = True
            try:
                for _ in range(RECV_BATCH):
                    try:
                        data, addr = raw.recvfrom(65536)
                    except BlockingIOError:
                        more = False
                        break
                    except ConnectionResetError:
                        continue  # an ICMP port-unreachable from an earlier send: not fatal on UDP
                    self._datagram(data, addr)
            finally:
                self._burst = None
            self._transmit_burst(burst)
            if more:
                await trio.lowlevel.checkpoint()  # more are waiting: the other tasks run first

    def touch(self, conn: _Connection) -> None:
        """conn has something to transmit: during a receive burst, at its end (_transmit_burst); otherwise
        its task transmits, after one more scheduling round (module docstring)."""
        if self._burst is not None:
            self._burst[conn] = None
        else:
            conn.wake.set()

    def _transmit_burst(self, burst: dict[_Connection, None]) -> None:
        """Once a burst of datagrams is read: what the connections it touched have to send (the frames the
        burst made, acknowledgements due) leaves now, from this task, for each connection whose task
        sleeps (then only its timer moves); any other, or one with anything unusual to do (closing, lab
        impairment, a full socket), is left to its task."""
        raw = self._raw
        for conn in burst:
            scope = conn.sleep_scope
            if (scope is None or conn.closed or conn.unsent or self.impairment is not None or raw is None
                    or conn.quic._state is not QuicConnectionState.CONNECTED):  # noqa: SLF001 - see _drive
                conn.wake.set()
                continue
            try:
                conn.flush()
                out = conn.quic.datagrams_to_send(now=trio.current_time())
            except Exception:  # noqa: BLE001 - the connection's task meets it again and ends the connection
                conn.wake.set()
                continue
            if out:
                rest = self._send_nowait(out)
                if rest:
                    conn.unsent = rest  # no room in the socket's buffer: the task waits for it
                    conn.wake.set()
            timer = conn.quic.get_timer()
            deadline = timer if timer is not None else math.inf
            if deadline != scope.deadline:  # each change is a heap entry in trio's deadline queue
                scope.deadline = deadline

    def _datagram(self, data: bytes, addr: Any) -> None:
        """One datagram from addr: to its connection (a new one for a valid Initial packet)."""
        self.stats["datagrams_in"] += 1
        # Most datagrams are 1-RTT packets (short header: first bit 0), whose destination connection id
        # (ours, _CID_BYTES long) follows the first byte: looked up without parsing the header.
        conn = self.cids.get(data[1 : 1 + _CID_BYTES]) if len(data) > _CID_BYTES and not data[0] & 0x80 else None
        if conn is None:
            try:
                header = pull_quic_header(Buffer(data=data), host_cid_length=_CID_BYTES)
            except ValueError:
                self.stats["bad_datagrams"] += 1
                return
            conn = self.cids.get(header.destination_cid)
        if conn is None:
            if (
                self._on_link is None
                or header.packet_type != PACKET_TYPE_INITIAL
                or header.version not in self._server_config.supported_versions
                or len(data) < 1200
                or len(self._conns) >= MAX_CONNECTIONS
            ):
                self.stats["refused"] += 1
                return
            quic = QuicConnection(
                configuration=self._server_config, original_destination_connection_id=header.destination_cid
            )
            conn = self._add(quic, addr, outbound=False)
            self.cids[header.destination_cid] = conn
            assert self._nursery is not None
            self._nursery.start_soon(self._expire_unauthed, conn)
        try:
            conn.quic.receive_datagram(data, addr, trio.current_time())
            conn.process_events()
        except Exception as exc:  # noqa: BLE001 - one bad datagram must never end the endpoint
            self.stats["bad_datagrams"] += 1
            log.warning("datagram broke a connection", error=repr(exc)[:200])
            conn.quic.close(error_code=0x1, reason_phrase="internal error")
        self.touch(conn)

    def _add(self, quic: QuicConnection, addr: tuple[Any, ...], outbound: bool) -> _Connection:
        quic._ack_delay = ACK_DELAY_S  # noqa: SLF001 - aioquic has no setting for it (see ACK_DELAY_S)
        conn = _Connection(self, quic, addr, outbound)
        assert self._nursery is not None
        self._nursery.start_soon(conn.run)  # RuntimeError once serve() has ended: nothing registered then
        self._conns.add(conn)
        self.cids[quic.host_cid] = conn
        return conn

    async def _expire_unauthed(self, conn: _Connection) -> None:
        with trio.move_on_after(AUTH_TIMEOUT_S):
            await conn.auth_result.wait()
        if conn.authed is None:
            conn.close("link auth timeout")

    def forget(self, conn: _Connection) -> None:
        self._conns.discard(conn)
        for cid in [c for c, v in self.cids.items() if v is conn]:
            del self.cids[cid]

    def spawn_link(self, link: Link) -> None:
        if self._on_link is not None and self._nursery is not None:
            self._nursery.start_soon(self._run_link, link)

    async def _run_link(self, link: Link) -> None:
        assert self._on_link is not None
        try:
            await self._on_link(link)
        except LinkClosed:
            pass
        except Exception:  # one link's failure must never take the endpoint down
            log.exception("link handler failed", peer=link.peer_node_id)
        finally:
            await link.aclose("handler done")

    async def transmit(self, conn: _Connection) -> None:
        assert self._sock is not None
        imp = self.impairment
        if imp is None:
            raw = self._raw
            assert raw is not None
            # Left by _transmit_burst when the socket was full: they go first.
            pending = conn.unsent + conn.quic.datagrams_to_send(now=trio.current_time())
            conn.unsent = []
            while pending:
                pending = self._send_nowait(pending)
                if pending:
                    await trio.lowlevel.wait_writable(raw)  # the socket's buffer is full: wait for room
            return
        while conn.unsent:
            data, addr = conn.unsent.pop(0)
            await self._sendto(data, addr)
        for data, addr in conn.quic.datagrams_to_send(now=trio.current_time()):
            if imp is not None:
                if imp.loss and self._rng.random() < imp.loss:
                    self.stats["datagrams_impaired_lost"] += 1
                    continue
                delay = imp.delay_s + (self._rng.uniform(-imp.jitter_s, imp.jitter_s) if imp.jitter_s else 0.0)
                if delay > 0 and self._nursery is not None:
                    self._nursery.start_soon(self._send_later, data, addr, delay)
                    continue
            await self._sendto(data, addr)

    def _send_nowait(self, datagrams: list[tuple[bytes, tuple[Any, ...]]]) -> list[tuple[bytes, tuple[Any, ...]]]:
        """Send datagrams in order without waiting; returns those the socket had no room for.

        With UDP GSO (Linux: the UDP_SEGMENT socket option, per call), consecutive datagrams to one
        address whose sizes allow it (all as long as the first, the last one no longer) leave in one
        sendmsg call: the kernel cuts them into the same datagrams, for one system call instead of
        several. A kernel or device that refuses GSO turns it off for this endpoint; its datagrams
        are then sent one by one, as they are without it."""
        raw = self._raw
        assert raw is not None
        stats = self.stats
        n = len(datagrams)
        i = 0
        while i < n:
            data, addr = datagrams[i]
            j = i + 1
            if self.gso:
                size = total = len(data)
                segments, limit = self.gso_max_segments, self.gso_max_bytes
                while (j < n and j - i < segments and len(datagrams[j - 1][0]) == size
                       and len(datagrams[j][0]) <= size and total + len(datagrams[j][0]) <= limit
                       and datagrams[j][1] == addr):
                    total += len(datagrams[j][0])
                    j += 1
            try:
                if j - i > 1:
                    raw.sendmsg([b"".join([d for d, _ in datagrams[i:j]])],
                                [(socket.SOL_UDP, UDP_SEGMENT, _SEGMENT_SIZE.pack(size))], 0, addr)
                else:
                    raw.sendto(data, addr)
            except BlockingIOError:
                return datagrams[i:]
            except OSError as exc:
                if j - i > 1 and exc.errno in _GSO_REFUSED:
                    self.gso = False
                    log.info("UDP GSO refused by the kernel: datagrams are sent one by one", error=str(exc))
                    continue  # the same datagrams again, one by one
                # Unreachable right now (or the socket closed): QUIC retransmits or times out.
            else:
                stats["datagrams_out"] += j - i
                stats["send_calls"] += 1
            i = j
        return []

    async def _sendto(self, data: bytes, addr: tuple[Any, ...]) -> None:
        raw = self._raw
        assert raw is not None
        while True:
            try:
                raw.sendto(data, addr)
                self.stats["datagrams_out"] += 1
                self.stats["send_calls"] += 1
                return
            except BlockingIOError:
                await trio.lowlevel.wait_writable(raw)  # the socket's buffer is full: wait for room
            except OSError:
                return  # unreachable right now (or the socket closed): QUIC retransmits or times out

    async def _send_later(self, data: bytes, addr: tuple[Any, ...], delay: float) -> None:
        """Lab impairment: one datagram, sent `delay` seconds from now."""
        await trio.sleep(delay)
        await self._sendto(data, addr)

    async def connect(
        self, addr: str, *, expect_node_id: str | None = None, timeout_s: float = 5.0, authenticate: bool = True
    ) -> Link:
        """Dial addr; with authenticate=False only the TLS handshake runs (a probe), and no link is opened."""
        if self._nursery is None:
            raise ConnectError(f"{addr}: the endpoint is not serving (not started, or shutting down)")
        try:
            host, port = parse_addr(addr)
            ipaddress.ip_address(host)
        except ValueError as exc:
            raise ConnectError(f"bad address: {exc}") from None
        sock_family_v6 = ":" in self.local_addr[0]
        if (":" in host) != sock_family_v6:
            raise ConnectError(f"address family of {addr} does not match the endpoint's socket")
        quic = QuicConnection(configuration=self._client_config)
        remote = (host, port)
        quic.connect(remote, now=trio.current_time())
        try:
            conn = self._add(quic, remote, outbound=True)
        except RuntimeError:  # the endpoint stopped serving (relay shutdown) while a dial was on its way
            raise ConnectError(f"{addr}: the endpoint is shutting down") from None
        conn.poke()
        try:
            with trio.fail_after(timeout_s):
                await conn.handshake_done.wait()
                key = _peer_key(quic)
                if conn.closed or key is None:
                    raise ConnectError(f"{addr}: handshake failed ({conn.close_reason or 'no key'})")
                if expect_node_id is not None and keys.node_id_for(key) != expect_node_id:
                    raise ConnectError(f"{addr}: node key is {keys.node_id_for(key)}, expected {expect_node_id}")
                if not authenticate:
                    conn.close("probe done")
                    return Link(conn, key, "", outbound=True)
                me = self.identity
                proof = me.sign(_auth_bytes(key, me.public_key, self.listen_addr))
                conn.send_frame(msgpack.packb([me.public_key, self.listen_addr, proof]))
                await conn.auth_result.wait()
                if conn.authed is None:
                    raise ConnectError(f"{addr}: link refused ({conn.close_reason})")
                return conn.authed
        except trio.TooSlowError:
            conn.close("connect timeout")
            raise ConnectError(f"{addr}: no answer within {timeout_s} s") from None
        except BaseException:
            conn.close("connect failed")
            raise

    async def aclose(self) -> None:
        """Close every connection (the serve() task ends when its caller cancels it)."""
        for conn in list(self._conns):
            conn.close("endpoint closed")
        await trio.lowlevel.checkpoint()


async def probe(identity: NodeIdentity, addr: str, expect_node_id: str, *, timeout_s: float = 3.0) -> bool:
    """True iff a QUIC handshake with addr proves it holds the node key whose id is expect_node_id.

    Only the TLS handshake runs (the certificate's CertificateVerify proves the key); no link is
    opened, so the probed relay never treats the prober as a neighbour. Network errors give False.
    """
    try:
        host, _ = parse_addr(addr)
    except ValueError:
        return False
    ep = QuicEndpoint(identity, idle_timeout_s=max(timeout_s, 1.0))
    try:
        await ep.bind("::" if ":" in host else "0.0.0.0", 0)
    except OSError:
        return False
    async with trio.open_nursery() as nursery:
        await nursery.start(ep.serve, None)
        try:
            await ep.connect(addr, expect_node_id=expect_node_id, timeout_s=timeout_s, authenticate=False)
            ok = True
        except (ConnectError, OSError):
            ok = False
        nursery.cancel_scope.cancel()
    return ok
