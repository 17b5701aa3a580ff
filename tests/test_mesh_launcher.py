"""The local mesh launcher's readiness rule (inri/mesh.py, waiting_for): when `inri mesh up` counts a mesh
as formed, checked against what the membership engine (rules M1, M4, M7) does with the same links."""

from __future__ import annotations

from pathlib import Path

import pytest

from inri import mesh
from inri.core.config import EngineConfig
from inri.core.testing import MiniNet
from inri.protocol.messages import PeerInfo

# The links of an 8-relay lab mesh (tests/test_relay_mesh.py's fixture) that settled under CPU load, as
# its relays listed them: relays 0-6 full at 4 links, relay 7 at 2 (its active_max was 8). `mesh up`
# waited 60 s for a third link to relay 7 and gave up ("neighbour counts [4, 4, 4, 4, 4, 4, 4, 2]").
SETTLED = [(0, 1), (0, 2), (0, 3), (0, 5), (1, 2), (1, 4), (1, 5), (2, 3), (2, 5), (3, 4), (3, 6), (4, 6),
           (4, 7), (5, 6), (6, 7)]
LIMITS = {str(i): mesh.LinkLimits(active_max=4, priority_join_below=2) for i in range(8)}


def links_of(edges: list[tuple[int, int]], n: int = 8) -> dict[str, set[str]]:
    links: dict[str, set[str]] = {str(i): set() for i in range(n)}
    for a, b in edges:
        links[str(a)].add(str(b))
        links[str(b)].add(str(a))
    return links


def run_engines(edges: list[tuple[int, int]], seconds: float) -> dict[str, set[str]]:
    """Relays linked by `edges`, each knowing every other one (a bootstrap's list), after `seconds`."""
    net = MiniNet(8, edges, open_dial=True, config=EngineConfig().test_profile())
    for i, eng in enumerate(net.engines):
        net.apply(str(i), eng.add_candidates([PeerInfo(str(j), f"addr-{j}") for j in range(8) if j != i], net.now))
    net.run_until(seconds)
    return {str(i): set(e.active_peers()) for i, e in enumerate(net.engines)}


def test_a_relay_every_full_relay_refuses_counts_as_formed_and_the_engine_leaves_it_so() -> None:
    assert mesh.waiting_for(links_of(SETTLED), 3, LIMITS) == {}
    # The engine agrees: two minutes on, every full relay has refused relay 7 (2 links is not below
    # priority_join_below: no make-room, rule M4) and nothing moved.
    assert run_engines(SETTLED, 120.0) == links_of(SETTLED)


def test_a_relay_that_can_still_get_a_link_is_waited_for_and_gets_it() -> None:
    edges = [e for e in SETTLED if e != (0, 1)]  # relays 0 and 1 have room for one more
    waiting = mesh.waiting_for(links_of(edges), 3, LIMITS)
    assert list(waiting) == ["7"] and "relays with room: 0, 1" in waiting["7"]
    after = run_engines(edges, 30.0)
    assert len(after["7"]) == 3 and mesh.waiting_for(after, 3, LIMITS) == {}


def test_a_relay_below_priority_join_below_is_waited_for_even_when_every_other_is_full() -> None:
    # Relay 2 is linked to 0 only; 0 and 1 are full (active_max 2): M4 makes room for a relay below 2.
    links = {"0": {"1", "2"}, "1": {"0", "3"}, "2": {"0"}, "3": {"1"}}
    limits = {"0": mesh.LinkLimits(2, 2), "1": mesh.LinkLimits(2, 2), "2": mesh.LinkLimits(2, 2),
              "3": mesh.LinkLimits(1, 1)}
    assert mesh.waiting_for(links, 2, limits) == {"2": "has 1 of 2 links (below priority_join_below, rule M4)"}


def test_a_relay_is_not_waited_for_beyond_its_own_active_max() -> None:
    links = links_of([(0, 1), (1, 2), (2, 0)], n=3)
    limits = {"0": mesh.LinkLimits(2, 2), "1": mesh.LinkLimits(4, 2), "2": mesh.LinkLimits(4, 2)}
    assert mesh.waiting_for(links, 3, limits) == {}  # 0 holds its 2; 1 and 2 have room but no one to link to


def test_relay_limits_are_read_as_the_relay_reads_its_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "relay.toml"
    cfg.write_text(mesh.relay_config(tmp_path, 0, 0, ["http://127.0.0.1:1"], "00", engine={"active_max": 8}))
    assert mesh.relay_limits(cfg) == mesh.LinkLimits(active_max=8, priority_join_below=2)
    monkeypatch.setenv("INRI_ENGINE_PRIORITY_JOIN_BELOW", "3")  # the relay process inherits this environment
    assert mesh.relay_limits(cfg) == mesh.LinkLimits(active_max=8, priority_join_below=3)
