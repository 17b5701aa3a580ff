"""`inri demo` (and `make demo`): the seed's story with real processes on loopback.

Starts a bootstrap node and six relay processes (`inri mesh up`), which find each other through the
bootstrap and link over QUIC with 3-4 neighbours each. A device registers at R1 (its blinded route
id gossips through the mesh), its home app pushes a sealed message at R6, the push follows the cached
route vectors to R1 and reaches the device over its WebSocket stream. The demo prints the mesh the
relays chose, the path the push took (read from the relays' trace files, which `mesh up` salts with
one shared lab salt so they join), the latency and the decrypted message, then stops everything.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from inri import mesh
from inri.client import DeviceClient, HomeAppClient
from inri.node.tracefile import read_trace

MESSAGE = "calendar: new-event"


def _label(salt: str, value: str) -> str:
    return hashlib.blake2b(salt.encode() + value.encode(), digest_size=8).hexdigest()


def _path(info: dict[str, Any], push_id: str, start: str) -> list[str]:
    """Follow push_forwarded rows from the injecting relay to the home relay."""
    names = {r["node_id"]: r["name"] for r in info["relays"]}
    label = _label(info["trace_salt"], push_id)
    hops: dict[str, str] = {}
    for r in info["relays"]:
        for row in read_trace(Path(r["data_dir"]) / "traces"):
            if row["msg"] == label and row["kind"] == "push_forwarded" and row["peer"] in names:
                hops.setdefault(r["name"], names[row["peer"]])
    path = [start]
    while path[-1] in hops and len(path) <= len(names):
        path.append(hops[path[-1]])
    return path


async def _run(info: dict[str, Any]) -> dict[str, Any]:
    relays = {r["name"]: r for r in info["relays"]}
    home, entry = relays["R1"], relays["R6"]
    device = DeviceClient(home["api"])
    await device.register(tokens=10)
    credential = device.export_credential(5)
    route_id = device.device_id
    # Wait until R6 has learned a route for the device (the registration gossip reached it).
    async with httpx.AsyncClient(timeout=5) as c:
        with trio.fail_after(20):
            while (await c.get(entry["api"] + "/v1/status")).json()["routes"] < 1:
                await trio.sleep(0.05)
    app = HomeAppClient([entry["api"]])
    out: dict[str, Any] = {}
    async with device.stream() as messages:
        t0 = time.perf_counter()
        receipt = await app.push(credential, MESSAGE.encode())
        with trio.fail_after(20):
            msg = await messages.receive()
        latency_ms = (time.perf_counter() - t0) * 1000
    await trio.sleep(0.3)  # let the receipt travel back and the traces flush
    status = await app.status(receipt.push_id, entry["api"])
    out.update(push_id=receipt.push_id, device_id=route_id, message=msg.plaintext.decode(),
               delivered=msg.id == receipt.push_id and msg.plaintext.decode() == MESSAGE,
               latency_ms=round(latency_ms, 2), custody_status=status["status"], hops=status["hops"])
    return out


def run_demo(directory: str | Path | None = None, *, keep: bool = False) -> dict[str, Any]:
    """Start the mesh, run the story, stop the mesh (unless keep); return what the demo prints."""
    tmp = None
    if directory is None:
        tmp = tempfile.TemporaryDirectory(prefix="inri-demo-")
        directory = tmp.name
    # Every relay with at least 2 links (3 can be impossible: with 6 relays of at most 4 links, one may
    # be left at 2 while the other five are full, and 2 is enough for the story).
    info = mesh.up(directory, relays=6, bootstraps=1, min_neighbours=2)
    try:
        names = {r["node_id"]: r["name"] for r in info["relays"]}
        links = sorted({tuple(sorted((r["name"], names[n["node_id"]])))
                        for r in info["relays"] for n in mesh.status(r["api"])["neighbours"] if n["node_id"] in names})
        out = trio.run(_run, info)
        out["path"] = _path(info, out["push_id"], "R6")
        return {"relays": len(info["relays"]), "bootstraps": len(info["bootstraps"]),
                "links": [f"{a}-{b}" for a, b in links], **out,
                "mesh_dir": str(directory) if keep else None}
    finally:
        if not keep:
            mesh.down(directory)
            if tmp is not None:
                tmp.cleanup()


def main(as_json: bool = False, keep: str | None = None) -> int:
    """Print the demo, as text or one JSON object."""
    try:
        out = run_demo(keep, keep=keep is not None)
    except (mesh.MeshError, trio.TooSlowError, httpx.HTTPError) as exc:
        print(f"inri demo: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(out))
        return 0 if out["delivered"] else 1
    w = sys.stdout.write
    w("INRI demo: a bootstrap node and six relay processes on loopback, linked over QUIC\n\n")
    w(f"Mesh the relays formed (via the bootstrap's peer lists): {', '.join(out['links'])}\n")
    w("A device registered at R1; its blinded route id gossiped through the mesh.\n")
    w(f"Its home app pushed a sealed message at R6 (push {out['push_id']}).\n")
    w(f"Path it took (from the relays' traces): {' -> '.join(out['path'])}\n")
    w(f"Delivered over the device's WebSocket: {out['delivered']} in {out['latency_ms']} ms; "
      f"R6's custody status: {out['custody_status']} after {out['hops']} hop(s)\n")
    w(f"Device decrypted: {out['message']!r} (relays only carried ciphertext)\n")
    if out.get("mesh_dir"):
        w(f"Mesh left running in {out['mesh_dir']}: stop it with `inri mesh down --dir {out['mesh_dir']}`\n")
    else:
        w("Mesh stopped.\n")
    return 0 if out["delivered"] else 1
