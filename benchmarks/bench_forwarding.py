"""Cheap forwarding (issue 16, item 4): UDP datagrams per push and CPU per forwarded push on a line of
three QUIC endpoints A -> B -> C driven by the relay's own link manager (inri.node.links).

A sends push-sized frames from PRODUCERS tasks, each yielding after every frame (as pushes arrive from
many connections); B's link manager hands each frame to a forwarder that sends it on to C, as a
forwarding relay does; C answers each with a receipt-sized frame that B forwards back to A. Figures:
datagrams sent by all three endpoints per push (frames and ACKs, both directions), and process CPU
per push (all three endpoints run in this process, so it is the whole line's cost).

`--old DIR` also runs the same measurement with DIR (e.g. a `git archive` of main) first on PYTHONPATH,
interleaved round by round, and prints medians side by side.

Usage: python benchmarks/bench_forwarding.py [--pushes N] [--rounds R] [--old DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

from inri.common.identity import NodeIdentity
from inri.core.api import DisconnectReason
from inri.node.links import LinkManager
from inri.node.quic import QuicEndpoint

PRODUCERS = 16
PUSH_BYTES = 420  # a push frame with its registration
RECEIPT_BYTES = 30


class Hop:
    """The link events of one endpoint: what arrives from one side goes on to the other (or is answered)."""

    def __init__(self, name: str, links: LinkManager) -> None:
        self.name = name
        self.links = links
        self.forward: dict[str, str] = {}  # from peer -> to peer
        self.answer = False  # C: answer each push with a receipt
        self.got = 0
        self.done = trio.Event()
        self.want = 0
        self.up = trio.Event()
        self.peers: set[str] = set()

    def peer_up(self, peer: str, *, outbound: bool, addr: str) -> None:
        self.peers.add(peer)
        self.up.set()

    def peer_down(self, peer: str, reason: DisconnectReason) -> None:
        self.peers.discard(peer)

    def connect_failed(self, peer: str) -> None:
        pass

    def link_congested(self, peer: str) -> None:
        pass

    def link_unresponsive(self, peer: str) -> None:
        pass

    def active_peers(self) -> list[str]:
        return sorted(self.peers)

    def listed_peers(self) -> list[str]:
        return sorted(self.peers)

    def receive_frame(self, peer: str, data: bytes) -> None:
        if peer in self.forward:
            self.links.send(self.forward[peer], data, 0.0)
        elif self.answer:
            self.links.send(peer, b"r" * RECEIPT_BYTES, 0.0)
            self.got += 1
        else:
            self.got += 1
            if self.got >= self.want:
                self.done.set()


async def measure(pushes: int) -> dict[str, float]:
    ids = [NodeIdentity.generate() for _ in range(3)]
    eps = [QuicEndpoint(i) for i in ids]
    async with trio.open_nursery() as n:
        hops = []
        for name, ep in zip("ABC", eps, strict=True):
            await ep.bind("127.0.0.1", 0)
            lm = LinkManager(ep)
            hop = Hop(name, lm)
            lm.events = hop
            await n.start(lm.run)
            hops.append(hop)
        a, b, c = hops
        b.links.connect(ids[0].node_id, eps[0].listen_addr)
        b.links.connect(ids[2].node_id, eps[2].listen_addr)
        with trio.fail_after(20):
            while len(b.peers) < 2 or not a.peers or not c.peers:
                await trio.sleep(0.01)
        na, nb, nc = (i.node_id for i in ids)
        b.forward = {na: nc, nc: na}
        c.answer = True
        a.want = pushes
        frame = b"\x9a\x03" + os.urandom(PUSH_BYTES - 2)
        before = sum(ep.stats["datagrams_out"] for ep in eps)
        cpu0, t0 = time.process_time(), time.perf_counter()
        left = [pushes]

        async def producer() -> None:
            while left[0] > 0:
                left[0] -= 1
                a.links.send(nb, frame, 0.0)
                await trio.sleep(0)

        async with trio.open_nursery() as pn:
            for _ in range(PRODUCERS):
                pn.start_soon(producer)
        with trio.fail_after(60):
            await a.done.wait()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        dgrams = sum(ep.stats["datagrams_out"] for ep in eps) - before
        n.cancel_scope.cancel()
    return {"datagrams_per_push": dgrams / pushes, "cpu_us_per_push": cpu / pushes * 1e6,
            "pushes_per_s": pushes / wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pushes", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--old", help="a source tree to compare with (its inri first on PYTHONPATH)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one measurement, JSON out
    a = ap.parse_args()
    if a.one:
        print(json.dumps(trio.run(measure, a.pushes)))
        return
    trees = {"new": str(Path(__file__).resolve().parent.parent)}
    if a.old:
        trees["old"] = a.old
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for _ in range(a.rounds):  # interleaved: the shared machine's load hits both alike
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": tree}
            out = subprocess.run([sys.executable, __file__, "--one", "--pushes", str(a.pushes)], env=env,
                                 capture_output=True, text=True, check=True, cwd=tree)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    for name, m in med.items():
        print(f"{name}: {m['datagrams_per_push']:.2f} datagrams/push (A->B->C and receipts back, ACKs included), "
              f"{m['cpu_us_per_push']:.0f} us CPU/push for the 3-endpoint line, {m['pushes_per_s']:,.0f} pushes/s "
              f"(median of {a.rounds}, {a.pushes} pushes, {PRODUCERS} producers yielding after each frame)")
    figures = [{"metric": "forwarding: UDP datagrams per push (3-hop line)",
                "value": round(med["new"]["datagrams_per_push"], 2), "unit": "",
                "ceiling": f"old {med['old']['datagrams_per_push']:.2f}" if "old" in med else "issue: 7.7 today"},
               {"metric": "forwarding: CPU per push (3 endpoints)", "value": round(med["new"]["cpu_us_per_push"]),
                "unit": "us", "ceiling": f"old {med['old']['cpu_us_per_push']:.0f}" if "old" in med else ""}]
    print(json.dumps({"bench": "forwarding", "figures": figures}))


if __name__ == "__main__":
    main()
