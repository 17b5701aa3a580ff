"""POST /v1/push/batch (issue 16): many pushes in one request, each checked, limited and accepted as
POST /v1/push would be, with one result per push; through real HTTP on loopback."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
import trio

from inri.client import DeviceClient
from inri.client.credential import b64e, seal
from inri.node.api import PUSH_BATCH_MAX
from inri.node.config import RelayConfig
from inri.node.metrics import parse_metrics
from tests.test_node_api import _reg_bytes, problem, relay


def _item(cred, token: bytes, text: bytes) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"registration": b64e(_reg_bytes(cred)), "token": b64e(token),
            "ciphertext": b64e(seal(cred.seal_key, text))}


async def test_batch_answers_each_push_as_the_single_endpoint_would(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, service):
            dev = DeviceClient(url)
            await dev.register(tokens=5)
            cred = dev.export_credential(5)
            good = [_item(cred, t, b"m%d" % i) for i, t in enumerate(cred.tokens[:3])]
            bad_token = {**good[0], "token": b64e(b"xyz")}
            bad_reg = {**good[0], "registration": b64e(b"\x93\x02\x02\x03")}
            items = [good[0], bad_token, "not an object", good[1], bad_reg, good[2]]
            async with httpx.AsyncClient() as c:
                r = await c.post(url + "/v1/push/batch", json={"pushes": items})
                assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
                body = r.json()
                results = body["results"]
                assert [x["status"] for x in results] == [202, 422, 422, 202, 400, 202]
                assert body["accepted"] == 3
                assert [x.get("code") for x in results] == [None, "invalid_field", "invalid_field", None,
                                                            "bad_registration", None]
                assert results[1]["type"].endswith("invalid_field") and results[1]["instance"] == "/v1/push/batch#1"
                ids = [x["push_id"] for x in results if x["status"] == 202]
                assert all(x["push_status"] == "pending" for x in results if x["status"] == 202)
                # Each accepted push is a push like any other: its status, and the device's mailbox.
                for pid in ids:
                    assert (await c.get(f"{url}/v1/push/{pid}")).json()["status"] == "delivered"
                metrics = parse_metrics((await c.get(url + "/metrics")).text)
            assert metrics["inri_pushes_accepted_total"] == 3
            got = await dev.pull()
            assert sorted(m.plaintext for m in got) == [b"m0", b"m1", b"m2"]
            assert sorted(m.id for m in got) == sorted(ids)
            assert service.store.unspent_tokens(bytes.fromhex(dev.device_id or "")) == 2


async def test_batch_level_errors_are_problems(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, _):
            async with httpx.AsyncClient() as c:
                post = url + "/v1/push/batch"
                problem(await c.post(post, content=b"{nope", headers={"content-type": "application/json"}),
                        400, "malformed_json")
                problem(await c.post(post, json=[]), 422, "invalid_field")
                problem(await c.post(post, json={"pushes": {}}), 422, "invalid_field")
                problem(await c.post(post, json={"pushes": []}), 422, "invalid_field")
                problem(await c.post(post, json={"pushes": [{}] * (PUSH_BATCH_MAX + 1)}), 422, "invalid_field")
                big = b'{"pushes": ["' + b"x" * (100 * 16 * 1024) + b'"]}'
                problem(await c.post(post, content=big, headers={"content-type": "application/json"}),
                        413, "too_large")
                problem(await c.get(post), 404, "not_found")  # GET /v1/push/{push_id}: no push called "batch"


async def test_each_push_of_a_batch_takes_a_client_token(tmp_path: Path) -> None:
    """A batch is limited like the same pushes sent one by one: refused pushes get 429 and spend nothing."""
    cfg = RelayConfig()
    cfg = replace(cfg, api=replace(cfg.api, rate_per_s=0.01, rate_burst=5, tarpit_s=0.0))
    with trio.fail_after(30):
        async with relay(tmp_path, cfg) as (url, service):
            dev = DeviceClient(url)
            await dev.register(tokens=8)  # one client token
            cred = dev.export_credential(8)
            items = [_item(cred, t, b"x") for t in cred.tokens]
            async with httpx.AsyncClient() as c:
                r = await c.post(url + "/v1/push/batch", json={"pushes": items})  # 4 tokens left: the request + 3
                results = r.json()["results"]
                assert [x["status"] for x in results] == [202] * 4 + [429] * 4, results
                assert all(x["code"] == "rate_limited" and x["retry_after"] >= 1 for x in results[4:])
                problem(await c.post(url + "/v1/push/batch", json={"pushes": items}), 429, "rate_limited")
            assert service.store.unspent_tokens(bytes.fromhex(dev.device_id or "")) == 4
