"""The shared ASGI helpers (inri/common/http.py) as both services use them, the relay's start-up failure
through the real process, and the HTTP benchmark's wrk parser."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from bootstrap_nodes.config import BootstrapConfig
from bootstrap_nodes.service import Bootstrap, BootstrapApp
from inri.common.http import Problem, Route, Router
from tests.inproc import serving
from tests.procs import ROOT


async def _nothing(*args: object) -> tuple[int, object]:
    return 200, None


def test_router_answers_405_with_allow_and_404_for_unknown_paths() -> None:
    router = Router([Route("GET", "/v1/push/{push_id}", _nothing), Route("DELETE", "/v1/devices/{device_id}", _nothing),
                     Route("POST", "/v1/devices/{device_id}/ack", _nothing, 100)])
    route, params = router.match("POST", "/v1/devices/ab/ack")
    assert (route.max_body, params) == (100, {"device_id": "ab"})
    with pytest.raises(Problem) as e:
        router.match("PUT", "/v1/devices/ab")
    assert (e.value.status, e.value.code, e.value.headers) == (405, "method_not_allowed", [(b"allow", b"DELETE")])
    with pytest.raises(Problem) as e:
        router.match("GET", "/v1/devices/ab/cd")
    assert e.value.status == 404
    with pytest.raises(Problem):
        router.match("GET", "/v1/push/a/b")  # a parameter is one path segment


async def test_bootstrap_answers_problems_with_allow_and_a_scrape_prometheus_parses(tmp_path: Path) -> None:
    async def prober(addr: str, node_id: str) -> bool:
        return False

    boot = Bootstrap(BootstrapConfig(data_dir=str(tmp_path / "b"), max_body_bytes=1024), prober)
    try:
        with trio.fail_after(30):
            async with serving(BootstrapApp(boot)) as url:
                async with httpx.AsyncClient() as c:
                    r = await c.get(url + "/v1/announce")
                    assert r.status_code == 405 and r.headers["allow"] == "POST"
                    assert r.headers["content-type"] == "application/problem+json"
                    r = await c.post(url + "/v1/announce", content=b"\xc1")
                    assert (r.status_code, r.json()["code"]) == (400, "malformed")
                    r = await c.post(url + "/v1/announce", content=b"x" * 2000)
                    assert (r.status_code, r.json()["code"]) == (413, "too_large")
                    assert (await c.get(url + "/v1/peers?count=3")).json() == {"peers": []}
                    scrape = await c.get(url + "/metrics")
    finally:
        boot.close()
    assert scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(scrape.text) for s in fam.samples}
    assert samples[("inri_bootstrap_records", ())] == 0
    assert samples[("inri_bootstrap_events_total", (("event", "refused_malformed"),))] == 1
    assert samples[("inri_bootstrap_events_total", (("event", "peer_lists"),))] == 1
    assert samples[("inri_bootstrap_http_responses_total", (("code", "405"),))] == 1
    assert samples[("inri_bootstrap_http_responses_total", (("code", "413"),))] == 1
    assert ("inri_bootstrap_rate_limited_total", ()) in samples


@pytest.mark.integration
def test_relay_whose_api_port_is_taken_exits_at_once_naming_the_address(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        proc = subprocess.run([sys.executable, "-m", "inri.cli", "relay", "--api", addr, "--quic", "127.0.0.1:0",
                               "--data-dir", str(tmp_path / "r"), "--bootstrap", "http://127.0.0.1:9"],
                              cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0  # and at once: the 30 s timeout above guards a relay that waits or retries
    lines = proc.stderr.strip().splitlines()
    assert addr in lines[-1] and "HTTP API" in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr


# `wrk -t1 -c32 -d5s --latency` (wrk 4.1) output; the +/- Stdev column holds "68.50%" and "70.99%",
# which a bare `50%` / `99%` search matches before the Latency Distribution lines.
WRK_OUTPUT = """Running 5s test @ http://127.0.0.1:8481/v1/push
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    11.62ms    3.05ms  41.09ms   68.50%
    Req/Sec     2.77k   210.44     3.05k    70.99%
  Latency Distribution
     50%   11.11ms
     75%   13.02ms
     90%   15.37ms
     99%  102.40us
  13806 requests in 5.00s, 2.28MB read
  Non-2xx or 3xx responses: 17
Requests/sec:   2760.41
Transfer/sec:    466.06KB
"""


def test_wrk_parser_reads_the_latency_distribution_not_the_stdev_column() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_http_push import parse_wrk

    rps, p50, p99, bad = parse_wrk(WRK_OUTPUT)
    assert rps == 2760.41 and bad == 17
    assert math.isclose(p50, 0.01111) and math.isclose(p99, 102.40e-6)
    assert all(math.isnan(x) for x in parse_wrk("wrk: connection refused")[1:3])


async def test_respond_sends_json_it_is_given_already_encoded_and_encodes_the_rest_compactly() -> None:
    """respond(): bytes are a JSON body already encoded (the push handler's 202), sent as they are;
    anything else is encoded as json.dumps(..., separators=(",", ":")) would; both counted by status."""
    from inri.common.http import StatusCounts, respond

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    counts = StatusCounts()
    await respond(send, counts, 202, b'{"push_id":"00","status":"pending"}')
    payload = {"a": [1, 2.5, None, True], "b": "\u00e9\u2028"}
    await respond(send, counts, 200, payload, headers=[(b"x-one", b"1")])
    assert sent[0] == {"type": "http.response.start", "status": 202,
                       "headers": [(b"content-type", b"application/json"), (b"content-length", b"35")]}
    assert sent[1] == {"type": "http.response.body", "body": b'{"push_id":"00","status":"pending"}'}
    body = json.dumps(payload, separators=(",", ":")).encode()
    assert sent[2]["headers"] == [(b"content-type", b"application/json"),
                                  (b"content-length", str(len(body)).encode()), (b"x-one", b"1")]
    assert sent[3]["body"] == body
    assert counts == {202: 1, 200: 1}


def test_base64url_decoding_is_strict_with_and_without_padding() -> None:
    """b64d: the URL-safe alphabet only, padding optional; whitespace, '+', '/', other characters, a
    length no encoding has, or a wrong size are refused (the unpadded text takes a faster path)."""
    import base64

    from inri.common.b64url import b64d

    for raw in (b"", b"a", b"ab", b"abc", bytes(range(256))):
        text = base64.urlsafe_b64encode(raw).decode()
        assert b64d(text) == raw and b64d(text.rstrip("=")) == raw
    assert b64d("-_8") == b"\xfb\xff"
    for bad in ("a", "ab c", "ab\n", "abc+", "ab/d", "ab=c", "abc==d", "\u00e9abc", "ab\x00c", "abc.", 5, None):
        with pytest.raises(ValueError):
            b64d(bad, "token")
    with pytest.raises(ValueError, match="token: expected 2 bytes"):
        b64d("YWJj", "token", 2)
