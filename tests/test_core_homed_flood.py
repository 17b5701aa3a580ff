"""The owners of G5's homed registrations (homed.py) and of G3b/G4's per-route gossip state (floodstate.py),
through their methods (the engine-level behaviour is in test_engine*.py, test_stem.py and the traces)."""

from __future__ import annotations

from inri.core.floodstate import FloodState
from inri.core.homed import HomedRoutes
from inri.protocol.messages import Registration


def _reg(rid: bytes, epoch: int) -> Registration:
    return Registration(rid * 32, epoch, 0, 100, b"s" * 64)


def test_homed_routes_keep_the_newest_epoch_and_announce_each_queued_id_once() -> None:
    h = HomedRoutes()
    assert not h.any() and h.next_for("p") is None
    h.keep(_reg(b"a", 2))
    h.keep(_reg(b"a", 1))  # an older epoch does not replace the newer
    h.keep(_reg(b"b", 1))
    assert h.any() and h.get(_reg(b"a", 0).route_id) == _reg(b"a", 2)
    h.queue("p", [b"held"])
    h.queue("q", [])
    assert h.waiting() == ["p", "q"] and h.queued("p")
    got = []
    while (rid := h.next_for("p")) is not None:
        got.append(rid)
    assert got == [b"held", _reg(b"b", 0).route_id, _reg(b"a", 0).route_id]  # from the end
    assert not h.queued("p") and h.waiting() == ["q"]  # a queue left empty goes
    h.drop_peer("q")
    h.forget(_reg(b"a", 0).route_id)
    assert h.waiting() == [] and h.get(_reg(b"a", 0).route_id) is None and h.any()


def test_flood_state_budgets_refreshes_per_route_and_remembers_far_travelled_copies() -> None:
    f = FloodState()
    assert [f.refresh_allowed(b"r", 0.0, 1.0, 2.0) for _ in range(3)] == [True, True, False]
    assert f.refresh_allowed(b"other", 0.0, 1.0, 2.0)  # a budget per route id
    assert f.refresh_allowed(b"r", 1.0, 1.0, 2.0) and not f.refresh_allowed(b"r", 1.0, 1.0, 2.0)  # refilled at 1/s
    f.forget(b"r")
    assert f.refresh_allowed(b"r", 1.0, 1.0, 2.0) and f.refresh_allowed(b"r", 1.0, 1.0, 2.0)  # full again
    assert not f.is_deep(b"r", 1) and not f.shorter(b"r", 1, 3)
    f.went_deep(b"r", 1, 9)
    assert f.is_deep(b"r", 1) and not f.is_deep(b"r", 2)
    assert not f.shorter(b"r", 1, 9) and f.shorter(b"r", 1, 7) and not f.shorter(b"r", 1, 8)
    f.forget_deep(b"r", 1)
    assert not f.is_deep(b"r", 1) and not f.shorter(b"r", 1, 2)
