"""Retries that follow measured round trips (engine rules C4, C5; inri/core/rtt.py)."""

from __future__ import annotations

import random
from dataclasses import replace

from inri.core.api import Send, TraceLevel
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
    assert 0.02 < eng._hop_srtt < 0.04
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
    fast = eng._retry_period(r.route_id)
    learn_fast_path(eng, r, per_link=0.15, n=40)  # the path is five times slower now
    slow = eng._retry_period(r.route_id)
    assert fast < slow <= CFG.custody_retry_s
    learn_fast_path(eng, r, per_link=0.45, n=3)  # a sudden jump: srtt + 4 rttvar over the cap
    assert eng._retry_period(r.route_id) == CFG.custody_retry_s


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
    assert eng._active["a"].silences >= 20  # each counted against a (what scoring then does is S1's)


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
    """Rule C4b: 40 pushes leave at once; a answers them in order, one every 25 ms (a queue draining:
    the last after 1.1 s, four retry periods). No push is re-sent (each re-send would double the queue);
    all settle. With C4 alone, most were re-sent over b."""
    eng = engine()
    r = routed(eng)
    t = learn_fast_path(eng, r)
    assert eng._retry_period(r.route_id) < 0.3
    pids = _burst(eng, r, t, 40, 20_000)
    resent, _ = _drain(eng, pids, t, 0.1, 0.025)
    assert resent == {}
    assert eng.stats()["custody"] == 0
    assert eng.counters["custody_retry_path_busy"] > 0


def test_a_push_lost_on_a_busy_path_is_re_sent_once_a_later_one_is_answered() -> None:
    """Rule C4b keeps loss detection: push 10 of a burst of 40 is swallowed while a answers the others
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
    assert answered_11 < seen[0] <= answered_11 + eng._retry_period(r.route_id) + 0.02
    assert seen[0] < sent_10 + CFG.receipt_timeout_s / 2


def test_a_relay_that_stalled_does_not_take_its_own_pause_for_a_silent_path() -> None:
    """Rule C4b: a busy path answers in order, then this relay stalls for 1.2 s (a loaded host; longer
    than a retry period, shorter than the pushes' answer deadline) and its timer runs before it reads
    the answers that came meanwhile: the path was not silent, nothing is re-sent."""
    eng = engine()
    r = routed(eng)
    t = learn_fast_path(eng, r)
    pids = _burst(eng, r, t, 60, 40_000)
    resent, _ = _drain(eng, pids, t, 0.1, 0.025, stall=(t + 0.5, t + 1.7))
    assert resent == {}
    assert eng.stats()["custody"] == 0
