"""In-memory HomeStore: the home relay's registrations, tokens, spends and mailboxes.

Used by the simulator and the tests; the daemon has the same contract on SQLite (inri.node.store).
"""

from __future__ import annotations

from inri.protocol.messages import ReceiptStatus, Registration


class MemoryHomeStore:
    """Tokens are one-use: spent once, by one push id; the same push id again gets DUPLICATE."""

    def __init__(self, mailbox_max: int = 1000) -> None:
        self._regs: dict[bytes, Registration] = {}
        self._tokens: dict[bytes, set[bytes]] = {}  # route id -> unspent tokens
        self._spent: dict[bytes, dict[bytes, bytes]] = {}  # route id -> token -> push id that spent it
        self.mailboxes: dict[bytes, dict[bytes, tuple[bytes, float]]] = {}  # push id -> (ciphertext, t)
        self._mailbox_max = mailbox_max

    def add_registration(self, registration: Registration, tokens: list[bytes]) -> None:
        """Home a registration here (or refresh it) and add tokens for it."""
        rid = registration.route_id
        old = self._regs.get(rid)
        if old is None or registration.epoch >= old.epoch:
            self._regs[rid] = registration
        self._tokens.setdefault(rid, set()).update(tokens)
        self._spent.setdefault(rid, {})
        self.mailboxes.setdefault(rid, {})

    def remove(self, route_id: bytes) -> None:
        """Unregister: forget everything about the route id."""
        for table in (self._regs, self._tokens, self._spent, self.mailboxes):
            table.pop(route_id, None)

    def is_home(self, route_id: bytes) -> bool:
        return route_id in self._regs

    def registration(self, route_id: bytes) -> Registration | None:
        return self._regs.get(route_id)

    def accept_push(
        self, route_id: bytes, token: bytes, push_id: bytes, ciphertext: bytes, now: float
    ) -> ReceiptStatus:
        spent = self._spent.get(route_id)
        if spent is None:
            return ReceiptStatus.UNKNOWN_TOKEN
        by = spent.get(token)
        if by is not None:
            return ReceiptStatus.DUPLICATE if by == push_id else ReceiptStatus.SPENT
        unspent = self._tokens[route_id]
        if token not in unspent:
            return ReceiptStatus.UNKNOWN_TOKEN
        box = self.mailboxes[route_id]
        if len(box) >= self._mailbox_max:
            return ReceiptStatus.MAILBOX_FULL
        unspent.discard(token)
        spent[token] = push_id
        box[push_id] = (ciphertext, now)
        return ReceiptStatus.STORED
