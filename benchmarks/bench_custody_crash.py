"""kill -9 of the custodian mid-stream, at scale (issue 13 item 5): 1,000 pushes, nothing lost or doubled.

Real processes (`inri mesh up`: one bootstrap, home relay H, entry relay E). A home app pushes
BENCH_CRASH_PUSHES (default 1000) messages to one device homed at H, through E, 16 at a time. When
a third of them are accepted, E is killed with SIGKILL while pushes are in flight, and restarted on
the same data directory; the app keeps pushing (a push refused or unanswered while E is down is
retried with its next token, as an app would; only 202s count as accepted). Then every accepted push
must reach the device's mailbox at H exactly once. Printed: accepted, delivered, lost, stored twice
(H's count of pushes stored in a mailbox beyond the distinct ones), and the statuses at E.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections import Counter
from typing import Any

import httpx
import trio

from inri import mesh
from inri.client import DeviceClient, HomeAppClient
from inri.client.errors import ApiError
from inri.node.metrics import parse_metrics

TOTAL = int(os.environ.get("BENCH_CRASH_PUSHES", "1000"))
CONCURRENCY = 16


async def run(info: dict[str, Any]) -> dict[str, Any]:
    home, entry = info["relays"]
    dev = DeviceClient(home["api"])
    await dev.register(tokens=500)
    while len(dev.tokens) < TOTAL + 200:
        await dev.more_tokens(min(500, TOTAL + 200 - len(dev.tokens)))
    cred = dev.export_credential(TOTAL + 200)
    async with httpx.AsyncClient(timeout=5) as c:
        with trio.fail_after(30):
            while (await c.get(entry["api"] + "/v1/status")).json()["routes"] < 1:
                await trio.sleep(0.1)
    accepted: list[str] = []
    refused = 0
    killed = trio.Event()
    up_again = trio.Event()
    sent = iter(range(TOTAL))

    async def pusher(client: httpx.AsyncClient) -> None:
        nonlocal refused
        app = HomeAppClient([entry["api"]], client=client, timeout_s=5)
        for k in sent:
            try:
                accepted.append((await app.push(cred, f"m{k}".encode())).push_id)
            except (ApiError, httpx.HTTPError, OSError):
                refused += 1  # E is down (or the request died with it): not accepted
                await up_again.wait()

    async def killer() -> None:
        while len(accepted) < TOTAL // 3:
            await trio.sleep(0.01)
        os.killpg(entry["pid"], signal.SIGKILL)
        killed.set()
        await trio.to_thread.run_sync(mesh.restart_relay, info, entry)
        up_again.set()

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=5) as client, trio.open_nursery() as n:
        n.start_soon(killer)
        for _ in range(CONCURRENCY):
            n.start_soon(pusher, client)
    got: list[str] = []
    with trio.move_on_after(120):
        while not set(accepted) <= set(got):
            got = [m.id for m in await dev.pull(limit=1000)]
            await trio.sleep(0.5)
    elapsed = time.perf_counter() - t0
    app = HomeAppClient([entry["api"]])
    statuses: Counter[str] = Counter()
    for pid in accepted:
        statuses[(await app.status(pid, entry["api"]))["status"]] += 1
    async with httpx.AsyncClient(timeout=5) as c:
        stored = parse_metrics((await c.get(home["api"] + "/metrics")).text)["inri_pushes_delivered_total"]
    return {"accepted": len(accepted), "refused_while_down": refused, "delivered": len(set(accepted) & set(got)),
            "lost": len(set(accepted) - set(got)), "stored_twice": int(stored) - len(set(got)),
            "duplicates_in_mailbox": len(got) - len(set(got)), "statuses_at_entry": dict(statuses),
            "seconds": round(elapsed, 1)}


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="inri-bench-crash-") as d:
        info = mesh.up(d, relays=2, bootstraps=1, timeout_s=60, min_neighbours=1, trace_level="off")
        try:
            r = trio.run(run, info)
        finally:
            mesh.down(d)
    print(f"kill -9 of the entry relay mid-stream: {r}")
    print(json.dumps({"bench": "custody_crash", "figures": [
        {"metric": "pushes accepted (202)", "value": r["accepted"], "unit": ""},
        {"metric": "accepted pushes delivered", "value": r["delivered"], "unit": ""},
        {"metric": "accepted pushes lost", "value": r["lost"], "unit": "", "ceiling": 0},
        {"metric": "pushes stored twice", "value": r["stored_twice"] + r["duplicates_in_mailbox"], "unit": "",
         "ceiling": 0},
    ]}))


if __name__ == "__main__":
    main()
