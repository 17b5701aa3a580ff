"""The relay HTTP/WebSocket API, served by the HTTP front on loopback, driven by httpx and the SDK."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import open_websocket_url

from inri.client import ApiError, DeviceClient, HomeAppClient
from inri.client.credential import b64e, seal
from inri.node import api
from inri.node.api import create_app
from inri.node.config import RelayConfig
from inri.node.metrics import parse_metrics
from inri.node.service import RelayService
from inri.node.store import Store
from inri.node.tracefile import TraceFile
from inri.protocol.codec import encode_registration
from tests.inproc import serving


class NullNetwork:
    """A relay with no neighbours: frames it would send are only counted."""

    def __init__(self) -> None:
        self.sent = 0

    def send(self, peer: str, frame: bytes, delay: float) -> None:
        self.sent += 1

    def connect(self, peer: str, addr: str) -> None:
        pass

    def disconnect(self, peer: str, reason: str) -> None:
        pass


@asynccontextmanager
async def relay(tmp: Path, cfg: RelayConfig | None = None) -> AsyncIterator[tuple[str, RelayService]]:
    cfg = cfg or RelayConfig()
    store = Store(tmp / "relay.sqlite3")
    service = RelayService("a" * 32, cfg.engine.test_profile(), store, NullNetwork(),
                           TraceFile(tmp / "traces", "a" * 32))
    async with trio.open_nursery() as n:
        await n.start(service.run)
        app = create_app(service, config=cfg)
        await n.start(app.agents.run)
        await n.start(app.mozpush.run)
        try:
            async with serving(app, cfg.api) as url:  # port 0, read back
                yield url, service
        finally:
            n.cancel_scope.cancel()
            store.close()


def problem(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["code"] == code and body["status"] == status and body["type"].endswith(code)


async def test_register_push_stream_pull_ack_status(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, service):
            dev = DeviceClient(url, state_path=tmp_path / "dev.json")
            device_id = await dev.register(tokens=5)
            cred = dev.export_credential(5)
            app = HomeAppClient([url])
            async with dev.stream(ack=False) as messages:
                first = await app.push(cred, b"one")
                got = await messages.receive()
            assert (got.id, got.plaintext) == (first.push_id, b"one")
            assert (await app.status(first.push_id, url))["status"] == "delivered"
            second = await app.push(cred, b"two")
            pulled = await dev.pull()
            assert [m.plaintext for m in pulled] == [b"one", b"two"]
            assert await dev.ack([first.push_id, second.push_id]) == 2
            assert await dev.pull() == []
            # Acknowledged messages are never sent again: a new stream starts empty, then gets new ones.
            async with dev.stream() as messages:
                third = await app.push(cred, b"three")
                got = await messages.receive()
                assert got.id == third.push_id
            # The same token again (a replay by someone who saw it): accepted, then settled as spent.
            token = b64e(bytes(16))
            async with httpx.AsyncClient() as c:
                st_ = await c.get(f"{url}/v1/devices/{device_id}/messages", headers={"authorization": "Bearer x"})
                problem(st_, 401, "bad_credentials")
                body = {"registration": b64e(_reg_bytes(cred)), "token": token, "ciphertext": b64e(b"x" * 48)}
                r = await c.post(url + "/v1/push", json=body)
                assert r.status_code == 202
                assert (await c.get(f"{url}/v1/push/{r.json()['push_id']}")).json()["status"] == "unknown_token"
                status = (await c.get(url + "/v1/status")).json()
                assert status["devices"] == 1 and status["node_id"] == "a" * 32
                metrics = parse_metrics((await c.get(url + "/metrics")).text)
                assert metrics["inri_pushes_accepted_total"] == 4
                assert metrics["inri_pushes_delivered_total"] == 3
                assert metrics['inri_custody_settled_total{status="unknown_token"}'] == 1
                doc = (await c.get(url + "/openapi.json")).json()
                assert doc["openapi"].startswith("3.1") and "/v1/push" in doc["paths"]
                assert (await c.get(url + "/healthz")).json()["status"] == "ok"
            await dev.unregister()
            assert service.store.mailbox_size() == 0 and not service.store.is_home(bytes.fromhex(device_id))


def _reg_bytes(cred) -> bytes:  # type: ignore[no-untyped-def]
    from inri.protocol.codec import encode_registration

    return encode_registration(cred.registration)


async def test_bad_input_gets_documented_errors_and_the_relay_stays_up(tmp_path: Path) -> None:
    cfg = RelayConfig()
    with trio.fail_after(30):
        async with relay(tmp_path, cfg) as (url, _):
            async with httpx.AsyncClient() as c:
                problem(await c.post(url + "/v1/push", content=b"{not json"), 400, "malformed_json")
                problem(await c.post(url + "/v1/push", json=[1, 2]), 422, "invalid_field")
                problem(await c.post(url + "/v1/push", json={"registration": 5}), 422, "invalid_field")
                problem(await c.post(url + "/v1/push", json={"registration": "!!"}), 422, "invalid_field")
                problem(await c.post(url + "/v1/push", json={"registration": b64e(b"\x93\x02\x02\x03")}), 400,
                        "bad_registration")
                problem(await c.post(url + "/v1/push", json={"registration": b64e(b"\x93\x01\x02\x03")}), 400,
                        "unsupported_version")  # a version 1 array, however short
                problem(await c.post(url + "/v1/push", content=b"x" * (1024 * 1024)), 413, "too_large")
                problem(await c.post(url + "/v1/devices", json={"registration": b64e(b"\xc1")}), 400,
                        "bad_registration")
                problem(await c.get(url + "/v1/push/zz"), 404, "not_found")
                problem(await c.get(url + "/v1/push/" + "00" * 16), 404, "not_found")
                problem(await c.get(url + "/v1/devices/" + "00" * 16 + "/messages"), 401, "bad_credentials")
                problem(await c.put(url + "/v1/push"), 405, "method_not_allowed")
                problem(await c.get(url + "/nope"), 404, "not_found")
                dev = DeviceClient(url)
                await dev.register(tokens=2)
                with pytest.raises(ApiError) as e:
                    await DeviceClient(url)._call("POST", "/v1/devices", json={
                        "registration": b64e(_reg_bytes(dev.export_credential(1))), "tokens": 999})
                assert e.value.code == "invalid_field"
                bad = await c.get(f"{url}/v1/devices/{dev.device_id}/messages?limit=0",
                                  headers={"authorization": f"Bearer {dev.secret}"})
                problem(bad, 422, "invalid_field")
                async with open_websocket_url(url.replace("http", "ws") + f"/v1/devices/{dev.device_id}/stream") as ws:
                    await ws.send_message(json.dumps({"auth": b64e(bytes(32))}))
                    with pytest.raises(Exception) as closed:
                        await ws.get_message()
                    assert getattr(closed.value, "reason", None) is not None and closed.value.reason.code == 4401
                assert (await c.get(url + "/healthz")).status_code == 200


async def test_rate_limit_answers_429_with_retry_after(tmp_path: Path) -> None:
    cfg = RelayConfig()
    cfg = replace(cfg, api=replace(cfg.api, rate_per_s=0.01, rate_burst=5, tarpit_s=0.3))
    with trio.fail_after(30):
        async with relay(tmp_path, cfg) as (url, _):
            async with httpx.AsyncClient() as c:
                codes = [(await c.get(url + "/v1/status")).status_code for _ in range(8)]
                assert codes[:5] == [200] * 5 and codes[5:] == [429] * 3
                t0 = trio.current_time()
                r = await c.get(url + "/v1/status")
                problem(r, 429, "rate_limited")
                assert trio.current_time() - t0 >= 0.3  # tarpitted: a hammering client slows down
                assert int(r.headers["retry-after"]) >= 1
                assert (await c.get(url + "/healthz")).status_code == 200  # health is never limited
                assert parse_metrics((await c.get(url + "/metrics")).text)['inri_rate_limited_total{key="client"}'] >= 4


async def test_an_overloaded_relay_answers_its_429_at_once_only_rate_limits_are_tarpitted(tmp_path: Path) -> None:
    """Backpressure (429 `overloaded`) asks a well-behaved app to slow down: it is answered at once
    with its Retry-After, not held like a rate-limited client's 429 (`tarpit_s`; before, every 429 was
    held, which put a 1 s p99 on a loaded entry relay's accept latency)."""
    cfg = RelayConfig()
    cfg = replace(cfg, api=replace(cfg.api, tarpit_s=5.0), engine=replace(cfg.engine, custody_max=0))
    with trio.fail_after(30):
        async with relay(tmp_path, cfg) as (url, _):
            dev = DeviceClient(url)
            await dev.register(tokens=3)
            cred = dev.export_credential(3)
            body = {"registration": b64e(encode_registration(cred.registration)), "token": b64e(cred.tokens[0]),
                    "ciphertext": b64e(seal(cred.seal_key, b"x"))}
            async with httpx.AsyncClient() as c:
                t0 = trio.current_time()
                r = await c.post(url + "/v1/push", json=body)
                problem(r, 429, "overloaded")
                assert int(r.headers["retry-after"]) >= 1
                assert trio.current_time() - t0 < 2.5  # not held for tarpit_s (5 s)


async def test_per_device_and_per_token_push_limits(tmp_path: Path) -> None:
    """One credential cannot flood a device at a relay, nor re-send one token without end; others unaffected."""
    cfg = RelayConfig()
    cfg = replace(cfg, api=replace(cfg.api, device_rate_per_s=0.01, device_rate_burst=4, token_rate_burst=2))
    with trio.fail_after(30):
        async with relay(tmp_path, cfg) as (url, service):
            flooded, other = DeviceClient(url), DeviceClient(url)
            await flooded.register(tokens=10)
            await other.register(tokens=2)
            cred, cred2 = flooded.export_credential(10), other.export_credential(2)
            async with HomeAppClient([url]) as app, httpx.AsyncClient() as c:
                for _ in range(4):
                    await app.push(cred, b"ok")
                with pytest.raises(ApiError) as e:
                    await app.push(cred, b"one too many")
                assert e.value.code == "rate_limited" and e.value.status == 429 and e.value.retry_after
                assert len(cred.tokens) == 6  # the refused push did not spend a token
                assert (await app.push(cred2, b"another device")).status == "pending"
                body = {"registration": b64e(_reg_bytes(cred2)), "token": b64e(cred2.tokens[0]),
                        "ciphertext": b64e(b"x" * 48)}
                codes = [(await c.post(url + "/v1/push", json=body)).status_code for _ in range(3)]
                assert codes == [202, 202, 429]  # the same token re-sent: a retry or two, then refused
                r = await c.post(url + "/v1/push", json=body)
                problem(r, 429, "rate_limited")
                assert "token" in r.json()["detail"] and int(r.headers["retry-after"]) >= 1
                metrics = parse_metrics((await c.get(url + "/metrics")).text)
            assert metrics['inri_rate_limited_total{key="device"}'] == 1
            assert metrics['inri_rate_limited_total{key="token"}'] == 2
            assert service.store.mailbox_size(bytes.fromhex(flooded.device_id or "")) == 4


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(["registration", "token", "ciphertext", "tokens", "ids", "count"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=40),
                                 st.binary(max_size=40).map(b64e), st.lists(st.text(max_size=5), max_size=3)),
                       max_size=4),
       st.sampled_from(["/v1/push", "/v1/devices"]))
def test_fuzzed_bodies_never_crash_the_api(tmp_path_factory: pytest.TempPathFactory, body: dict, path: str) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")

    async def main() -> None:
        async with relay(tmp) as (url, service):
            async with httpx.AsyncClient() as c:
                r = await c.post(url + path, json=body)
                assert r.status_code in (400, 409, 413, 422), r.text
                assert r.json()["code"] in ("malformed_json", "invalid_field", "bad_registration",
                                            "unsupported_version", "too_large")
                assert (await c.get(url + "/healthz")).status_code == 200
            assert service.store.device_count() == 0 and service.store.custody_count() == 0

    trio.run(main)


async def test_live_stream_keeps_up_with_concurrent_pushes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """45 pushes at 32 concurrent to one device with an open stream: every message is on the stream, none
    held back until the next ping by a lost wake-up. The ping is moved an hour away, so a message whose
    wake-up was lost stays off the stream for good and the test fails; nothing is asserted on how long
    delivery took (a loaded machine only makes it slower)."""
    monkeypatch.setattr(api, "WS_PING_S", 3600.0)
    n_push, concurrency = 45, 32
    with trio.fail_after(60):  # a guard against hanging, not a bound: a lost wake-up never delivers
        async with relay(tmp_path) as (url, _):
            dev = DeviceClient(url)
            await dev.register(tokens=n_push)
            cred = dev.export_credential(n_push)
            accepted: set[str] = set()
            arrived: set[str] = set()
            limiter = trio.CapacityLimiter(concurrency)
            async with HomeAppClient([url]) as app, dev.stream(ack=False) as messages:

                async def push_one(i: int) -> None:
                    async with limiter:
                        accepted.add((await app.push(cred, b"m%d" % i)).push_id)

                async def read_stream() -> None:
                    while len(arrived) < n_push:
                        arrived.add((await messages.receive()).id)

                with trio.move_on_after(30):  # a guard, as above
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(read_stream)
                        for i in range(n_push):
                            nursery.start_soon(push_one, i)
            pulled = {m.id for m in await dev.pull(limit=1000)}
    assert pulled == accepted and len(accepted) == n_push  # the pull has every message at once
    late = sorted(accepted - arrived)
    assert not late, f"{len(late)} of {n_push} messages not on the stream: a lost wake-up holds them until a ping"


DEVICE_ENDPOINTS = [("POST", "/registration", {"registration": "AA"}), ("POST", "/tokens", {"count": 1}),
                    ("DELETE", "", None), ("GET", "/messages", None), ("POST", "/ack", {"ids": []})]


async def test_device_endpoints_do_not_tell_where_a_device_is_homed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A route id homed here with a wrong or missing secret, and one homed elsewhere (every relay learns it
    from gossip), get the same 401 after the same work (one secret hash) on every device endpoint."""
    import inri.node.api
    import inri.node.store

    hashes = 0
    real_hash = inri.node.store.secret_hash

    def counting_hash(secret: bytes) -> bytes:
        nonlocal hashes
        hashes += 1
        return real_hash(secret)

    monkeypatch.setattr(inri.node.store, "secret_hash", counting_hash)
    monkeypatch.setattr(inri.node.api, "secret_hash", counting_hash)
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, _):
            dev = DeviceClient(url)
            homed = await dev.register(tokens=1)
            elsewhere = "5b" * 16  # a well-formed route id this relay does not home
            wrong = {"authorization": "Bearer " + b64e(bytes(32))}
            async with httpx.AsyncClient() as c:
                for method, suffix, body in DEVICE_ENDPOINTS:
                    answers = []
                    for device_id, headers in ((homed, wrong), (elsewhere, wrong), (homed, {}), (elsewhere, {})):
                        hashes = 0
                        r = await c.request(method, f"{url}/v1/devices/{device_id}{suffix}", json=body,
                                            headers=headers)
                        problem(r, 401, "bad_credentials")
                        answers.append((r.json()["detail"], r.json()["title"], hashes))
                    assert len(set(answers)) == 1 and answers[0][2] == 1, (method, suffix, answers)
                for device_id in (homed, elsewhere):
                    ws_url = url.replace("http", "ws") + f"/v1/devices/{device_id}/stream"
                    async with open_websocket_url(ws_url, extra_headers=[(b"authorization", wrong["authorization"]
                                                                           .encode())]) as ws:
                        with pytest.raises(Exception) as closed:
                            await ws.get_message()
                        assert closed.value.reason.code == 4401  # type: ignore[attr-defined]
            assert (await dev.pull()) == []  # the right secret still works


async def test_wrong_method_gets_405_with_allow_and_stream_over_http_426(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, _):
            async with httpx.AsyncClient() as c:
                r = await c.put(url + "/v1/push")
                problem(r, 405, "method_not_allowed")
                assert r.headers["allow"] == "POST"
                r = await c.post(f"{url}/v1/devices/{'00' * 16}")
                problem(r, 405, "method_not_allowed")
                assert r.headers["allow"] == "DELETE"
                r = await c.get(f"{url}/v1/devices/{'00' * 16}/stream")
                problem(r, 426, "upgrade_required")


async def test_ack_of_the_documented_maximum_fits_the_body_limit(tmp_path: Path) -> None:
    """500 ids (docs/api.md) are ~17.5 KB of JSON, more than the general 16 KiB body limit."""
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, service):
            dev = DeviceClient(url)
            device_id = await dev.register(tokens=2)
            cred = dev.export_credential(2)
            async with HomeAppClient([url]) as app:
                first = await app.push(cred, b"one")
            auth = {"authorization": f"Bearer {dev.secret}", "content-type": "application/json"}
            ids = [first.push_id] + [f"{i:032x}" for i in range(500 - 1)]
            body = json.dumps({"ids": ids}).encode()  # Python's default separators: 36 bytes per id
            assert len(body) > 16 * 1024
            async with httpx.AsyncClient() as c:
                r = await c.post(f"{url}/v1/devices/{device_id}/ack", content=body, headers=auth)
                assert r.status_code == 200 and r.json() == {"deleted": 1}, r.text
                from inri.node.api import ACK_MAX_BODY_BYTES

                too_many = json.dumps({"ids": ids + ["00" * 16]})
                problem(await c.post(f"{url}/v1/devices/{device_id}/ack", content=too_many, headers=auth), 422,
                        "invalid_field")
                padded = b'{"ids": []' + b" " * (ACK_MAX_BODY_BYTES - 11) + b"}"
                assert len(padded) == ACK_MAX_BODY_BYTES
                r = await c.post(f"{url}/v1/devices/{device_id}/ack", content=padded, headers=auth)
                assert r.status_code == 200, r.text
                problem(await c.post(f"{url}/v1/devices/{device_id}/ack", content=padded + b" ", headers=auth),
                        413, "too_large")
            assert service.store.mailbox_size() == 0


async def test_openapi_lists_the_routes_and_limits_the_router_enforces(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, _):
            async with httpx.AsyncClient() as c:
                doc = (await c.get(url + "/openapi.json")).json()
    app = create_app(RelayService("b" * 32, RelayConfig().engine, Store(tmp_path / "x.sqlite3"), NullNetwork(),
                                  TraceFile(tmp_path / "t", "b" * 32)))
    documented = {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops}
    routed = {(r.method, r.template) for r in app.router.routes}
    assert documented == routed
    for route in app.router.routes:
        op = doc["paths"][route.template][route.method.lower()]
        if route.max_body:
            assert op["requestBody"]["x-max-body-bytes"] == route.max_body, route
            json_body = "application/json" in op["requestBody"]["content"]  # Web Push bodies are binary: no 422
            assert {"400", "413"} | ({"422"} if json_body else set()) <= set(op["responses"]), route
        else:
            assert "requestBody" not in op, route
        if route.template.startswith("/v1/devices/{device_id}") and not route.template.endswith("/stream"):
            assert "401" in op["responses"] and "404" not in op["responses"], route  # never "not homed here"
    limit = next(p for p in doc["paths"]["/v1/devices/{device_id}/messages"]["get"]["parameters"]
                 if p["name"] == "limit")
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 1000)
    assert doc["paths"]["/v1/devices/{device_id}/messages"]["get"]["responses"]["422"]


def test_documented_push_statuses_are_the_ones_the_relay_produces() -> None:
    """`duplicate` was documented and never produced: a home relay that already stored a push answers
    DUPLICATE and the custodian settles it as `delivered` (inri/core/engine.py, receipt statuses)."""
    import re as re_

    from inri.node.openapi import openapi_document
    from tests.procs import ROOT

    produced = {"pending", "delivered", "spent", "unknown_token", "mailbox_full", "expired", "unreachable",
                "unknown_endpoint", "gone", "rate_limited",  # these three: Web Push pushes
                "unknown_registration"}  # rule F5c (tests/test_registration_api.py produces it)
    enum = openapi_document("0", {k: 1 for k in ("POST /v1/devices", "POST /v1/devices/{device_id}/registration",
                                                 "POST /v1/devices/{device_id}/tokens", "POST /v1/push",
                                                 "POST /v1/push/batch",
                                                 "POST /v1/devices/{device_id}/ack",
                                                 "POST /v1/devices/{device_id}/endpoints",
                                                 "PUT /v1/devices/{device_id}/wake",
                                                 "POST /wp/v1/{reg}/{endpoint}",
                                                 "POST /_matrix/push/v1/notify")})[
        "paths"]["/v1/push/{push_id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"][
        "properties"]["status"]["enum"]
    assert set(enum) == produced
    api_md = (ROOT / "docs" / "api.md").read_text()
    table = api_md.split("### Push status")[1].split("## Push credentials")[0]
    assert set(re_.findall(r"^\| `(\w+)` \|", table, re_.M)) == produced


def test_no_file_cites_a_guide_that_is_not_in_the_repository() -> None:
    from tests.procs import ROOT

    if (ROOT / "GUIDE.md").exists():
        return
    cited = [str(p.relative_to(ROOT)) for d in ("inri", "bootstrap_nodes", "simulations", "docs", "benchmarks")
             for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md", ".toml") and "GUIDE.md" in p.read_text()]
    assert cited == []


async def test_metrics_scrape_parses_with_prometheus_client_and_keeps_sources_apart(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with trio.fail_after(30):
        async with relay(tmp_path) as (url, service):
            # One key counted by both the engine (deadline sweep) and the service (settled statuses), and a
            # label value that needs escaping.
            service.engine.counters["custody_expired"] = service.engine.counters.get("custody_expired", 0) + 3
            service.counters["custody_expired"] = 2
            service.engine.counters['push_dropped_we"ird\\reason'] = 1
            async with httpx.AsyncClient() as c:
                r = await c.get(url + "/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(r.text) for s in fam.samples}
    assert samples[("inri_custody_settled_total", (("status", "expired"),))] == 2
    assert samples[("inri_engine_events_total", (("event", "custody_expired"),))] == 3
    assert samples[("inri_pushes_dropped_total", (("reason", 'we"ird\\reason'),))] == 1
    for name in ("inri_pushes_accepted_total", "inri_routes_cached", "inri_websockets_open",
                 "inri_push_accept_seconds_count", "inri_gossip_duplicates_total"):
        assert any(n == name for n, _ in samples), name


async def test_what_the_front_refuses_has_the_documented_empty_answers(tmp_path: Path) -> None:
    """docs/api.md, Errors: HTTP the server cannot parse never reaches the API: 400/501 with empty bodies."""
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, _):
            host, port = url.removeprefix("http://").rsplit(":", 1)
            for raw, status in ((b"GARBAGE\r\n\r\n", b"400"),
                                (b"POST /v1/push HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", b"501")):
                stream = await trio.open_tcp_stream(host, int(port))
                await stream.send_all(raw)
                answer = b""
                while b"\r\n\r\n" not in answer:
                    answer += await stream.receive_some(4096)
                await stream.aclose()
                head = answer.split(b"\r\n\r\n")[0].lower()
                assert head.startswith(b"http/1.1 " + status) and b"content-length: 0" in head, answer


async def test_push_answer_is_the_documented_json_and_any_json_encoding_of_the_body_is_read(tmp_path: Path) -> None:
    """POST /v1/push: the 202 body is exactly {"push_id","status"} as compact JSON (formatted without
    the encoder); a UTF-8 body (read without encoding detection), a UTF-16 one and one with a UTF-8 BOM
    are all read as JSON, as json.loads reads bytes; strict base64url fields still give 422."""
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, _):
            dev = DeviceClient(url)
            await dev.register(tokens=4)
            cred = dev.export_credential(4)
            reg = b64e(_reg_bytes(cred))
            bodies = [json.dumps({"registration": reg, "token": b64e(t), "ciphertext": b64e(b"c" * 40)})
                      for t in cred.tokens]
            async with httpx.AsyncClient() as c:
                for raw in (bodies[0].encode(), bodies[1].encode("utf-16"), b"\xef\xbb\xbf" + bodies[2].encode()):
                    r = await c.post(url + "/v1/push", content=raw)
                    assert r.status_code == 202, r.text
                    assert r.headers["content-type"] == "application/json"
                    pid = r.json()["push_id"]
                    expected = json.dumps({"push_id": pid, "status": "pending"}, separators=(",", ":")).encode()
                    assert r.content == expected
                    assert r.headers["content-length"] == str(len(r.content)) and len(bytes.fromhex(pid)) == 16
                for token in ("ab+" + "A" * 19, "A" * 21 + " ", "A" * 20 + "=A", "A" * 21 + "\u00e9"):
                    problem(await c.post(url + "/v1/push", content=bodies[3].replace(b64e(cred.tokens[3]), token)),
                            422, "invalid_field")
                problem(await c.post(url + "/v1/push", content=b"{\x00"), 400, "malformed_json")


async def test_the_fronts_push_shortcut_answers_exactly_as_the_asgi_path(tmp_path: Path) -> None:
    """POST /v1/push goes through RelayApi.fast_post (no ASGI scope, router or Request); the same request
    with a query string goes through __call__. Every answer (status, problem code, content type,
    Retry-After) is the same on both, and both spend the client's rate limit."""
    cfg = RelayConfig()
    cfg = replace(cfg, api=replace(cfg.api, rate_per_s=0.01, rate_burst=14, tarpit_s=0.0))
    with trio.fail_after(30):
        async with relay(tmp_path, cfg) as (url, _):
            dev = DeviceClient(url)
            await dev.register(tokens=4)
            cred = dev.export_credential(4)
            reg = b64e(encode_registration(cred.registration))
            ct = b64e(seal(cred.seal_key, b"x"))
            cases = [
                json.dumps({"registration": reg, "token": b64e(cred.tokens[0]), "ciphertext": ct}).encode(),
                b"{not json",
                b"[1, 2]",
                json.dumps({"registration": reg, "token": "AAAA", "ciphertext": ct}).encode(),
                json.dumps({"registration": "x" * 40, "token": b64e(cred.tokens[1]), "ciphertext": ct}).encode(),
                json.dumps({"registration": reg, "token": b64e(cred.tokens[1]), "ciphertext": "y" * 20000}).encode(),
            ]

            def answer(r: httpx.Response) -> tuple[int, str, str | None, str | None]:
                code = r.json().get("code") if r.status_code >= 400 else r.json().get("status")
                return r.status_code, r.headers["content-type"], code, r.headers.get("retry-after")

            async with httpx.AsyncClient() as c:
                for body in cases:
                    fast = await c.post(url + "/v1/push", content=body, headers={"content-type": "application/json"})
                    slow = await c.post(url + "/v1/push?via=asgi", content=body,
                                        headers={"content-type": "application/json"})
                    assert answer(fast) == answer(slow), body[:60]  # 202 twice: a token re-sent is a retry
                # 1 registration + 12 pushes spent 13 of the 14-token burst: the next two requests
                # are one allowed and one refused, whichever path they take.
                last = [await c.post(url + p, content=cases[1], headers={"content-type": "application/json"})
                        for p in ("/v1/push", "/v1/push?via=asgi")]
                assert [r.status_code for r in last] == [400, 429]
                assert answer(await c.post(url + "/v1/push", content=cases[1])) == answer(last[1])
