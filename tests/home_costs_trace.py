"""A hand-made trace for the home figures (docs/metrics.md, issue 42), shared by the simulator's collector
test (tests/test_sim.py) and the Spark analysis test (tests/test_spark.py), with the answers worked out
by hand. Rows are in time order, as the simulator writes them; the deadline is 10 s."""

from __future__ import annotations

DEADLINE_S = 10.0
RELAYS = 5  # H1, H2, X, Y, Z


def _row(t: float, relay: str, kind: str, msg: str | None = None, route: str | None = None,
         count: int | None = None, reason: str | None = None) -> dict[str, object]:
    return {"t": t, "relay": relay, "kind": kind, "msg": msg, "route": route, "count": count, "reason": reason}


ROWS = [
    _row(0.0, "H1", "reg_originated", "A:1", "A", count=1),
    _row(0.0, "H2", "reg_originated", "B:1", "B", count=1),
    # P1: home H1 up; delivered; 4 messages (2 forwards, 2 receipts)
    _row(1.0, "X", "push_injected", "P1", "A"),
    _row(1.0, "X", "push_forwarded", "P1", "A", count=1),
    _row(1.1, "Y", "push_forwarded", "P1", "A", count=1),
    _row(1.2, "H1", "push_delivered", "P1", "A"),
    _row(1.3, "Y", "receipt_forwarded", "P1", count=1),
    _row(1.4, "X", "receipt_forwarded", "P1", count=1),
    _row(2.0, "H2", "relay_down", reason="churn"),
    # P2: injected while its home H2 is down (exposed, not live): 1 + 5 messages while H2 is down, 1 after
    # it came back, then delivered (on time, 4.1 s)
    _row(2.5, "X", "push_injected", "P2", "B"),
    _row(2.5, "X", "push_excluded", "P2", reason="home_down"),
    _row(2.5, "X", "push_forwarded", "P2", "B", count=1),
    _row(3.0, "X", "push_fallback", "P2", "B", count=5),
    # P3: injected while H1 is up (live); H1 fails before delivery (exposed): 1 message before, 3 while
    # H1 is down, 1 after; never delivered
    _row(4.0, "Y", "push_injected", "P3", "A"),
    _row(4.1, "Y", "push_forwarded", "P3", "A", count=1),
    _row(4.5, "H1", "relay_down", reason="churn"),
    _row(4.5, "Y", "push_excluded", "P3", reason="home_down"),
    _row(5.0, "Y", "push_fallback", "P3", "A", count=3),
    _row(6.0, "H2", "relay_up", reason="churn"),
    _row(6.5, "X", "push_forwarded", "P2", "B", count=1),
    _row(6.6, "H2", "push_delivered", "P2", "B"),
    _row(7.0, "H1", "relay_up", reason="churn"),
    _row(7.5, "Y", "push_forwarded", "P3", "A", count=1),
    # P4: its home stayed up and it was never delivered: the figure the acceptance wants at 0
    _row(8.0, "X", "push_injected", "P4", "B"),
    _row(8.0, "X", "push_forwarded", "P4", "B", count=2),
    # P5: its route has no origin in the trace: no home, outside the three figures (not the old one)
    _row(8.5, "X", "push_injected", "P5", "Q"),
    _row(8.5, "X", "push_forwarded", "P5", "Q", count=7),
    # P6: delivered, and only then its home failed: its later re-send counts for its live home, and it is
    # not exposed (it was no longer waiting)
    _row(9.0, "X", "push_injected", "P6", "A"),
    _row(9.1, "H1", "push_delivered", "P6", "A"),
    _row(9.5, "H1", "relay_down", reason="churn"),
    _row(9.6, "X", "push_forwarded", "P6", "A", count=2),
    # P7: a spammer's push (excluded as `adversary`) to a live home, never delivered: not a lost push
    _row(11.0, "Z", "push_injected", "P7", "B"),
    _row(11.0, "Z", "push_excluded", "P7", reason="adversary"),
]

EXPECTED = {
    # live at injection: P1, P3, P4, P6, P7; their messages 4 + 5 + 2 + 2 + 0 = 13 over P1, P6 delivered
    "messages_per_delivered_push_live_home": 6.5,
    # exposed: P2 (6 messages while H2 was down) and P3 (3 while H1 was down): 9 / 2
    "messages_per_push_home_down": 4.5,
    "pushes_never_delivered_home_up": 1,  # P4
    # every message row (P5's too): 4 + 7 + 5 + 2 + 7 + 2 = 27 over P1, P2, P6
    "messages_per_delivered_push": 9.0,
}
