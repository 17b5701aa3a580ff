"""Cost of `[store] synchronous = "full"` (issue 13 item 12): pushes/s with FULL beside NORMAL.

In-process, one RelayService on a real SQLite store (WAL), the device homed at the relay itself, so
each push makes the store's commits of a real push (custody row, token spent + mailbox row, status
row). The two modes run alternately in rounds on the same disk, and the medians are printed: FULL
adds an fsync per commit (power-loss durability); NORMAL survives a crash or kill -9 of the process.

Env: BENCH_SYNC_PUSHES (per round, default 1500), BENCH_SYNC_ROUNDS (default 3).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from inri.core.api import InjectOutcome
from inri.core.config import EngineConfig
from inri.core.trace import NullTracer
from inri.node.service import RelayService
from inri.node.store import Store, StoreSync
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key

PUSHES = int(os.environ.get("BENCH_SYNC_PUSHES", "1500"))
ROUNDS = int(os.environ.get("BENCH_SYNC_ROUNDS", "3"))


class _NoNetwork:
    def send(self, peer: str, frame: bytes, delay: float) -> None:
        pass

    def connect(self, peer: str, addr: str) -> None:
        pass

    def disconnect(self, peer: str, reason: str) -> None:
        pass


def pushes_per_s(directory: Path, mode: StoreSync) -> float:
    store = Store(directory / f"{mode.value}-{time.monotonic_ns()}.sqlite3", synchronous=mode,
                  mailbox_max=PUSHES + 1)
    assert store.sync_mode() == (2 if mode is StoreSync.FULL else 1)
    try:
        svc = RelayService("R", EngineConfig(), store, _NoNetwork(), NullTracer(), rng=random.Random(1))
        reg = make_registration(new_signing_key(b"\x41" * 32), 1, int(time.time()), 3600)
        svc.register_device(reg, 0)
        tokens = [os.urandom(16) for _ in range(PUSHES)]
        store.add_tokens(reg.route_id, tokens)
        t0 = time.perf_counter()
        for token in tokens:
            assert svc.inject_push(reg, token, b"x" * 64).outcome == InjectOutcome.ACCEPTED
        rate = PUSHES / (time.perf_counter() - t0)
        assert store.mailbox_size(reg.route_id) == PUSHES
        return rate
    finally:
        store.close()


def main() -> None:
    rates: dict[StoreSync, list[float]] = {StoreSync.NORMAL: [], StoreSync.FULL: []}
    with tempfile.TemporaryDirectory(prefix="inri-bench-sync-", dir=os.environ.get("BENCH_SYNC_DIR")) as d:
        for _ in range(ROUNDS):
            for mode in (StoreSync.NORMAL, StoreSync.FULL):
                rates[mode].append(pushes_per_s(Path(d), mode))
    normal, full = (statistics.median(rates[m]) for m in (StoreSync.NORMAL, StoreSync.FULL))
    print(f"pushes/s, synchronous=normal: {normal:,.0f}   synchronous=full: {full:,.0f}   "
          f"(full costs {100 * (1 - full / normal):.0f}%; {PUSHES} pushes x {ROUNDS} rounds, medians)")
    print(json.dumps({"bench": "store_sync", "figures": [
        {"metric": "pushes/s, [store] synchronous = normal", "value": round(normal), "unit": "/s"},
        {"metric": "pushes/s, [store] synchronous = full", "value": round(full), "unit": "/s",
         "baseline": f"normal {normal:.0f}/s", "note": f"{100 * (1 - full / normal):.0f}% slower"},
    ]}))


if __name__ == "__main__":
    main()
