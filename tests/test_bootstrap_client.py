"""The relay's bootstrap client: one HTTP connection for its lifetime, peer requests that back off."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from bootstrap_nodes.config import BootstrapConfig
from bootstrap_nodes.service import Bootstrap, Refused
from inri.common.identity import NodeIdentity
from inri.node.bootstrap_client import BootstrapClient, BootstrapError, make_record
from inri.node.config import load_config
from inri.node.quic import probe
from inri.node.reachability import ANNOUNCE_TIMEOUT_S, AnnounceOutcome, Reachability
from inri.node.relay import _BootstrapLoop
from inri.protocol.messages import PeerInfo
from inri.protocol.peer_record import encode_record
from tests.inproc import serving as served


class FakeBootstrap:
    """An ASGI bootstrap that lists nobody and notes the client port of every request."""

    def __init__(self) -> None:
        self.ports: list[int] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.ports.append(scope["client"][1])
        body = b'{"peers": []}' if scope["path"] == "/v1/peers" else b'{"listed": true}'
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def serving(app: FakeBootstrap) -> AsyncIterator[str]:
    async with served(app) as url:
        yield url


async def test_every_request_of_a_relay_uses_one_http_connection() -> None:
    boot = FakeBootstrap()
    ident = NodeIdentity.generate()
    with trio.fail_after(20):
        async with serving(boot) as url:
            client = BootstrapClient([url])
            try:
                await client.announce(make_record(ident, ["127.0.0.1:4433"], None, 1, 1, 1))
                for _ in range(5):
                    assert await client.fetch_peers(ident.node_id, None, 8) == []
                assert len(boot.ports) == 6 and len(set(boot.ports)) == 1, boot.ports
            finally:
                await client.aclose()


class FakeClient:
    """Stands in for BootstrapClient: notes when peers were asked for (virtual time)."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.impostors: set[str] = set()

    async def announce(self, record: object) -> str:
        return "http://bootstrap"

    async def fetch_peers(self, node_id: str, geo: str | None, count: int,
                          own_addrs: tuple[str, ...] = ()) -> list[PeerInfo]:
        self.asked.append(trio.current_time())
        return []

    async def aclose(self) -> None:
        pass


class LonelyService:
    def __init__(self) -> None:
        self.neighbours: list[str] = []
        self.reachability = Reachability(300.0, 0.0)

    def clock(self) -> float:
        return trio.current_time()

    def active_peers(self) -> list[str]:
        return self.neighbours

    def add_candidates(self, peers: list[PeerInfo], *, near: int = 0) -> None:
        pass


async def test_an_isolated_relay_backs_off_with_jitter(mock_clock: trio.testing.MockClock) -> None:
    mock_clock.autojump_threshold = 0  # virtual time: ten minutes of the loop in milliseconds
    cfg = load_config(None, env={"INRI_RELAY_BOOTSTRAP": "http://bootstrap", "INRI_RELAY_PEERS_INTERVAL_S": "60"})
    service = LonelyService()
    loop = _BootstrapLoop(cfg, NodeIdentity.generate(), service, "127.0.0.1:4433")  # type: ignore[arg-type]
    fake = FakeClient()
    loop.client = fake  # type: ignore[assignment]
    async with trio.open_nursery() as n:
        n.start_soon(loop.run)
        await trio.sleep(600)
        gaps = [b - a for a, b in zip(fake.asked, fake.asked[1:], strict=False)]
        # Delays double from 2 s to peers_interval_s, each drawn from [cap/2, cap]: ~18 asks, not 300.
        caps = [min(2.0 * 2**i, 60.0) for i in range(len(gaps))]
        assert all(cap / 2 <= g <= cap + 1e-6 for g, cap in zip(gaps, caps, strict=True)), gaps
        assert len(fake.asked) < 25
        assert len({round(g, 6) for g in gaps if g >= 59 / 2}) > 3  # jittered, not one fixed period
        # A neighbour arrives, later leaves: each time the relay asks again soon (back to the 2 s step).
        for neighbours in (["n1"], []):
            await trio.sleep(120)  # backed off to the 60 s cap again
            service.neighbours = neighbours
            before = len(fake.asked)
            await trio.sleep(64)  # the current wait (<= 60 s) ends, the relay asks, then asks again within 2 s
            assert len(fake.asked) >= before + 2 and fake.asked[before + 1] - fake.asked[before] <= 2.0
        n.cancel_scope.cancel()


class RefusingClient(FakeClient):
    """A bootstrap whose probe of the relay's address takes `probe_s` and fails: 422 `unreachable`."""

    def __init__(self, probe_s: float) -> None:
        super().__init__()
        self.probe_s = probe_s

    async def announce(self, record: object) -> str:
        await trio.sleep(self.probe_s)
        raise BootstrapError("unreachable", "no QUIC handshake with this node key at 127.0.0.1:9")


async def test_an_unanswered_public_addr_is_refused_and_named_within_10_s(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    """Issue 39: an unreachable `public_addr` is named within 10 s. The chain, on virtual time: a relay
    announces as it starts; the bootstrap's QUIC probe of an address that never answers (a real UDP port
    nobody reads) gives up after `probe_timeout_s`, well before the relay's announce request does
    (ANNOUNCE_TIMEOUT_S), so the relay hears `unreachable` and says so at once."""
    mock_clock.autojump_threshold = 0
    cfg = BootstrapConfig(data_dir=str(tmp_path / "b"), allow_private=True)
    prober_id = NodeIdentity.generate()

    async def prober(addr: str, node_id: str) -> bool:
        return await probe(prober_id, addr, node_id, timeout_s=cfg.probe_timeout_s)

    boot = Bootstrap(cfg, prober)
    relay_id = NodeIdentity.generate()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as hole, socket.socket(socket.AF_INET6,
                                                                                 socket.SOCK_DGRAM) as hole6:
        hole.bind(("127.0.0.1", 0))
        hole6.bind(("::1", 0))
        addrs = [f"127.0.0.1:{hole.getsockname()[1]}", f"[::1]:{hole6.getsockname()[1]}"]  # IPv4 + IPv6
        now = int(time.time())
        start = trio.current_time()
        with pytest.raises(Refused) as refused:
            await boot.admit(encode_record(make_record(relay_id, addrs, None, 1, now * 1000, now)),
                             source="announce")
        probed_s = trio.current_time() - start
    assert refused.value.code == "unreachable" and addrs[0] in refused.value.detail, refused.value.detail
    assert probed_s == pytest.approx(len(addrs) * cfg.probe_timeout_s)  # each address probed once, in turn
    assert probed_s < ANNOUNCE_TIMEOUT_S  # the relay's request waits longer: it hears the answer

    # The relay's side: its first announcement goes out as it starts and the refusal is named at once.
    service = LonelyService()
    loop = _BootstrapLoop(load_config(None, env={"INRI_RELAY_BOOTSTRAP": "http://bootstrap"}), relay_id,
                          service, addrs[0])  # type: ignore[arg-type]
    loop.client = RefusingClient(probed_s)  # type: ignore[assignment]
    async with trio.open_nursery() as n:
        begun = trio.current_time()
        n.start_soon(loop.run)
        while service.reachability.outcome is not AnnounceOutcome.UNREACHABLE:
            await trio.sleep(0.01)
        named_s = trio.current_time() - begun
        n.cancel_scope.cancel()
    assert named_s == pytest.approx(probed_s, abs=0.02) and named_s <= 10
    assert service.reachability.status(trio.current_time())["unreachable_addr"] == "127.0.0.1:9"
