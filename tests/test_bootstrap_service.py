"""Three real `inri-bootstrap` processes and 20 relay identities on distinct 127.0.x.y addresses."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from inri.node.bootstrap_client import BootstrapClient, BootstrapError, make_record
from inri.node.identity import NodeIdentity
from inri.node.quic import Link, QuicEndpoint
from inri.protocol.peer_record import encode_record
from tests.procs import Proc, bootstrap_cmd, bootstrap_url, wait_http

pytestmark = pytest.mark.integration

# Short sync interval, generous rates (the syncs of two peers come from 127.0.0.1), 5 relays per /24.
ENV = {"INRI_BOOTSTRAP_SYNC_INTERVAL_S": "0.3", "INRI_BOOTSTRAP_RATE_PER_S": "20", "INRI_BOOTSTRAP_RATE_BURST": "40",
       "INRI_BOOTSTRAP_PER_PREFIX_MAX": "5", "INRI_BOOTSTRAP_PROBE_TIMEOUT_S": "1.0",
       "INRI_BOOTSTRAP_LOG_FORMAT": "json"}
N_RELAYS = 20
HAMMER = 100  # requests from one address at once: 2.5x the burst


def relay_host(i: int) -> str:
    """Relay i on 127.0.<1..4>.<10+i>: four /24 prefixes of five relays each."""
    return f"127.0.{i % 4 + 1}.{10 + i}"


def held_port(kind: int = socket.SOCK_STREAM, host: str = "127.0.0.1") -> socket.socket:
    """A socket bound to a fresh port on host that never listens (TCP) or reads (UDP): connections to it
    are refused, datagrams go unanswered, and the port stays ours while the socket is open. SO_REUSEPORT:
    only a socket of ours that asks for it too (`listening_on`) can share the port."""
    s = socket.socket(socket.AF_INET, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((host, 0))
    return s


def listening_on(port: int) -> socket.socket:
    """A TCP socket listening on a port held by `held_port`, to hand to a bootstrap process."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past connections in TIME_WAIT (a restart)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


class Mesh:
    """Three bootstraps that sync with each other, so each needs the others' URLs before any starts.

    No port is picked, released and bound again: the test holds each port (`held_port`) for the whole
    test, and each start hands the bootstrap a socket already listening on it (`--listen-fd`). The
    test then closes its copy, so a stopped bootstrap's port refuses connections, and a restart gets
    the same port (the URL its peers know).
    """

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.held = [held_port() for _ in range(3)]
        self.ports = [int(s.getsockname()[1]) for s in self.held]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.procs: list[Proc | None] = [None, None, None]

    def start(self, i: int) -> None:
        peers = [u for j, u in enumerate(self.urls) if j != i]
        with listening_on(self.ports[i]) as sock:
            fd = sock.fileno()
            proc = Proc(bootstrap_cmd(f"127.0.0.1:{self.ports[i]}", self.tmp / f"b{i}", peers, listen_fd=fd),
                        self.tmp / f"b{i}.log", ENV, pass_fds=(fd,))
        self.procs[i] = proc
        assert bootstrap_url(proc) == self.urls[i], proc.tail()  # it serves the socket handed over
        wait_http(self.urls[i] + "/healthz", proc=proc)

    def stop(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None:
            assert proc.stop() == 0, proc.tail()
            self.procs[i] = None


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path)
    try:
        for i in range(3):
            m.start(i)
        yield m
    finally:
        for p in m.procs:
            if p is not None:
                p.stop()
        for s in m.held:
            s.close()


def records(url: str) -> int:
    return int(httpx.get(url + "/healthz", timeout=5).json()["records"])


async def _closer(link: Link) -> None:
    await link.aclose()


async def test_bootstrap_mesh_announce_sync_refuse_restart(mesh: Mesh) -> None:
    # The relays' QUIC endpoints are served by this test's trio loop, and the bootstraps probe them: every
    # blocking call below runs in a thread, so the endpoints keep answering (a blocked loop made a
    # bootstrap's probe time out under load: "no QUIC handshake").
    idents = [NodeIdentity.generate() for _ in range(N_RELAYS)]
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            eps = []
            for i, ident in enumerate(idents):
                ep = QuicEndpoint(ident, idle_timeout_s=5)
                await ep.bind(relay_host(i), 0)
                await nursery.start(ep.serve, _closer)
                eps.append(ep)
            now = int(time.time())
            recs = [make_record(ident, [eps[i].listen_addr], "", 100, 1, now) for i, ident in enumerate(idents)]

            # 20 relays announce, each through one bootstrap, from its own source address.
            for i, rec in enumerate(recs):
                client = BootstrapClient([mesh.urls[i % 3]], local_address=relay_host(i))
                assert await client.announce(rec) == mesh.urls[i % 3]

            # Records sync between bootstraps: each ends up with all 20.
            deadline = trio.current_time() + 30
            while any([await trio.to_thread.run_sync(records, u) < N_RELAYS for u in mesh.urls]):
                assert trio.current_time() < deadline, [records(u) for u in mesh.urls]
                await trio.sleep(0.2)

            # One bootstrap stops; relays configured with all three still get peers from the others.
            await trio.to_thread.run_sync(mesh.stop, 2)
            ranked_ok = 0
            for i, ident in enumerate(idents):
                client = BootstrapClient(mesh.urls, local_address=relay_host(i), timeout_s=2)
                peers = await client.fetch_peers(ident.node_id, None, 8)
                ids = [p.node_id for p in peers]
                assert len(set(ids)) == len(ids) >= 4
                assert ident.node_id not in ids
                # Prefix ranking: the first answer's near half is the asker's own /24.
                one = (await trio.to_thread.run_sync(partial(
                    httpx.get, mesh.urls[i % 2] + "/v1/peers", params={"node_id": ident.node_id, "count": 8},
                    timeout=5))).json()["peers"]
                same = [p for p in one[:4] if p["addr"].split(".")[2] == relay_host(i).split(".")[2]]
                ranked_ok += len(same) == 4
            assert ranked_ok == N_RELAYS

            url = mesh.urls[0]
            listed = await trio.to_thread.run_sync(lambda: httpx.get(url + "/v1/records", timeout=5))
            before = listed.json()["records"]
            victim = recs[0]

            async def refused(body: bytes, status: int, code: str) -> None:
                r = await trio.to_thread.run_sync(lambda: httpx.post(
                    url + "/v1/announce", content=body, timeout=10, headers={"content-type": "application/msgpack"}))
                assert r.status_code == status, r.text
                assert r.headers["content-type"] == "application/problem+json"
                assert r.json()["code"] == code

            forged = replace(victim, seq=5, signature=bytes(64))
            await refused(encode_record(forged), 403, "bad_signature")
            await refused(encode_record(victim), 409, "replayed_seq")
            expired = make_record(idents[0], [eps[0].listen_addr], "", 100, 9, now - 3600)
            await refused(encode_record(expired), 400, "stale_record")
            await refused(b"\x00" * (1024 * 1024), 413, "too_large")
            await refused(b"\xc1garbage", 400, "malformed")
            # An address where no relay with the announcing key answers (another relay's address) is
            # never listed; nor is a dead one.
            stranger, squatted = NodeIdentity.generate(), NodeIdentity.generate()
            ep_s = QuicEndpoint(squatted, idle_timeout_s=5)
            await ep_s.bind("127.0.6.6", 0)
            await nursery.start(ep_s.serve, _closer)
            await refused(encode_record(make_record(stranger, [ep_s.listen_addr], "", 1, 1, now)), 422, "unreachable")
            with held_port(socket.SOCK_DGRAM, "127.0.9.9") as silent:  # bound, never read: no QUIC answers
                dead = f"127.0.9.9:{silent.getsockname()[1]}"
                await refused(encode_record(make_record(stranger, [dead], "", 1, 1, now)), 422, "unreachable")
            # A sixth relay in a full /24 is refused.
            extra = NodeIdentity.generate()
            ep_x = QuicEndpoint(extra, idle_timeout_s=5)
            await ep_x.bind("127.0.1.99", 0)
            await nursery.start(ep_x.serve, _closer)
            await refused(encode_record(make_record(extra, [ep_x.listen_addr], "", 1, 1, now)), 409, "prefix_full")
            after = await trio.to_thread.run_sync(lambda: httpx.get(url + "/v1/records", timeout=5))
            assert after.json()["records"] == before  # nothing changed

            # Per-source rate limit: one address hammering gets 429 with Retry-After; others are unaffected.
            # The requests go at once: sent one after another, a loaded machine spaced them so far apart
            # that the bucket (burst 40, 20/s) refilled between them and none was refused.
            answers: list[httpx.Response] = []
            pool = httpx.Limits(max_connections=HAMMER, max_keepalive_connections=HAMMER)
            transport = httpx.AsyncHTTPTransport(local_address="127.0.5.5", limits=pool)
            async with httpx.AsyncClient(transport=transport, timeout=30) as c:

                async def one() -> None:
                    answers.append(await c.get(url + "/v1/peers", params={"count": 1}))

                async with trio.open_nursery() as hammer:
                    for _ in range(HAMMER):
                        hammer.start_soon(one)
            codes = [a.status_code for a in answers]
            assert 200 in codes and 429 in codes, codes
            assert all(a.headers.get("retry-after") for a in answers if a.status_code == 429)
            ok = await trio.to_thread.run_sync(lambda: httpx.get(url + "/v1/peers", params={"count": 1}, timeout=5))
            assert ok.status_code == 200

            # Restarting a bootstrap keeps its live records.
            await trio.to_thread.run_sync(mesh.start, 2)
            assert await trio.to_thread.run_sync(records, mesh.urls[2]) == N_RELAYS
            with pytest.raises(BootstrapError):
                await BootstrapClient(["http://127.0.0.1:9"], timeout_s=1).fetch_peers("x", None, 4)
            nursery.cancel_scope.cancel()


def test_listen_fd_must_be_a_tcp_socket(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`serve --listen-fd N` refuses, as a configuration error (exit 2), what it cannot serve on."""
    from bootstrap_nodes.cli import main

    base = ["serve", "--data-dir", str(tmp_path)]
    with open(tmp_path / "f", "w") as f, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        closed = os.dup(f.fileno())
        os.close(closed)
        cases = ((closed, "Bad file descriptor"), (f.fileno(), "not a socket"), (udp.fileno(), "not a TCP socket"))
        for fd, why in cases:
            assert main([*base, "--listen-fd", str(fd)]) == 2
            assert f"configuration error: --listen-fd {fd}: {why}" in capsys.readouterr().err
        assert os.fstat(udp.fileno())  # checking it did not close the caller's descriptor
