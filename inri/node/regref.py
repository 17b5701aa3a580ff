"""Registration references on a relay link (link protocol `inri/2`): a push carries its registration
once per link, then a 2-byte reference to it.

Every push frame carries the registration it was made for (about 150 of its 320 bytes), so that each
relay on the way can check it and verify the home's receipts with its receipt key. A link carries many
pushes for the same few registrations (an app server pushes to the same devices again and again), so
each link keeps a table of registrations, like HPACK's dynamic table in HTTP/2: the sender puts a
registration into a slot the first time, and refers to the slot afterwards. The receiver turns a
reference back into the exact frame the sender's relay encoded before anything above the link sees it:
the service, the engine, the traces and the receipts see the same bytes as with `inri/1`.

Link frames (only on an `inri/2` link; the first byte is a msgpack negative fixint, which no frame
of the relay protocol starts with: those are msgpack arrays):

    0xE1 | slot (u16) | push frame without its registration
    0xE2 | slot (u16) | length (u16) | registration (msgpack, `length` bytes) | push frame without it

"Push frame without its registration" is the push frame with its last element (the registration)
replaced by msgpack nil (0xC0); the receiver puts the slot's bytes back in its place. 0xE2 fills the
slot (replacing what it held) and is then read as 0xE1. Only native pushes whose frame ends with their
registration are sent this way (a Web Push push, whose meta follows the registration, goes whole).

The QUIC stream is reliable and ordered and the table lives and dies with the connection, so both
ends always agree on what a slot holds. The sender decides which slot a registration takes (least
recently used first, `SLOTS` of them). A reference to an empty slot, a frame shorter than its header
or a slot number out of range is a protocol violation: the receiver closes the link (error code 5).
What a slot holds is not trusted: the expanded frame is decoded and checked as any other frame. Any
other frame (whatever its first byte, and every frame on an inri/1 link) goes to the relay unchanged,
so garbage is answered with an error frame as before.

Measured on the 3-hop line of bench_poc (docs/protocol.md, "Registration references").
"""

from __future__ import annotations

from collections import OrderedDict

ALPN_REGREF = "inri/2"  # the link protocol with registration references
SLOTS = 1024  # registrations a link remembers in each direction
REF = 0xE1
DEFINE = 0xE2
_NIL = b"\xc0"
MAX_REG_BYTES = 1024  # a registration frame's bound (the API's too)


class RegRefError(Exception):
    """A link frame that breaks the registration-reference protocol (the link is closed)."""


class RegRefSender:
    """One link's outgoing table: registration bytes -> slot, least recently used first out."""

    __slots__ = ("_slots", "_next")

    def __init__(self) -> None:
        self._slots: OrderedDict[bytes, int] = OrderedDict()
        self._next = 0  # slots handed out so far (until SLOTS; then the LRU's slot is reused)

    def pack(self, frame: bytes, reg: bytes) -> bytes:
        """frame (a push frame ending with the msgpack registration reg) as the link frame to send.

        The table is updated at once: call it only for a frame that is then written to the stream."""
        slots = self._slots
        slot = slots.get(reg)
        head = frame[: len(frame) - len(reg)]
        if slot is not None:
            slots.move_to_end(reg)
            return b"".join((bytes((REF, slot >> 8, slot & 0xFF)), head, _NIL))
        if self._next < SLOTS:
            slot = self._next
            self._next += 1
        else:
            _, slot = slots.popitem(last=False)
        slots[reg] = slot
        n = len(reg)
        return b"".join((bytes((DEFINE, slot >> 8, slot & 0xFF, n >> 8, n & 0xFF)), reg, head, _NIL))


class RegRefReceiver:
    """One link's incoming table: slot -> registration bytes."""

    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: dict[int, bytes] = {}

    def expand(self, frame: bytes) -> bytes:
        """The push frame the sender's relay encoded, from a link frame starting with REF or DEFINE."""
        kind = frame[0]
        if len(frame) < 4:
            raise RegRefError("registration reference frame too short")
        slot = (frame[1] << 8) | frame[2]
        if slot >= SLOTS:
            raise RegRefError(f"registration slot {slot} out of range")
        if kind == DEFINE:
            if len(frame) < 6:
                raise RegRefError("registration definition too short")
            n = (frame[3] << 8) | frame[4]
            if n == 0 or n > MAX_REG_BYTES or len(frame) < 5 + n + 1:
                raise RegRefError("registration definition of a bad length")
            reg = frame[5 : 5 + n]
            self._slots[slot] = reg
            start = 5 + n
        elif kind == REF:
            got = self._slots.get(slot)
            if got is None:
                raise RegRefError(f"reference to empty registration slot {slot}")
            reg = got
            start = 3
        else:
            raise RegRefError(f"unknown link frame kind 0x{kind:02x}")
        if frame[-1] != 0xC0:
            raise RegRefError("push frame without its registration must end with nil")
        return frame[start:-1] + reg
