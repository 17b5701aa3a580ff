"""The relay's bootstrap client: one HTTP connection for its lifetime, peer requests that back off."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from inri.common.identity import NodeIdentity
from inri.node.bootstrap_client import BootstrapClient, make_record
from inri.node.config import load_config
from inri.node.reachability import Reachability
from inri.node.relay import _BootstrapLoop
from inri.protocol.messages import PeerInfo
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
