"""The fuzz campaign (fuzz/campaign.py) with its short CI profile; `make bench` runs 100,000 decoder cases
and 10,000 live ones (benchmarks/bench_fuzzing.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from fuzz.campaign import format_report, fuzz_decoders, fuzz_http, fuzz_quic
from fuzz.http_head import fuzz_head_parser
from inri import mesh
from inri.node.config import load_config
from tests.inproc import relay_api


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("fuzzlab")
    info = mesh.up(d, relays=2, bootstraps=1, timeout_s=60, min_neighbours=1)
    try:
        yield info
    finally:
        mesh.down(d)


def test_every_decoder_raises_only_its_documented_error() -> None:
    report = fuzz_decoders(3000, seed=11)
    assert not report.failures, format_report("decoders", report)
    assert len(report.cases) >= 10 and report.total == 3000
    # The mutations reach both sides: some inputs decode, most are refused.
    for target in ("codec.decode", "peer_record.decode_record", "scenario.from_dict"):
        assert report.outcomes[f"{target}: accepted"] > 0
        assert sum(v for k, v in report.outcomes.items() if k.startswith(f"{target}: rejected")) > 0


def test_the_fronts_request_parser_gives_h11s_result_or_hands_over_whole_and_byte_by_byte() -> None:
    """fuzz/http_head.py (h11's fuzz/afl-server.py invariant, with the front's refusals): short profile."""
    report = fuzz_head_parser(2500, seed=41)
    assert not report.failures, format_report("HTTP head parser", report)
    for kind in ("fast", "h11", "refused 400", "refused 431", "need more"):
        assert report.outcomes[f"front.parse_head: {kind}"] > 0, format_report("HTTP head parser", report)


def test_the_head_fuzzer_reports_a_parser_that_lets_smuggling_through(monkeypatch: pytest.MonkeyPatch) -> None:
    import fuzz.http_head
    from inri.common.front import parse

    def lenient(buf: bytes, end: int) -> object:
        return parse.DEFER

    monkeypatch.setattr(parse, "_slow", lenient)
    report = fuzz.http_head.fuzz_head_parser(300, seed=41)
    assert any("but the head has" in f for f in report.failures), format_report("HTTP head parser", report)


def test_the_campaign_reports_a_decoder_that_raises_the_wrong_error() -> None:
    def broken(data: bytes) -> object:
        if len(data) % 3 == 0:
            raise KeyError("oops")
        return None

    report = fuzz_decoders(200, seed=1, extra={"broken": (broken, (ValueError,), "bytes", [b"\x93\x01\x02\x03"])})
    assert report.outcomes["broken: FAILED"] > 0
    assert any("KeyError" in f for f in report.failures)


async def test_http_seed_requests_get_past_field_validation(tmp_path: Path) -> None:
    """Seeds encode registrations in base64url (the API's encoding): requests reach the checks behind
    the 422 (already registered, not newer, accepted) instead of nearly all stopping at invalid_field."""
    cfg = load_config(None, env={"INRI_API_RATE_PER_S": "100000", "INRI_API_RATE_BURST": "100000",
                                 "INRI_API_TARPIT_S": "0", "INRI_API_DEVICE_RATE_BURST": "100000"})
    with trio.fail_after(60):
        async with relay_api(tmp_path, cfg) as url:
            report = await fuzz_http(url, 300, seed=5)
    assert not report.failures, format_report("http", report)
    past_422 = sum(report.outcomes[k] for k in ("http: accepted 201", "http: accepted 202",
                                                 "http: rejected 409 already_registered",
                                                 "http: rejected 400 not_newer"))
    assert past_422 >= 10, format_report("http", report)


async def test_the_http_campaign_fails_when_the_server_fails_after_answering(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41 item 9: every answer arrives, then the connection's handling fails (a client only sees a
    closed keep-alive connection and opens another): the campaign reports it."""
    from inri.common.front.connection import Connection

    original = Connection._fast_request

    async def answer_then_fail(self: Connection, *args: Any) -> None:
        await original(self, *args)
        raise RuntimeError("injected after the answer")

    monkeypatch.setattr(Connection, "_fast_request", answer_then_fail)
    cfg = load_config(None, env={"INRI_API_RATE_PER_S": "100000", "INRI_API_RATE_BURST": "100000",
                                 "INRI_API_TARPIT_S": "0"})
    with trio.fail_after(60):
        async with relay_api(tmp_path, cfg) as url:
            report = await fuzz_http(url, 30, seed=5)
    assert any("the HTTP server failed during the campaign" in f for f in report.failures), \
        format_report("http", report)


@pytest.mark.integration
async def test_a_live_relay_api_and_quic_port_survive_fuzzing(lab: dict[str, Any]) -> None:
    r = lab["relays"][0]
    http = await fuzz_http(r["api"], 300, seed=5)
    assert not http.failures, format_report("http", http)
    assert http.cases["http"] == 300 and any(k.startswith("http: rejected 422") for k in http.outcomes)
    quic = await fuzz_quic(r["api"], r["quic"], r["node_id"], 150, seed=5)
    assert not quic.failures, format_report("quic", quic)
    assert quic.outcomes["quic: rejected with error frame"] > 50
    log = Path(r["log"]).read_text()
    assert "Traceback" not in log
    assert "HTTP connection failed" not in log and "HTTP listener failed" not in log


def _alive(api: str, wait_s: float = 3.0) -> bool:
    import time

    import httpx

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(api + "/healthz", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


@pytest.mark.integration
def test_one_quic_initial_with_an_unknown_version_does_not_kill_the_relay(lab: dict[str, Any]) -> None:
    """Regression (fuzz finding F9): aioquic was handed a connection it never set up, and the
    IndexError it raised ended the relay's QUIC endpoint and the relay with it."""
    import socket
    import time

    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

    from inri.common.addr import parse_addr
    from inri.node.quic import ALPN

    r = lab["relays"][1]
    addr = parse_addr(r["quic"])
    q = QuicConnection(configuration=QuicConfiguration(is_client=True, alpn_protocols=[ALPN]))
    q.connect(addr, now=time.monotonic())
    pkt = q.datagrams_to_send(now=time.monotonic())[0][0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(pkt[:1] + bytes.fromhex("1a2a3a4a") + pkt[5:], addr)
        # The same Initial with the right version next, on the same socket: the relay reads its datagrams
        # in order, so its answer to this one shows it has handled the bad one (no sleep and hope).
        s.sendto(pkt, addr)
        s.settimeout(20)  # a guard: a relay that died answers nothing
        try:
            answer, _ = s.recvfrom(65_536)
        except TimeoutError:
            pytest.fail("the relay answered nothing after the Initial with an unknown version: it died")
    assert answer[0] & 0x80  # a long-header packet: the handshake's first answer
    assert _alive(r["api"])


@pytest.mark.integration
def test_trailing_bytes_after_a_final_request_do_not_take_the_relay_down(lab: dict[str, Any]) -> None:
    """Regression (fuzz finding F8): hypercorn 0.18 ends its server on bytes after a request that
    closes the connection; the relay serves its API again at once instead of dying."""
    import socket

    r = lab["relays"][1]
    port = int(r["api"].rsplit(":", 1)[1])
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\nXXXXXXXXXX")
            s.settimeout(2)
            try:
                s.recv(10_000)
            except OSError:
                pass
        assert _alive(r["api"])


@pytest.mark.integration
def test_deeply_nested_json_is_malformed_not_an_internal_error(lab: dict[str, Any]) -> None:
    """Regression (fuzz finding F1): json.loads raises RecursionError on deep nesting."""
    import httpx

    r = lab["relays"][0]
    for path in ("/v1/push", "/v1/devices"):
        resp = httpx.post(r["api"] + path, content=b"[" * 3000, headers={"content-type": "application/json"})
        assert resp.status_code == 400 and resp.json()["code"] == "malformed_json"
    with pytest.raises(ValueError):
        from inri.client.credential import PushCredential

        PushCredential.from_json("[" * 3000)
