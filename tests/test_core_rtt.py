"""Retries that follow measured round trips (engine rules C4, C5; inri/core/rtt.py)."""

from __future__ import annotations

import random
from dataclasses import replace

from inri.core.api import DisconnectReason, Send, TraceLevel
from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.trace import ListTracer
from inri.core.verify import CachingVerifier
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Keepalive, Push, Receipt, ReceiptStatus, RegGossip, Registration

CFG = EngineConfig()
FIXED = replace(CFG, adaptive_retry=False)


def engine(cfg: EngineConfig = CFG) -> Engine:
    eng = Engine("me", cfg, verifier=CachingVerifier(), home=MemoryHomeStore(), tracer=ListTracer(TraceLevel.FULL),
                 rng=random.Random(3))
    for p in ("a", "b", "c"):
        eng.peer_up(p, 0.0, outbound=True, addr=f"addr-{p}")
    return eng


def routed(eng: Engine, seed: int = 1) -> Registration:
    """A route at distance 3: primary a, backup b."""
    r = make_registration(new_signing_key(bytes([seed]) * 32), 1, 0, 3600)
    eng.receive_message("a", RegGossip(r, 10, 2), 0.1)
    eng.receive_message("b", RegGossip(r, 10, 1), 0.2)
    assert [p for p, _ in eng.next_hops(r.route_id)] == ["a", "b"]
    return r


def routed_line(eng: Engine, seed: int = 1) -> Registration:
    """A route at distance 3 whose only next hop is a (a line)."""
    r = make_registration(new_signing_key(bytes([seed]) * 32), 1, 0, 3600)
    eng.receive_message("a", RegGossip(r, 10, 2), 0.4)
    assert [p for p, _ in eng.next_hops(r.route_id)] == ["a"]
    return r


def hear_all(eng: Engine, now: float) -> None:
    for p in eng.active_peers():
        eng.receive_message(p, Keepalive(0, True), now)


def pid_of(i: int) -> bytes:
    return (1000 + i).to_bytes(16, "big")


def learn_fast_path(eng: Engine, r: Registration, per_link: float = 0.03, n: int = 30) -> float:
    """Pushes injected here, each answered by a's receipt after one round trip of the 3-link route."""
    t = 1.0
    for i in range(n):
        eng.inject_push(r, b"t" * 16, b"x", t, push_id=pid_of(i))
        t += 3 * per_link
        eng.receive_message("a", Receipt(pid_of(i), ReceiptStatus.STORED, 3), t)
        hear_all(eng, t)
        eng.handle_timer(t)
        t += 0.05
    return t


def push_sends(out: list, pid: bytes) -> list[str]:  # type: ignore[type-arg]
    return [e.peer for e in out if isinstance(e, Send) and isinstance(e.msg, Push) and e.msg.push_id == pid]


def first_resend(eng: Engine, r: Registration, t0: float, pid: bytes) -> tuple[float, str]:
    """Inject pid at t0, answer nothing, run the timer every 10 ms: when, and where, is it re-sent?"""
    out = eng.inject_push(r, b"t" * 16, b"x", t0, push_id=pid)
    assert push_sends(out.effects, pid) == ["a"]
    t = t0
    while t < t0 + 5.0:
        t = round(t + 0.01, 6)
        hear_all(eng, t)
        sends = push_sends(eng.handle_timer(t), pid)
        if sends:
            return t - t0, sends[0]
    raise AssertionError("never re-sent")


def test_a_custodian_re_sends_after_the_measured_round_trip_not_a_fixed_period() -> None:
    """Rule C4: receipts measured 30 ms a link on a 3-link route; a push that gets no answer is re-sent
    (over the backup) after about 2 x 3 x (srtt + 4 rttvar), floor 0.25 s, instead of 2 s."""
    eng = engine()
    r = routed(eng)
    t = learn_fast_path(eng, r)
    assert 0.02 < eng._rtt.srtt() < 0.04
    wait, where = first_resend(eng, r, t + 1.0, pid_of(99))
    assert CFG.receipt_timeout_min_s <= wait < 0.6 and where == "b"
    # The same history with fixed periods (adaptive_retry = false): custody_retry_s, as before C4.
    old = engine(FIXED)
    r = routed(old)
    t = learn_fast_path(old, r)
    wait, where = first_resend(old, r, t + 1.0, pid_of(99))
    assert abs(wait - FIXED.custody_retry_s) < 0.02 and where == "b"


def test_no_sample_yet_keeps_the_fixed_period() -> None:
    eng = engine()
    r = routed(eng)
    wait, _ = first_resend(eng, r, 1.0, pid_of(1))
    assert abs(wait - CFG.custody_retry_s) < 0.02


def test_the_period_follows_a_path_that_slows_down_and_stays_capped() -> None:
    eng = engine()
    r = routed(eng)
    learn_fast_path(eng, r)
    fast = eng._rtt_rules.retry_period(r.route_id)
    learn_fast_path(eng, r, per_link=0.15, n=40)  # the path is five times slower now
    slow = eng._rtt_rules.retry_period(r.route_id)
    assert fast < slow <= CFG.custody_retry_s
    learn_fast_path(eng, r, per_link=0.45, n=3)  # a sudden jump: srtt + 4 rttvar over the cap
    assert eng._rtt_rules.retry_period(r.route_id) == CFG.custody_retry_s


def test_an_early_re_send_never_gets_a_slow_honest_next_hop_blamed_or_cut() -> None:
    """A shorter retry period is for re-sending, not for blame (rule C4 with S1): the route's round trip
    was measured fast (re-sends after ~0.25 s), then its primary a turns slow and answers every push
    1.5 s after it left, 10 pushes/s for 60 s. The custodian re-sends each over b, but a is blamed for
    nothing, keeps its preference and its link."""
    eng = engine()
    r = routed(eng)
    t = learn_fast_path(eng, r)
    start = t
    sent: list[tuple[float, bytes]] = []
    answered = 0
    i = 0
    while t < start + 62.0:
        if t < start + 60.0:
            pid = pid_of(10_000 + i)
            i += 1
            out = eng.inject_push(r, b"t" * 16, b"x", t, push_id=pid)
            if "a" in push_sends(out.effects, pid):
                sent.append((t, pid))
        while answered < len(sent) and sent[answered][0] + 1.5 <= t:
            eng.receive_message("a", Receipt(sent[answered][1], ReceiptStatus.STORED, 3), t)
            answered += 1
        hear_all(eng, t)
        eng.handle_timer(t)
        t = round(t + 0.1, 6)
    stats = eng.stats()
    assert len(sent) > 500
    assert "a" in eng.active_peers() and not stats.get("peer_cut_score")
    assert not stats.get("push_no_answer") and eng.peer_scores()["a"] > CFG.score_prefer_below


def test_a_black_hole_is_still_blamed_on_time_when_the_custodian_re_sends_early() -> None:
    """Early re-sends do not let a black hole off (rule C4 with S1): a swallows 25 pushes; each is
    re-sent over b after ~0.25 s, and b does not answer either. a is still blamed for each at its
    deadline (a silence counted against it). (A receipt through b settles the push and blames nobody,
    with either period.)"""
    eng = engine()
    r = routed(eng)
    t = learn_fast_path(eng, r)
    for i in range(25):
        eng.inject_push(r, b"t" * 16, b"x", t, push_id=pid_of(5000 + i))
        for _ in range(5):
            t = round(t + 0.1, 6)
            hear_all(eng, t)
            eng.handle_timer(t)
    for _ in range(40):
        t = round(t + 0.1, 6)
        hear_all(eng, t)
        eng.handle_timer(t)
    assert eng.stats()["push_no_answer"] >= 20
    assert eng._neighbours.active()["a"].silences >= 20  # each counted against a (what scoring then does is S1's)


def test_a_relay_re_sends_over_the_backup_as_soon_as_the_link_goes_down() -> None:
    """Rule C5: a push forwarded to a, whose link then goes down before any answer, goes to b at once."""
    for cfg, expect in ((CFG, ["b"]), (FIXED, [])):
        eng = engine(cfg)
        r = routed(eng)
        pid = pid_of(7)
        out = eng.receive_message("c", Push(pid, r.route_id, b"t" * 16, b"x", 10, 1, 0, 0, r), 1.0)
        assert push_sends(out, pid) == ["a"]
        down = eng.peer_down("a", 1.2, "link_lost")  # type: ignore[arg-type]
        assert push_sends(down, pid) == expect
        assert eng.stats().get("push_rerouted_link_down", 0) == len(expect)
        # Never back to the relay it came from: with b gone too, nothing is left to try.
        if expect:
            assert push_sends(eng.peer_down("b", 1.3, "link_lost"), pid) == []  # type: ignore[arg-type]


def queued_line(eng: Engine, r: Registration, *, n: int, rate: float, service_s: float, t0: float,
                lose: frozenset[int] = frozenset()) -> tuple[int, dict[bytes, float], dict[bytes, float]]:
    """Push n pushes at `rate`/s through the only next hop a, behind which the path is a FIFO queue that
    serves one copy every service_s (slower than the pushes come: the queue grows to seconds) and answers
    each after 0.1 s more; the first copy of push i in `lose` is lost. Returns (copies sent to a, when
    each push was answered STORED, when each re-sent push was first re-sent)."""
    queue: list[tuple[float, bytes]] = []  # copies in the path, in arrival order
    answers: list[tuple[float, bytes, ReceiptStatus]] = []
    stored: dict[bytes, float] = {}
    resent: dict[bytes, float] = {}
    copies = 0
    seen: set[bytes] = set()
    served_until = t0
    t = t0
    i = 0
    while t < t0 + 60.0 and len(stored) < n:
        out = []
        if i < n and t >= t0 + i / rate:
            res = eng.inject_push(r, b"t" * 16, b"x", t, push_id=pid_of(50_000 + i))
            out += res.effects
            i += 1
        for when, pid, status in [a for a in answers if a[0] <= t]:
            answers.remove((when, pid, status))
            out += eng.receive_message("a", Receipt(pid, status, 3), t)
            if status == ReceiptStatus.STORED:
                stored[pid] = t
        hear_all(eng, t)
        out += eng.handle_timer(t)
        for e in out:
            if isinstance(e, Send) and isinstance(e.msg, Push):
                assert e.peer == "a"
                copies += 1
                if e.msg.attempt:
                    resent.setdefault(e.msg.push_id, t)
                k = int.from_bytes(e.msg.push_id, "big") - 1000 - 50_000
                if k in lose and e.msg.attempt == 0:
                    continue
                queue.append((t, e.msg.push_id))
        while queue:  # the path serves copies in order, one per service_s
            arrived, pid = queue[0]
            start = max(served_until, arrived)
            if start + service_s > t:
                break
            queue.pop(0)
            served_until = start + service_s
            status = ReceiptStatus.DUPLICATE if pid in seen else ReceiptStatus.STORED
            seen.add(pid)
            answers.append((served_until + 0.1, pid, status))
        t = round(t + 0.005, 6)
    return copies, stored, resent


def test_a_push_queued_behind_answered_pushes_is_not_re_sent_into_the_queue() -> None:
    """Rule C7: an entry relay pushes 100/s for 5 s into a line that stores 50/s: the receipts come
    seconds late, in order. The custodian waits for the queue instead of re-sending into it (before
    C7 it re-sent most pushes after its 2 s retry cap, and the path, the home too, handled each twice);
    every push is stored, once."""
    eng = engine()
    eng.peer_down("b", 0.3, DisconnectReason.LINK_LOST)
    eng.peer_down("c", 0.3, DisconnectReason.LINK_LOST)
    r = routed_line(eng)
    t = learn_fast_path(eng, r)
    copies, stored, _ = queued_line(eng, r, n=500, rate=100.0, service_s=0.02, t0=t + 1.0)
    assert len(stored) == 500
    assert max(stored.values()) - t > 9.0  # the last receipts came ~9 s after they left: a deep queue
    assert copies <= 500 * 1.05, copies
    assert eng.counters.get("custody_retry_queued", 0) > 100


def test_a_push_lost_in_a_queue_is_re_sent_once_later_pushes_are_answered() -> None:
    """Rule C7 waits only while the queue answers in order: a push lost on the way (pushes 300 and 310
    of 500) is re-sent once pushes sent after it come back, not left until the queue has drained. (Blame waits
    10 s here: rule S1's grace for a slow next hop, which defers re-sends too, stays out of the way.)"""
    eng = engine(replace(CFG, receipt_timeout_s=10.0))
    eng.peer_down("b", 0.3, DisconnectReason.LINK_LOST)
    eng.peer_down("c", 0.3, DisconnectReason.LINK_LOST)
    r = routed_line(eng)
    t = learn_fast_path(eng, r)
    copies, stored, resent = queued_line(eng, r, n=500, rate=100.0, service_s=0.02, t0=t + 1.0,
                                         lose=frozenset({300, 310}))
    assert len(stored) == 500
    for k in (300, 310):
        lost, next_one = pid_of(50_000 + k), pid_of(50_001 + k)
        assert stored[next_one] - t > 6.0  # pushes sent after it waited ~3 s in the queue
        # Re-sent within half the queue's delay (~3 s) of the answer to the push sent after it, not
        # when the queue has drained (nor, for 310, once 300's copy has come back).
        assert stored[next_one] < resent[lost] < stored[next_one] + 2.0
    assert copies <= 500 * 1.05, copies


def test_a_lost_push_with_nothing_queued_ahead_of_it_is_re_sent_after_the_round_trip() -> None:
    """Rule C7 defers only behind pushes still ahead in the queue: on a fast path, a push lost while
    an earlier one was answered is re-sent after the measured round trip (C4), not held back (a line:
    the re-send goes the same way)."""
    eng = engine()
    eng.peer_down("b", 0.3, DisconnectReason.LINK_LOST)
    eng.peer_down("c", 0.3, DisconnectReason.LINK_LOST)
    r = routed_line(eng)
    t = learn_fast_path(eng, r)
    eng.inject_push(r, b"t" * 16, b"x", t + 1.0, push_id=pid_of(900))
    out = eng.inject_push(r, b"t" * 16, b"x", t + 1.01, push_id=pid_of(901))
    assert push_sends(out.effects, pid_of(901)) == ["a"]
    tt = t + 1.01
    while tt < t + 4.0:
        tt = round(tt + 0.01, 6)
        if abs(tt - (t + 1.1)) < 1e-6:
            eng.receive_message("a", Receipt(pid_of(900), ReceiptStatus.STORED, 3), tt)  # 900 answered
        hear_all(eng, tt)
        sends = push_sends(eng.handle_timer(tt), pid_of(901))
        if sends:
            break
    assert sends == ["a"] and tt - (t + 1.01) < 0.6


def burst_behind(eng: Engine, r: Registration, t0: float, n: int, lost: int | None = None) -> dict[bytes, int]:
    """n pushes injected 10 ms apart at t0; a answers them in the order they left, one every 30 ms from
    t0 + 0.2 s (a path that drains 33 pushes/s under 100/s: push i waits 0.2 + 0.02 i s), except push
    `lost`. The timer
    runs every 10 ms until every answered push is answered; returns the sends of each push."""
    sends: dict[bytes, int] = {}
    answer_at = {pid_of(200 + i): t0 + 0.2 + 0.03 * i for i in range(n) if i != lost}
    inject_at = {pid_of(200 + i): round(t0 + 0.01 * i, 6) for i in range(n)}
    t = t0
    while answer_at:
        for pid, at in list(inject_at.items()):
            if at <= t:
                del inject_at[pid]
                out = eng.inject_push(r, b"t" * 16, b"x", t, push_id=pid)
                sends[pid] = sends.get(pid, 0) + len(push_sends(out.effects, pid))
        for pid, at in list(answer_at.items()):
            if at <= t:
                del answer_at[pid]
                eng.receive_message("a", Receipt(pid, ReceiptStatus.STORED, 3), t)
        hear_all(eng, t)
        effects = eng.handle_timer(t)
        for pid in sends:
            sends[pid] += len(push_sends(effects, pid))
        t = round(t + 0.01, 6)
    return sends


def test_a_push_queued_behind_answered_ones_is_not_re_sent() -> None:
    """Rule C7, with a backup next hop: the route's round trip was measured fast (C4 re-sends after
    ~0.25 s), then 40 pushes meet a path that drains slower than they come. Its next hop answers them
    in order, later and later (up to 1 s): each push is behind the others, not lost, so it is not
    re-sent over the backup either (before C7 every push waiting more than 0.25 s was: 35 copies more,
    each reaching the home twice). A push that was overtaken is lost: push 5 gets no answer while
    those sent after it do, and it is re-sent (with at most a few at the head of the queue, whose
    retry came just before their answer). Before a path's first answer C7 cannot tell a slow path
    from a black hole, which answers nothing either: C4 re-sends as before."""
    eng = engine()
    r = routed(eng)
    t = learn_fast_path(eng, r)
    assert eng._rtt_rules.retry_period(r.route_id) < 0.6
    sends = burst_behind(eng, r, t + 1.0, 40)
    # (A push at the head of the queue whose retry comes just before its answer counts as lost: a few.)
    assert sum(sends.values()) <= 44, sends
    assert eng.stats().get("custody_retry_queued", 0) > 0

    eng = engine()
    r = routed(eng)
    t = learn_fast_path(eng, r)
    sends = burst_behind(eng, r, t + 1.0, 40, lost=5)
    resent = [i for i in range(40) if sends[pid_of(200 + i)] > 1]
    assert 5 in resent and len(resent) <= 4, sends


def _burst(eng: Engine, r: Registration, t: float, n: int, base: int) -> list[bytes]:
    """n pushes injected 1 ms apart from t, every one sent to a."""
    pids = [pid_of(base + i) for i in range(n)]
    for i, pid in enumerate(pids):
        out = eng.inject_push(r, b"t" * 16, b"x", round(t + 0.001 * i, 6), push_id=pid)
        assert push_sends(out.effects, pid) == ["a"]
    return pids


def _drain(eng: Engine, pids: list[bytes], t: float, first: float, step: float, skip: frozenset[bytes] = frozenset(),
           stall: tuple[float, float] | None = None) -> tuple[dict[bytes, list[str]], float]:
    """Answer pids in order through a, the first `first` s after t, then one every `step` s (a busy path
    draining its queue), except those in skip; run the timer every 10 ms. stall (start, end): this relay
    reads nothing in between (its timer runs at the end, before it reads what came). Returns the
    re-sends of each push (the neighbours they went to) and when the last answer came."""
    resent: dict[bytes, list[str]] = {}
    due = [(round(t + first + step * i, 6), pid) for i, pid in enumerate(pids) if pid not in skip]
    end = due[-1][0] + 1.0
    while t < end:
        t = round(t + 0.01, 6)
        if stall is not None and stall[0] <= t < stall[1]:
            continue
        if stall is not None and stall[1] <= t < stall[1] + 0.01:
            first_out = eng.handle_timer(t)  # the timer first (trio may run it before the receive loop)
            for pid in pids:
                resent.setdefault(pid, []).extend(push_sends(first_out, pid))
        while due and due[0][0] <= t:
            eng.receive_message("a", Receipt(due.pop(0)[1], ReceiptStatus.STORED, 3), t)
        out = eng.handle_timer(t)
        for pid in pids:
            resent.setdefault(pid, []).extend(push_sends(out, pid))
    return {p: s for p, s in resent.items() if s}, end - 1.0


def test_a_custodian_does_not_re_send_into_a_busy_path_that_answers_in_order() -> None:
    """Rule C7: 40 pushes leave at once; a answers them in order, one every 25 ms (a queue draining:
    the last after 1.1 s, four retry periods). No push is re-sent (each re-send would double the queue);
    all settle. With C4 alone, most were re-sent over b."""
    eng = engine()
    r = routed(eng)
    t = learn_fast_path(eng, r)
    assert eng._rtt_rules.retry_period(r.route_id) < 0.3
    pids = _burst(eng, r, t, 40, 20_000)
    resent, _ = _drain(eng, pids, t, 0.1, 0.025)
    assert resent == {}
    assert eng.stats()["custody"] == 0
    assert eng.counters["custody_retry_queued"] > 0


def test_a_push_lost_on_a_busy_path_is_re_sent_once_a_later_one_is_answered() -> None:
    """Rule C7 keeps loss detection: push 10 of a burst of 40 is swallowed while a answers the others
    in order. It is re-sent (over the backup b) soon after the answer to push 11 (within the retry
    period, which the burst's own receipts lengthened), long before its answer deadline, and it is
    the only one re-sent."""
    eng = engine()
    r = routed(eng)
    t = learn_fast_path(eng, r)
    pids = _burst(eng, r, t, 40, 30_000)
    sent_10 = t + 0.010
    answered_11 = t + 0.1 + 0.025 * 10  # push 11 takes push 10's place in the answer order
    seen: list[float] = []
    resent: dict[bytes, list[str]] = {}
    due = [(round(t + 0.1 + 0.025 * i, 6), pid) for i, pid in enumerate(p for p in pids if p != pids[10])]
    while t < answered_11 + 2.0:
        t = round(t + 0.01, 6)
        while due and due[0][0] <= t:
            eng.receive_message("a", Receipt(due.pop(0)[1], ReceiptStatus.STORED, 3), t)
        out = eng.handle_timer(t)
        for pid in pids:
            got = push_sends(out, pid)
            if got:
                resent.setdefault(pid, []).extend(got)
                if pid == pids[10]:
                    seen.append(t)
    assert list(resent) == [pids[10]] and resent[pids[10]] == ["b"]
    assert answered_11 < seen[0] <= answered_11 + eng._rtt_rules.retry_period(r.route_id) + 0.02
    assert seen[0] < sent_10 + CFG.receipt_timeout_s / 2


def test_a_relay_that_stalled_does_not_take_its_own_pause_for_a_silent_path() -> None:
    """Rule C7: a busy path answers in order, then this relay stalls for 1.2 s (a loaded host; longer
    than a retry period, shorter than the pushes' answer deadline) and its timer runs before it reads
    the answers that came meanwhile: the path was not silent, nothing is re-sent."""
    eng = engine()
    r = routed(eng)
    t = learn_fast_path(eng, r)
    pids = _burst(eng, r, t, 60, 40_000)
    resent, _ = _drain(eng, pids, t, 0.1, 0.025, stall=(t + 0.5, t + 1.7))
    assert resent == {}
    assert eng.stats()["custody"] == 0
