"""Docs of protocol v2 (issue 43 item 3, docs/api.md): every error a registration and its receipt secret get,
with its status and code, and what a receipt key rotation does to outstanding credentials and tokens,
through a relay's HTTP API. Registrations are written by hand from docs/api.md's wire form."""

from __future__ import annotations

import base64
import hashlib
import struct
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
from nacl.signing import SigningKey

from tests.inproc import relay_api


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def v2(route: SigningKey, epoch: int, receipt: SigningKey | None, *, issued_at: int | None = None) -> bytes:
    """docs/api.md, "The registration's wire form"."""
    issued = int(time.time()) if issued_at is None else issued_at
    rk = bytes(route.verify_key)
    key = None if receipt is None else bytes(receipt.verify_key)
    signed = (b"inri/registration/v2\x00" + rk + struct.pack(">IQI", epoch, issued, 3600)
              + (b"\x00" if key is None else b"\x01" + key))
    return msgpack.packb([2, rk, epoch, issued, 3600, route.sign(signed).signature, key], use_bin_type=True)


def v1(route: SigningKey, epoch: int) -> bytes:
    """The version 1 form (5 fields, no receipt key) a client written from the old identity model sends."""
    rk = bytes(route.verify_key)
    issued = int(time.time())
    sig = route.sign(b"inri/registration/v1\x00" + rk + struct.pack(">IQI", epoch, issued, 3600)).signature
    return msgpack.packb([1, rk, epoch, issued, 3600, sig], use_bin_type=True)


def problem(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status and r.headers["content-type"] == "application/problem+json", r.text
    assert r.json()["code"] == code, r.text


async def test_another_versions_registration_gets_unsupported_version(tmp_path: Path) -> None:
    route, receipt = SigningKey.generate(), SigningKey.generate()
    v3 = msgpack.unpackb(v2(route, 1, receipt))
    v3[0] = 3
    async with relay_api(tmp_path) as url, httpx.AsyncClient(timeout=5) as c:
        for reg in (v1(route, 1), msgpack.packb(v3, use_bin_type=True)):
            problem(await c.post(url + "/v1/devices", json={"registration": b64(reg)}), 400, "unsupported_version")
            problem(await c.post(url + "/v1/push", json={"registration": b64(reg), "token": b64(bytes(16)),
                                                          "ciphertext": b64(b"x")}), 400, "unsupported_version")
        bad = msgpack.unpackb(v2(route, 1, receipt))
        bad[5] = bytes(64)  # version 2, but its signature does not verify
        body = {"registration": b64(msgpack.packb(bad, use_bin_type=True)), "receipt_secret": b64(bytes(receipt))}
        problem(await c.post(url + "/v1/devices", json=body), 400, "bad_registration")


async def test_every_receipt_secret_error_has_its_documented_status_and_code(tmp_path: Path) -> None:
    route, receipt, other = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    reg = b64(v2(route, 1, receipt))
    async with relay_api(tmp_path) as url, httpx.AsyncClient(timeout=5) as c:
        for secret, status, code in ((5, 422, "invalid_field"), ("!!", 422, "invalid_field"),
                                     (b64(bytes(31)), 422, "invalid_field"), (None, 400, "bad_receipt_key"),
                                     (b64(bytes(other)), 400, "bad_receipt_key")):
            body: dict[str, Any] = {"registration": reg} | ({} if secret is None else {"receipt_secret": secret})
            problem(await c.post(url + "/v1/devices", json=body), status, code)
        keyless = b64(v2(SigningKey.generate(), 1, None))
        problem(await c.post(url + "/v1/devices", json={"registration": keyless, "receipt_secret": b64(bytes(other))}),
                400, "bad_receipt_key")
        r = await c.post(url + "/v1/devices", json={"registration": reg, "receipt_secret": b64(bytes(receipt))})
        assert r.status_code == 201, r.text
        dev = r.json()
        path = f"{url}/v1/devices/{dev['device_id']}/registration"
        auth = {"authorization": f"Bearer {dev['device_secret']}"}
        new = b64(v2(route, 2, other))
        for body, status, code in (({"registration": new}, 400, "bad_receipt_key"),
                                   ({"registration": new, "receipt_secret": b64(bytes(receipt))}, 400,
                                    "bad_receipt_key"),
                                   ({"registration": new, "receipt_secret": b64(bytes(33))}, 422, "invalid_field"),
                                   ({"registration": reg, "receipt_secret": b64(bytes(receipt))}, 400, "not_newer"),
                                   ({"registration": b64(v1(route, 2))}, 400, "unsupported_version")):
            problem(await c.post(path, headers=auth, json=body), status, code)
        # The same receipt key again needs no secret; a new one with its own secret rotates it.
        r = await c.post(path, headers=auth, json={"registration": b64(v2(route, 2, receipt))})
        assert r.status_code == 200 and r.json()["epoch"] == 2, r.text
        r = await c.post(path, headers=auth, json={"registration": b64(v2(route, 3, other)),
                                                   "receipt_secret": b64(bytes(other))})
        assert r.status_code == 200 and r.json()["epoch"] == 3, r.text


async def test_a_rotation_leaves_outstanding_credentials_and_tokens_working(tmp_path: Path) -> None:
    """docs/api.md, "Refresh": tokens stay valid until spent, pushes made with the credential from before
    the rotation are delivered (and answered under its own key), and a registration the device signed but
    never registered settles `unknown_registration` (at once here: this relay is the home)."""
    route, k1, k2 = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    reg1 = v2(route, 1, k1)
    device_id = hashlib.blake2b(bytes(route.verify_key), digest_size=16).hexdigest()
    async with relay_api(tmp_path) as url, httpx.AsyncClient(timeout=5) as c:
        r = await c.post(url + "/v1/devices", json={"registration": b64(reg1), "tokens": 3,
                                                     "receipt_secret": b64(bytes(k1))})
        assert r.status_code == 201 and r.json()["device_id"] == device_id, r.text
        tokens = r.json()["tokens"]
        auth = {"authorization": f"Bearer {r.json()['device_secret']}"}
        reg2 = v2(route, 2, k2)
        r = await c.post(f"{url}/v1/devices/{device_id}/registration", headers=auth,
                         json={"registration": b64(reg2), "receipt_secret": b64(bytes(k2))})
        assert r.status_code == 200, r.text
        ghost = v2(route, 3, SigningKey.generate())
        got = []
        for reg, token in ((reg1, tokens[0]), (reg2, tokens[1]), (ghost, tokens[2]), (reg2, tokens[2])):
            r = await c.post(url + "/v1/push", json={"registration": b64(reg), "token": token, "ciphertext": b64(b"m")})
            assert r.status_code == 202, r.text
            got.append((await c.get(f"{url}/v1/push/{r.json()['push_id']}")).json()["status"])
        # The ghost spent nothing: the token it carried delivers the next push.
        assert got == ["delivered", "delivered", "unknown_registration", "delivered"], got
