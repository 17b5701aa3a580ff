"""Real relay processes on loopback: 8 relays + 1 bootstrap (inri mesh up), the issue's acceptance runs.

The tests share one mesh (module fixture `lab`) and the first push across it (module fixture `first`:
a device homed at R1, a push from the farthest relay, the path it took); they do not depend on their
order: a test that kills a relay restarts it on its addresses before it ends.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import trio

from inri import mesh
from inri.client import DeviceClient, HomeAppClient
from inri.live_demo import _label, _path
from inri.node.identity import NodeIdentity
from inri.node.metrics import parse_metrics
from inri.node.quic import ConnectError, LinkClosed, QuicEndpoint, parse_addr
from inri.node.tracefile import read_trace
from inri.protocol.codec import decode
from inri.protocol.messages import ErrorFrame

pytestmark = pytest.mark.integration
N = 8


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("mesh")
    # R8 accepts up to N neighbours, so it always has room for the hostile peer of the garbage-frame test
    # (the others keep the default 4 and may all be full); it still dials only up to active_min.
    # 3 neighbours each, or 2 for a relay every full relay refuses (rule M4; mesh.waiting_for).
    info = mesh.up(d, relays=N, bootstraps=1, timeout_s=90, min_neighbours=3,
                   engine={f"R{N}": {"active_max": N}})
    try:
        yield info
    finally:
        mesh.down(d)  # always: a failed test must not leave relays running (restart() kept mesh.json current)


def ensure_up(info: dict[str, Any]) -> None:
    """Restart any relay of the lab that is down (a test that failed midway may have left one)."""
    for r in info["relays"]:
        try:
            httpx.get(r["api"] + "/healthz", timeout=2).raise_for_status()
        except httpx.HTTPError:
            mesh.restart_relay(info, r)


@pytest.fixture(scope="module")
def first(lab: dict[str, Any]) -> dict[str, Any]:
    """A device homed at R1 and one push from the farthest relay: what it took (far, path, device, cred)."""
    return trio.run(_first_push, lab)


async def _first_push(lab: dict[str, Any]) -> dict[str, Any]:
    g = graph(lab)
    dist = distances(g, "R1")
    assert len(dist) == N, f"mesh not connected: {g}"
    far = max(sorted(dist), key=lambda n: dist[n])
    dev = DeviceClient(relay(lab, "R1")["api"])
    await dev.register(tokens=20)
    cred = dev.export_credential(20)
    await wait_route(relay(lab, far)["api"])
    app = HomeAppClient([relay(lab, far)["api"]])
    with trio.fail_after(30):
        async with dev.stream() as messages:
            receipt = await app.push(cred, b"from the far side")
            msg = await messages.receive()
    with trio.fail_after(10):
        while (st := await app.status(receipt.push_id, relay(lab, far)["api"]))["status"] == "pending":
            await trio.sleep(0.05)
    return {"far": far, "dist": dist, "device": dev, "cred": cred, "receipt": receipt, "msg": msg, "status": st,
            "path": _path(lab, receipt.push_id, far)}


def graph(info: dict[str, Any]) -> dict[str, set[str]]:
    names = {r["node_id"]: r["name"] for r in info["relays"]}
    g: dict[str, set[str]] = {r["name"]: set() for r in info["relays"]}
    for r in info["relays"]:
        try:
            st = mesh.status(r["api"])
        except httpx.HTTPError:
            continue
        for n in st["neighbours"]:
            if n["node_id"] in names:
                g[r["name"]].add(names[n["node_id"]])
                g[names[n["node_id"]]].add(r["name"])
    return g


def distances(g: dict[str, set[str]], src: str) -> dict[str, int]:
    dist = {src: 0}
    q = collections.deque([src])
    while q:
        u = q.popleft()
        for v in sorted(g[u]):
            if v not in dist:
                dist[v] = dist[u] + 1
                q.append(v)
    return dist


def relay(info: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in info["relays"] if r["name"] == name)


async def wait_route(api: str, want: int = 1, timeout: float = 30.0) -> None:
    async with httpx.AsyncClient(timeout=5) as c:
        with trio.fail_after(timeout):
            while (await c.get(api + "/v1/status")).json()["routes"] < want:
                await trio.sleep(0.05)


async def test_push_at_the_farthest_relay_reaches_the_device_along_the_route_vectors(
    lab: dict[str, Any], first: dict[str, Any]
) -> None:
    far, dist, dev, receipt, msg, st = (first[k] for k in ("far", "dist", "device", "receipt", "msg", "status"))
    assert (msg.id, msg.plaintext) == (receipt.push_id, b"from the far side")
    assert st["status"] == "delivered"
    path = first["path"]
    assert path[0] == far and path[-1] == "R1"
    assert len(path) - 1 == st["hops"] >= dist[far]
    # Each hop followed the route vector its relay cached from the registration gossip (route_set or
    # route_backup rows of that relay's trace name the next hop as an arrival of this route id).
    route_label = _label(lab["trace_salt"], dev.device_id or "")
    for a, b in zip(path[:-1], path[1:], strict=False):
        rows = read_trace(Path(relay(lab, a)["data_dir"]) / "traces")
        vector = {r["peer"] for r in rows if r["route"] == route_label and r["kind"] in ("route_set", "route_backup")}
        assert relay(lab, b)["node_id"] in vector, (a, b)
    # The relays' metrics moved with this traffic.

    async with httpx.AsyncClient(timeout=5) as c:
        m_far = parse_metrics((await c.get(relay(lab, far)["api"] + "/metrics")).text)
        m_home = parse_metrics((await c.get(relay(lab, "R1")["api"] + "/metrics")).text)
    assert m_far["inri_pushes_accepted_total"] >= 1 and m_far["inri_pushes_out_total"] >= 1
    assert m_far["inri_gossip_in_total"] >= 1 and m_far["inri_routes_cached"] >= 1 and m_far["inri_neighbours"] >= 1
    assert m_far['inri_custody_settled_total{status="delivered"}'] >= 1
    assert m_home["inri_pushes_delivered_total"] >= 1 and m_home["inri_gossip_out_total"] >= 1


def _forms(value: bytes) -> list[bytes]:
    """Every encoding a secret could be written in: raw, hex, base64 (both alphabets, unpadded)."""
    import base64

    b64 = base64.b64encode(value).rstrip(b"=")
    return [value, value.hex().encode(), b64, base64.urlsafe_b64encode(value).rstrip(b"=")]


def test_an_intermediate_relay_keeps_no_payload_token_secret_or_route_id_on_disk(
    lab: dict[str, Any], first: dict[str, Any]
) -> None:
    """Privacy check (issue 6): every file of the relays the first push crossed between its custodian
    and the home relay (store, WAL, traces, logs, keys) is searched for what would identify the
    device or the content."""
    dev: DeviceClient = first["device"]
    cred = first["cred"]
    intermediates = first["path"][1:-1]
    if not intermediates:
        pytest.skip("the farthest relay is the home relay's neighbour in this mesh")
    secrets_ = {"plaintext": [b"from the far side"], "device secret": [str(dev.secret).encode()],
                "route id": _forms(bytes.fromhex(str(dev.device_id))),
                "seal private key": _forms(bytes(dev.keys.seal_key)),
                "route private key": _forms(bytes(dev.keys.route_key))}
    for i, token in enumerate(cred.tokens + dev.tokens):
        secrets_[f"token {i}"] = _forms(token)
    scanned = 0
    for name in intermediates:
        for f in Path(relay(lab, name)["data_dir"]).rglob("*"):
            if not f.is_file():
                continue
            data = f.read_bytes()
            scanned += len(data)
            for what, forms in secrets_.items():
                assert not any(form in data for form in forms), f"{what} found in {f}"
        log = Path(relay(lab, name)["log"]).read_bytes()
        for what, forms in secrets_.items():
            assert not any(form in log for form in forms), f"{what} found in the log of {name}"
    assert scanned > 10_000  # the store and the traces were there to search
    # The home relay stores the payload sealed: the plaintext is nowhere on its disk either. It does
    # hold the device's route id and tokens (a positive control: the search finds what is there).
    home = b"".join(f.read_bytes() for f in Path(relay(lab, "R1")["data_dir"]).rglob("*") if f.is_file())
    assert b"from the far side" not in home
    assert any(form in home for form in secrets_["route id"]) and any(form in home for form in secrets_["token 0"])


def test_device_and_app_commands(lab: dict[str, Any], first: dict[str, Any], tmp_path: Path) -> None:
    """`inri device ...` and `inri app push` as a user types them, against the live mesh."""

    def inri(*args: str) -> list[dict[str, Any]]:
        proc = subprocess.run([sys.executable, "-m", "inri.cli", *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

    state, cred = str(tmp_path / "dev.json"), str(tmp_path / "cred.json")
    home, entry = relay(lab, "R3")["api"], relay(lab, "R8")["api"]
    assert inri("device", "register", "--relay", home, "--state", state, "--tokens", "5")[0]["tokens"] == 5
    assert inri("device", "credential", "--state", state, "--tokens", "3", "--out", cred)[0]["tokens"] == 3
    trio.run(wait_route, entry, 2)  # the device of the `first` fixture, and this one
    pushed = inri("app", "push", "--relay", entry, "--credential", cred, "--message", "hi there")[0]
    assert pushed["tokens_left"] == 2 and pushed["status"] == "pending"
    got = inri("device", "listen", "--state", state, "--count", "1", "--timeout", "30")
    assert got[0]["id"] == pushed["push_id"] and got[0]["message"] == "hi there"
    assert inri("device", "pull", "--state", state) == []  # listen acknowledged it
    bad = subprocess.run([sys.executable, "-m", "inri.cli", "app", "push", "--relay", entry, "--credential",
                          str(tmp_path / "missing.json"), "--message", "x"], capture_output=True, text=True)
    assert bad.returncode == 1 and "error" in bad.stderr and "Traceback" not in bad.stderr
    inri("device", "unregister", "--state", state)


async def test_thousand_pushes_from_concurrent_home_apps_delivered_exactly_once(
    lab: dict[str, Any], first: dict[str, Any]
) -> None:
    ensure_up(lab)
    homes = ["R2", "R3", "R5", "R7"]
    devices = [DeviceClient(relay(lab, h)["api"]) for h in homes]
    for d in devices:
        await d.register(tokens=250)
    for r in lab["relays"]:
        # The four devices of this test (a home does not count its own). The device of `first` is not
        # counted: a relay restarted by a kill -9 test does not relearn older routes until they refresh.
        await wait_route(r["api"], want=4 - (r["name"] in homes))
    accepted: dict[int, list[str]] = {i: [] for i in range(len(devices))}
    urls = [r["api"] for r in lab["relays"]]

    async def link_refs() -> tuple[float, float, float]:
        """(references, definitions, bytes saved) summed over the relays (link protocol inri/2)."""
        tot = [0.0, 0.0, 0.0]
        async with httpx.AsyncClient(timeout=10) as c:
            for r in lab["relays"]:
                m = parse_metrics((await c.get(r["api"] + "/metrics")).text)
                tot[0] += m['inri_link_registration_refs_total{kind="reference"}']
                tot[1] += m['inri_link_registration_refs_total{kind="define"}']
                tot[2] += m["inri_link_registration_ref_bytes_saved_total"]
        return tot[0], tot[1], tot[2]

    refs0 = await link_refs()

    async def home_app(i: int) -> None:
        cred = devices[i].export_credential(250)
        async with httpx.AsyncClient(timeout=30) as client:
            apps = [HomeAppClient([urls[(i + k) % N]], client=client) for k in range(N)]
            for k in range(250):
                receipt = await apps[k % N].push(cred, f"m{i}-{k}".encode())
                accepted[i].append(receipt.push_id)

    with trio.fail_after(240):
        async with trio.open_nursery() as n:
            for i in range(len(devices)):
                n.start_soon(home_app, i)
        # Every accepted push reaches its device's mailbox, once.
        for i, d in enumerate(devices):
            want = set(accepted[i])
            assert len(want) == 250
            got: list[str] = []
            while len(set(got)) < len(want):
                got = [m.id for m in await d.pull(limit=1000)]
                await trio.sleep(0.2)
            assert len(got) == len(set(got)) == 250 and set(got) == want
            texts = {m.plaintext for m in await d.pull(limit=1000)}
            assert texts == {f"m{i}-{k}".encode() for k in range(250)}
    # The relays sent these pushes' registrations once per link, then by reference (inri/2): at most
    # a few definitions per registration and link, and about 140 bytes saved per reference.
    refs = [new - old for new, old in zip(await link_refs(), refs0, strict=True)]
    assert refs[0] >= 500 and refs[1] <= 4 * 2 * len(lab["relays"]) and refs[2] >= 100 * refs[0]


async def test_garbage_frames_from_a_peer_get_error_frames_and_the_relay_stays_up(lab: dict[str, Any]) -> None:
    ensure_up(lab)
    # R8 has room for one more neighbour (see the lab fixture): it accepts the hostile link.
    target = relay(lab, f"R{N}")
    before = {nb["node_id"] for nb in mesh.status(target["api"])["neighbours"]}
    assert len(before) < N
    hostile = NodeIdentity.generate()
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            ep = QuicEndpoint(hostile, idle_timeout_s=5)
            await ep.bind("127.0.0.1", 0)
            await n.start(ep.serve, None)
            garbage = (b"\xc1", b"", msgpack.packb([99, 1, 2]), msgpack.packb([3, "x"]), b"\x92\x03" + b"\xff" * 300)
            link = await ep.connect(target["quic"], expect_node_id=target["node_id"])
            for frame in garbage:
                await link.send(frame)
            # Each frame gets an error frame; the fifth brings the sender's score to the cut (-20). The cut
            # closes the QUIC connection, which discards stream data not yet sent: under load the last
            # error frames can be lost with it (seen 3 of 5 on a loaded machine), so at least one must
            # arrive here and the relay's counters below show that all five were judged.
            errors = 0
            with pytest.raises(LinkClosed, match="score"):
                while True:
                    errors += isinstance(decode(await link.receive()), ErrorFrame)
            assert errors >= 1
            # Banned: the same node key is refused at once when it comes back.
            with pytest.raises((ConnectError, LinkClosed), match="banned"):
                again = await ep.connect(target["quic"], expect_node_id=target["node_id"])
                await again.receive()
            host, port = parse_addr(target["quic"])
            # Raw UDP garbage at its QUIC port.
            sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
            await sock.bind(("127.0.0.1", 0))
            for _ in range(50):
                await sock.sendto(os.urandom(1300), (host, port))
            sock.close()
            n.cancel_scope.cancel()
    async with httpx.AsyncClient(timeout=5) as c:
        assert (await c.get(target["api"] + "/healthz")).status_code == 200
        metrics = parse_metrics((await c.get(target["api"] + "/metrics")).text)
        status = (await c.get(target["api"] + "/v1/status")).json()
    assert metrics["inri_frames_invalid_total"] >= 5 and metrics["inri_peers_cut_total"] >= 1
    assert metrics['inri_peer_penalties_total{reason="invalid_frame"}'] >= 5
    assert status["banned_peers"] >= 1 and hostile.node_id not in status["peer_scores"]
    after = {nb["node_id"] for nb in status["neighbours"]}
    # The hostile link is gone; honest ones stay (one may have moved meanwhile: membership is live).
    assert hostile.node_id not in after and len(after & before) >= len(before) - 1, (before, after)


async def test_kill9_of_a_relay_on_the_path_next_push_still_delivered(
    lab: dict[str, Any], first: dict[str, Any]
) -> None:
    ensure_up(lab)
    path: list[str] = first["path"]
    dev: DeviceClient = first["device"]
    far = first["far"]
    victims = path[1:-1]
    if not victims:  # home and far are neighbours: kill another neighbour of far so repair still runs
        victims = [sorted(graph(lab)[far] - {"R1"})[0]]
    victim = relay(lab, victims[0])
    os.killpg(victim["pid"], signal.SIGKILL)
    app = HomeAppClient([relay(lab, far)["api"]])
    with trio.fail_after(60):
        async with dev.stream() as messages:
            receipt = await app.push(first["cred"], b"after the crash")
            while (msg := await messages.receive()).id != receipt.push_id:
                pass
    assert msg.plaintext == b"after the crash"
    mesh.restart_relay(lab, victim)  # the mesh is whole again for the other tests


async def test_kill9_of_the_home_relay_after_accept_device_gets_it_once_after_restart(
    lab: dict[str, Any], first: dict[str, Any]
) -> None:
    ensure_up(lab)
    home = relay(lab, "R1")
    dev: DeviceClient = first["device"]
    far = first["far"]
    # Drain what is pending so "once" is measurable.
    await dev.ack([m.id for m in await dev.pull(limit=1000)])
    os.killpg(home["pid"], signal.SIGKILL)
    app = HomeAppClient([relay(lab, far)["api"]])
    receipt = await app.push(first["cred"], b"while home was down")  # 202: in custody at `far`
    mesh.restart_relay(lab, home)
    assert (await HomeAppClient([home["api"]]).status(receipt.push_id, relay(lab, far)["api"]))["status"] in (
        "pending", "delivered")
    seen: list[str] = []
    with trio.fail_after(90):
        async with dev.stream(ack=False) as messages:
            while receipt.push_id not in seen:
                seen.append((await messages.receive()).id)
            # Give a duplicate every chance to show up: custody retries run every second in the test profile.
            with trio.move_on_after(3):
                seen.append((await messages.receive()).id)
    assert seen.count(receipt.push_id) == 1
    pulled = [m for m in await dev.pull(limit=1000) if m.id == receipt.push_id]
    assert len(pulled) == 1 and pulled[0].plaintext == b"while home was down"
    with trio.fail_after(30):
        while (st := await app.status(receipt.push_id, relay(lab, far)["api"]))["status"] == "pending":
            await trio.sleep(0.1)
    assert st["status"] in ("delivered", "duplicate")
    print(json.dumps({"home_restart": st}))
