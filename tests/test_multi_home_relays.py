"""Homes in two places (issue 42 item 3) over real relay processes: kill -9 one of a device's two homes
while pushes flow from the relay farthest from both, and every push that got a 202 reaches the device
exactly once.

Six relays and a bootstrap on loopback (`inri mesh up`'s harness). Each round registers a new device at
two fresh homes with the SDK (the route id is then anycast: both homes originate it), streams from both
over their WebSockets, and pushes from the relay farthest from the pair with four concurrent senders;
once 20 pushes were accepted, the home the far relay's pushes reach is killed with SIGKILL while others
are in flight. The round waits for every accepted push, records what had not arrived while the home
was down (and its status at the far relay: `pending` is a push the mesh still routes toward the dead
home, `delivered` one the dead home stored and acknowledged before the device read it), starts the dead
home again (its mailbox is durable) and waits again: every accepted push must then have reached the
device exactly once. The device drops a push id it has already seen (`duplicates_dropped`: a custodian re-sends
a push whose receipt the dead home never sent, and the other home stores it too). No wall-clock bound
is asserted: the waits only stop a hang.
"""

from __future__ import annotations

import collections
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from inri import mesh
from inri.client import ApiError, DeviceClient, HomeAppClient, Message

pytestmark = pytest.mark.integration
RELAYS = 6
ROUNDS = 3  # homes R1+R2, then R3+R4, then R5+R6
PUSHES = 60  # per round, from PUSHERS concurrent senders; a home is killed once KILL_AFTER were accepted
PUSHERS = 4
KILL_AFTER = 20
# Faster custody re-sends than the test profile's (a push whose home died is re-sent sooner).
ENGINE = {"custody_retry_s": 0.2, "custody_park_max_s": 1.0}


def _graph(info: dict[str, Any]) -> dict[str, set[str]]:
    names = {r["node_id"]: r["name"] for r in info["relays"]}
    g: dict[str, set[str]] = {r["name"]: set() for r in info["relays"]}
    for r in info["relays"]:
        for nb in mesh.status(r["api"])["neighbours"]:
            if nb["node_id"] in names:
                g[r["name"]].add(names[nb["node_id"]])
                g[names[nb["node_id"]]].add(r["name"])
    return g


def _dist(g: dict[str, set[str]], src: str) -> dict[str, int]:
    dist = {src: 0}
    q = collections.deque([src])
    while q:
        u = q.popleft()
        for v in sorted(g[u]):
            if v not in dist:
                dist[v] = dist[u] + 1
                q.append(v)
    return dist


def _relay(info: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in info["relays"] if r["name"] == name)


def _kill9(r: dict[str, Any]) -> None:
    os.killpg(r["pid"], signal.SIGKILL)
    try:
        os.waitpid(r["pid"], 0)
    except ChildProcessError:
        pass


async def _round(info: dict[str, Any], homes: tuple[str, str]) -> dict[str, Any]:
    g = _graph(info)
    da, db = _dist(g, homes[0]), _dist(g, homes[1])
    assert len(da) == RELAYS, f"mesh not connected: {g}"
    far = max(sorted(set(da) - set(homes)), key=lambda n: (min(da[n], db[n]), da[n] + db[n]))
    far_api = _relay(info, far)["api"]
    home_apis = [_relay(info, h)["api"] for h in homes]
    got: list[Message] = []
    accepted: list[str] = []
    out: dict[str, Any] = {"refused": 0, "killed": ""}

    def missing() -> set[str]:
        return set(accepted) - {m.id for m in got}

    async with httpx.AsyncClient(timeout=5) as c, DeviceClient(home_apis) as dev, \
            HomeAppClient([far_api]) as app:
        await dev.register(tokens=PUSHES)
        creds = [dev.export_credential(PUSHES // PUSHERS) for _ in range(PUSHERS)]
        with trio.fail_after(30):  # the anycast route reaches the far relay (from either home)
            while (await c.get(far_api + "/v1/status")).json()["routes"] < 1:
                await trio.sleep(0.05)
        kill_now = trio.Event()

        async def pusher(k: int) -> None:
            for i in range(PUSHES // PUSHERS):
                try:
                    accepted.append((await app.push(creds[k], f"push {k}.{i}".encode())).push_id)
                except ApiError as exc:  # 429 overloaded: not accepted, nothing promised
                    assert exc.status == 429, exc
                    out["refused"] += 1
                if len(accepted) >= KILL_AFTER:
                    kill_now.set()

        async def killer() -> None:
            await kill_now.wait()
            # Kill the home the far relay's pushes reach: the one that has stored more of them so far.
            stored = [await _stored(c, api) for api in home_apis]
            out["killed"] = homes[0] if stored[0] >= stored[1] else homes[1]
            out["stored_at_kill"] = stored
            out["accepted_at_kill"] = len(accepted)
            _kill9(_relay(info, out["killed"]))

        async with dev.stream() as messages:
            async with trio.open_nursery() as n:
                async def receive() -> None:
                    async for m in messages:
                        got.append(m)
                n.start_soon(receive)
                async with trio.open_nursery() as pushing:
                    pushing.start_soon(killer)
                    for k in range(PUSHERS):
                        pushing.start_soon(pusher, k)
                survivor_api = next(api for h, api in zip(homes, home_apis, strict=True) if h != out["killed"])
                statuses: collections.Counter[str] = collections.Counter()
                with trio.move_on_after(30):  # hang guard (pushes the mesh still routes toward the dead home)
                    # Until what has not arrived can only be at the dead home: none of it is still in custody
                    # at the far relay, and the device has read everything the live home holds.
                    while missing():
                        statuses.clear()
                        for pid in missing():
                            statuses[(await c.get(f"{far_api}/v1/push/{pid}")).json()["status"]] += 1
                        if not statuses["pending"] and not await _metric(c, survivor_api, "inri_mailbox_messages"):
                            break
                        await trio.sleep(0.1)
                out["missing_before_restart"] = len(missing())
                out["missing_statuses"] = {k: v for k, v in statuses.items() if v} if missing() else {}
                text = (await c.get(far_api + "/metrics")).text  # what the far relay holds while the home is down
                out["far_while_down"] = [ln for ln in text.splitlines()
                                         if ln.startswith(("inri_custody_pushes", "inri_pushes_awaiting_receipt",
                                                           "inri_pushes_out", "inri_custody_settled"))]
                # The dead home comes back: whatever it stored and had not handed over reaches the device now.
                await trio.to_thread.run_sync(lambda: mesh.restart_relay(info, _relay(info, out["killed"])))
                with trio.move_on_after(30):  # hang guard (the stream reconnects with backoff up to 10 s)
                    while missing():
                        await trio.sleep(0.05)
                await trio.sleep(1.0)  # a late duplicate would show here
                n.cancel_scope.cancel()
        out["survivor_acked"] = await _metric(c, survivor_api, "inri_messages_acked")
        metrics = (await c.get(far_api + "/metrics")).text
    return {**out, "homes": homes, "far": far, "hops": (da[far], db[far]), "accepted": accepted,
            "delivered": [m.id for m in got], "duplicates_dropped": dev.duplicates_dropped,
            "far_metrics": [ln for ln in metrics.splitlines() if ln.startswith("inri_custody_settled")]}


async def _metric(c: httpx.AsyncClient, api: str, name: str) -> float:
    text = (await c.get(api + "/metrics")).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name))


async def _stored(c: httpx.AsyncClient, api: str) -> float:
    """Messages the relay at api stored as a home: those it holds and those acked (deleted on an ack; the
    device acks at both homes, and the home that never held an id deletes nothing). Homes are fresh."""
    return await _metric(c, api, "inri_mailbox_messages") + await _metric(c, api, "inri_messages_acked")


def test_killing_one_of_two_homes_mid_stream_delivers_every_accepted_push_once(tmp_path: Path) -> None:
    info = mesh.up(tmp_path, relays=RELAYS, bootstraps=1, timeout_s=90, min_neighbours=2, trace_level="off",
                   engine={f"R{i + 1}": ENGINE for i in range(RELAYS)})
    results = []
    try:
        for k in range(ROUNDS):
            homes = (f"R{2 * k + 1}", f"R{2 * k + 2}")
            results.append(trio.run(_round, info, homes))
    finally:
        mesh.down(tmp_path)
    for res in results:
        print({k: v for k, v in res.items() if k not in ("accepted", "delivered")},
              "accepted", len(res["accepted"]), "delivered", len(res["delivered"]))
    for res in results:
        delivered = res["delivered"]
        assert len(delivered) == len(set(delivered)), f"a push reached the device twice: {res}"
        missing = set(res["accepted"]) - set(delivered)
        assert not missing, f"{len(missing)} accepted pushes never reached the device: {res}"
