"""Custody until the push's TTL (issue 42 item 2) over real relay processes, on a scaled clock.

Two relays: R1 is the device's home, R2 the entry relay, whose only route to the device is R1. R2's
[engine] is scaled down: custody_deadline_s = 2 stands for today's 300 s fixed deadline, custody_max_ttl_s
= 20 is a native push's lifetime, and a Web Push push says `TTL: 20`. R1 is killed (-9) before the pushes
enter and stays down for 4 s, twice the old deadline; it comes back within the TTL and both pushes are
delivered, once. No wall-clock bound is asserted: the waits only stop a hang.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from inri import mesh
from inri.client import DeviceClient, HomeAppClient

pytestmark = pytest.mark.integration
OLD_DEADLINE_S = 2.0  # the scaled custody_deadline_s: 300 s before issue 42
TTL_S = 20  # the scaled TTL: a native push's custody_max_ttl_s, and the Web Push push's TTL header
DOWN_S = 4.0  # the home (the only route) is down this long: twice the old deadline
ENTRY = {"custody_deadline_s": OLD_DEADLINE_S, "custody_max_ttl_s": float(TTL_S), "custody_park_max_s": 1.0,
         "custody_retry_s": 0.1}


async def _status(c: httpx.AsyncClient, url: str) -> str:
    r = await c.get(url)
    assert r.status_code == 200, r.text
    return str(r.json()["status"])


async def _scenario(info: dict[str, Any]) -> None:
    home, entry = info["relays"]
    dev = DeviceClient(home["api"])
    app = HomeAppClient([entry["api"]])
    async with httpx.AsyncClient(timeout=5) as c:
        await dev.register(tokens=2)
        endpoint = await dev.mint_endpoint()
        with trio.fail_after(30):  # the route reaches the entry relay
            while (await c.get(entry["api"] + "/v1/status")).json()["routes"] < 1:
                await trio.sleep(0.1)
        cred = dev.export_credential(2)
        wp_url = entry["api"] + "/wp/" + endpoint.url.split("/wp/", 1)[1]  # any relay answers (docs/api.md)
        os.killpg(home["pid"], signal.SIGKILL)  # the only route is down from now on
        try:
            os.waitpid(home["pid"], 0)
        except ChildProcessError:
            pass
        native = (await app.push(cred, b"kept past the old deadline")).push_id
        native_url = f"{entry['api']}/v1/push/{native}"
        r = await c.post(wp_url, headers={"ttl": str(TTL_S)})
        assert r.status_code == 201 and r.headers["ttl"] == str(TTL_S), r.text
        webpush_url = r.headers["location"]
        await trio.sleep(DOWN_S)
        # Past the (scaled) old deadline: before issue 42 both had settled `expired` by now.
        assert [await _status(c, native_url), await _status(c, webpush_url)] == ["pending", "pending"]
        await trio.to_thread.run_sync(lambda: mesh.restart_relay(info, home))
        got: dict[str, str] = {}
        with trio.move_on_after(TTL_S + 10):  # a hang guard, not a timing claim
            for name, url in (("native", native_url), ("webpush", webpush_url)):
                while (st := await _status(c, url)) == "pending":
                    await trio.sleep(0.1)
                got[name] = st
        assert got == {"native": "delivered", "webpush": "delivered"}, got
        messages = await dev.pull(limit=10)
        assert sorted((m.kind, m.plaintext) for m in messages) == [
            ("inri", b"kept past the old deadline"), ("webpush", b"")], messages
    await dev.aclose()
    await app.aclose()


def test_a_push_outlives_the_old_deadline_and_is_delivered_within_its_ttl(tmp_path: Path) -> None:
    info = mesh.up(tmp_path, relays=2, bootstraps=1, timeout_s=60, min_neighbours=1, trace_level="off",
                   engine={"R2": ENTRY})
    try:
        trio.run(_scenario, info)
    finally:
        mesh.down(tmp_path)
