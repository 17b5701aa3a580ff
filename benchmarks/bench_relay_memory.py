"""Memory of one relay under a long push stream (issue 13 item 1): RSS at 0, 100k and 200k pushes.

In-process, with the daemon's own objects: an entry RelayService E takes every push (its
registration decoded afresh each time, as the HTTP API does for each request), forwards it to the
home RelayService H over an in-memory link (H decodes the push frame, with its registration, as it
would off QUIC), H stores it and answers with a receipt that settles E's custody. Both use SQLite
stores and the default engine configuration. The device acknowledges every 5,000 messages. Printed:
this process's RSS (both relays) before the first push and after 100k and 200k, and the sizes of the
bounded tables, so growth can be attributed: the engine's seen-cache and reverse path are bounded
by count (push_seen_max, reverse_max) and time (seen_ttl_s, reverse_ttl_s), the verifier's cache by
count (CachingVerifier, keyed by content), the SQLite page cache by its default size.

Env: BENCH_MEMORY_PUSHES (default 200000).
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import time
from collections.abc import Sized
from pathlib import Path

import trio

from inri.core.api import InjectOutcome
from inri.core.config import EngineConfig
from inri.core.trace import NullTracer
from inri.node.service import RelayService
from inri.node.store import Store
from inri.protocol.codec import decode_registration, encode_registration, make_registration
from inri.protocol.keys import new_signing_key

TOTAL = int(os.environ.get("BENCH_MEMORY_PUSHES", "200000"))


def _entries(service: RelayService) -> int:
    """Entries in a service's verifier cache (a CachingVerifier is sized; the Verifier protocol is not)."""
    return len(service.verifier) if isinstance(service.verifier, Sized) else 0


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _Link:
    """Both directions of one in-memory link: frames queued, delivered by one task."""

    def __init__(self) -> None:
        self.nodes: dict[str, RelayService] = {}
        self.tx, self.rx = trio.open_memory_channel[tuple[str, str, bytes]](math.inf)

    def sink(self, me: str) -> _Sink:
        return _Sink(self, me)

    async def pump(self) -> None:
        async for src, dst, frame in self.rx:
            self.nodes[dst].receive_frame(src, frame)


class _Sink:
    def __init__(self, link: _Link, me: str) -> None:
        self.link, self.me = link, me

    def send(self, peer: str, frame: bytes, delay: float) -> None:
        self.link.tx.send_nowait((self.me, peer, frame))

    def connect(self, peer: str, addr: str) -> None:
        pass

    def disconnect(self, peer: str, reason: str) -> None:
        pass


async def run(tmp: Path) -> dict[str, float]:
    link = _Link()
    cfg = EngineConfig()
    stores = {n: Store(tmp / f"{n}.sqlite3") for n in "EH"}
    entry = RelayService("E", cfg, stores["E"], link.sink("E"), NullTracer(), rng=random.Random(1))
    home = RelayService("H", cfg, stores["H"], link.sink("H"), NullTracer(), rng=random.Random(2),
                        mailbox_max=10_000)
    link.nodes.update(E=entry, H=home)
    reg = make_registration(new_signing_key(b"\x31" * 32), 1, int(time.time()), 7 * 24 * 3600)
    wire = encode_registration(reg)
    out: dict[str, float] = {}
    async with trio.open_nursery() as n:
        n.start_soon(link.pump)
        await n.start(entry.run)
        await n.start(home.run)
        entry.peer_up("H", outbound=True, addr="H")
        home.peer_up("E", outbound=False, addr="E")
        home.register_device(reg, 0)
        while entry.engine.route_count() < 1:
            await trio.sleep(0.01)
        out["rss_0_mb"] = rss_mb()
        t0 = time.perf_counter()
        done = 0
        while done < TOTAL:
            batch = [os.urandom(16) for _ in range(5_000)]
            home.store.add_tokens(reg.route_id, batch)
            for token in batch:
                result = entry.inject_push(decode_registration(wire), token, b"x" * 64)
                assert result.outcome == InjectOutcome.ACCEPTED, result.outcome
                done += 1
                if done % 500 == 0:
                    # Let the link deliver and the receipts come back: a home app that waits for its
                    # 202s, not a flood beyond the neighbour's push budget (then custody retries pace it).
                    while entry.engine.stats()["custody"]:
                        await trio.sleep(0)
            home.ack(reg.route_id, [p for p, _, _ in home.pending(reg.route_id, 10_000)])
            if done in (100_000, TOTAL) or done % 50_000 == 0:
                s = entry.engine.stats()
                print(f"{done:>7,} pushes  RSS {rss_mb():6.1f} MB  {done / (time.perf_counter() - t0):6.0f}/s  "
                      f"E: seen {s['seen']:,} reverse {s['reverse']:,} custody {s['custody']}  "
                      f"verifier entries {_entries(entry)}/{_entries(home)}", flush=True)
            if done == 100_000:
                out["rss_100k_mb"] = rss_mb()
        while entry.engine.stats()["custody"]:
            await trio.sleep(0.01)
        out["rss_end_mb"] = rss_mb()
        out["pushes_per_s"] = TOTAL / (time.perf_counter() - t0)
        n.cancel_scope.cancel()
    for store in stores.values():
        store.close()
    return out


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="inri-bench-mem-") as d:
        r = trio.run(run, Path(d))
    print(f"RSS of the relay pair: {r['rss_0_mb']:.1f} MB at 0, {r.get('rss_100k_mb', float('nan')):.1f} MB at "
          f"100k, {r['rss_end_mb']:.1f} MB at {TOTAL // 1000}k pushes ({r['pushes_per_s']:.0f} pushes/s)")
    print(json.dumps({"bench": "relay_memory", "figures": [
        {"metric": "RSS at 0 pushes", "value": round(r["rss_0_mb"], 1), "unit": "MB"},
        {"metric": "RSS at 100k pushes", "value": round(r.get("rss_100k_mb", float("nan")), 1), "unit": "MB"},
        {"metric": f"RSS at {TOTAL // 1000}k pushes", "value": round(r["rss_end_mb"], 1), "unit": "MB"},
        {"metric": "pushes/s (in-process, entry + home)", "value": round(r["pushes_per_s"]), "unit": "/s"},
    ]}))


if __name__ == "__main__":
    main()
