"""Web Push through real relay processes (a bootstrap and 5 relays, `inri mesh up`): unmodified pywebpush
senders at the relay farthest from the device's home, RFC 8030 semantics, and the negative cases the entry
relay decides alone (checked on its frames counter: no mesh traffic)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import http_ece
import httpx
import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid02
from pywebpush import WebPusher, webpush, webpush_async

from inri import mesh
from inri.client import DeviceClient, Message, WebPushEndpoint
from inri.node.metrics import parse_metrics
from tests.test_relay_mesh import distances, graph, relay, wait_route

pytestmark = pytest.mark.integration
N = 5
# What no relay but the home relay may ever hold (filled by the tests, checked by the privacy scan last).
SECRETS: list[bytes] = []


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Subscriber:
    """What a browser or UnifiedPush connector keeps: its RFC 8291 key pair and auth secret."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.auth = os.urandom(16)
        self.p256dh = self.key.public_key().public_bytes(serialization.Encoding.X962,
                                                         serialization.PublicFormat.UncompressedPoint)

    def info(self, url: str) -> dict[str, Any]:
        return {"endpoint": url, "keys": {"p256dh": b64(self.p256dh), "auth": b64(self.auth)}}

    def decrypt(self, m: Message) -> bytes:
        if m.encoding == "aesgcm":  # re-framed by the entry relay: headers, then the body
            head, body = m.body.split(b"\n", 3)[:3], m.body.split(b"\n", 3)[3]
            salt = head[1].decode().partition("salt=")[2]
            dh = head[2].decode().partition("dh=")[2]
            return bytes(http_ece.decrypt(body, salt=unb64(salt), dh=unb64(dh), private_key=self.key,
                                          auth_secret=self.auth, version="aesgcm"))
        return bytes(http_ece.decrypt(m.body, private_key=self.key, auth_secret=self.auth, version="aes128gcm"))


class Sender:
    """An application server's VAPID key (py-vapid), and raw requests for the negative cases."""

    def __init__(self) -> None:
        self.vapid = Vapid02()
        self.vapid.generate_keys()
        self.public = b64(self.vapid.public_key.public_bytes(serialization.Encoding.X962,
                                                             serialization.PublicFormat.UncompressedPoint))
        self.pem = self.vapid.private_pem().decode()

    def auth(self, aud: str, exp: int | None = None) -> str:
        claims = {"aud": aud, "sub": "mailto:ops@example.org", "exp": exp or int(time.time()) + 12 * 3600}
        return str(self.vapid.sign(claims)["Authorization"])


def origin(url: str) -> str:
    return "/".join(url.split("/")[:3])


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("wpmesh")
    info = mesh.up(d, relays=N, bootstraps=1, timeout_s=90, min_neighbours=2)
    try:
        g = graph(info)
        dist = distances(g, "R1")
        assert len(dist) == N, f"mesh not connected: {g}"
        far = max(sorted(dist), key=lambda n: dist[n])
        second = next(n for n in sorted(dist) if n not in ("R1", far))
        info.update(far=relay(info, far)["api"], second=relay(info, second)["api"], home=relay(info, "R1")["api"])
        yield info
    finally:
        mesh.down(d)


@pytest.fixture(scope="module")
def device(lab: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> DeviceClient:
    async def go() -> DeviceClient:
        dev = DeviceClient(lab["home"], state_path=tmp_path_factory.mktemp("dev") / "dev.json")
        await dev.register(tokens=1)
        await wait_route(lab["far"])
        await wait_route(lab["second"])
        return dev
    return trio.run(go)


def at(endpoint: WebPushEndpoint, api: str) -> str:
    """The same endpoint entered at another relay: only the origin changes (R and E are the capability)."""
    return api + endpoint.url[len(origin(endpoint.url)):]


async def receive_one(dev: DeviceClient, send: Any) -> Message:
    """Open the device's stream, run send() in a thread (the standard senders block), return the message."""
    with trio.fail_after(20):
        async with dev.stream(ack=False) as messages:
            # The SDK's stream connects in the background: a TTL 0 push is stored only once the home
            # relay has the stream open, so wait for it (the device is the only one streaming there).
            async with httpx.AsyncClient(timeout=5) as c:
                while (await c.get(dev.relay_url + "/v1/status")).json()["websockets"] < 1:
                    await trio.sleep(0.02)
            await trio.to_thread.run_sync(send)
            msg = await messages.receive()
        await dev.ack([msg.id])
        return msg


def frames_out(api: str) -> float:
    """Push frames this relay sent (keepalives and gossip go on regardless)."""
    m = parse_metrics(httpx.get(api + "/metrics", timeout=5).text)
    assert any(k.startswith("inri_frames_out") for k in m), sorted(m)[:20]
    return sum(v for k, v in m.items() if k.startswith("inri_frames_out") and 'type="push"' in k)


async def test_pywebpush_sync_async_and_aesgcm_from_the_farthest_relay(lab: dict[str, Any],
                                                                       device: DeviceClient) -> None:
    sub, sender = Subscriber(), Sender()
    ep = await device.mint_endpoint()
    url = at(ep, lab["far"])
    info = sub.info(url)
    claims = {"sub": "mailto:ops@example.org"}
    e_part = url.rsplit("/", 1)[1]
    SECRETS.extend([e_part.encode(), unb64(e_part)[25:41], unb64(sender.public), sender.public.encode(),
                    sender.public.encode()[:40], b"hello from pywebpush", b"hello async", b"mastodon style"])
    answers: list[Any] = []

    def sync() -> None:
        SECRETS.append(sender.auth(origin(url)).split("t=")[1].split(".")[1].encode()[:40])  # JWT claims part
        answers.append(webpush(info, "hello from pywebpush", vapid_private_key=sender.vapid,
                               vapid_claims=dict(claims), ttl=300))

    got = await receive_one(device, sync)
    r = answers[-1]
    assert r.status_code == 201 and r.headers["ttl"] == "300" and "/v1/push/" in r.headers["location"]
    assert got.kind == "webpush" and got.endpoint_id == ep.endpoint_id and got.encoding == "aes128gcm"
    assert sub.decrypt(got) == b"hello from pywebpush"

    def asynchronous() -> None:
        async def go() -> None:
            answers.append(await webpush_async(info, "hello async", vapid_private_key=sender.vapid,
                                               vapid_claims=dict(claims), ttl=60))
        asyncio.run(go())

    got = await receive_one(device, asynchronous)
    assert answers[-1].status == 201 and sub.decrypt(got) == b"hello async"

    def aesgcm() -> None:
        answers.append(webpush(info, "mastodon style", vapid_private_key=sender.vapid, vapid_claims=dict(claims),
                               ttl=60, content_encoding="aesgcm"))

    got = await receive_one(device, aesgcm)
    assert answers[-1].status_code == 201 and got.encoding == "aesgcm" and sub.decrypt(got) == b"mastodon style"

    def second() -> None:
        answers.append(webpush(sub.info(at(ep, lab["second"])), "via a second relay", ttl=60))

    got = await receive_one(device, second)
    assert answers[-1].status_code == 201 and sub.decrypt(got) == b"via a second relay"


async def test_topic_and_ttl_zero(lab: dict[str, Any], device: DeviceClient) -> None:
    sub = Subscriber()
    ep = await device.mint_endpoint()
    info = sub.info(at(ep, lab["far"]))

    def offline() -> list[str]:
        answers = [webpush(info, text, ttl=600, headers={"Topic": "inbox"}) for text in ("first", "second")]
        answers.append(webpush(info, "gone with ttl 0", ttl=0))
        assert [r.status_code for r in answers] == [201] * 3  # TTL 0: accepted, and dropped (RFC 8030)
        return [r.headers["location"].rsplit("/", 1)[1] for r in answers]

    pids = await trio.to_thread.run_sync(offline)
    # Each push's custody at the far relay ends with the home's receipt: once all three are settled, the
    # home has handled every one of them, and its mailbox is what it will stay (a late copy would be a bug).
    async with httpx.AsyncClient(timeout=5) as c:
        with trio.fail_after(30):
            for pid in pids:
                while (status := (await c.get(f"{lab['far']}/v1/push/{pid}")).json())["status"] == "pending":
                    await trio.sleep(0.05)
    # Issue 41, item 7: the dropped push's status says what happened to it (the home's signed receipt:
    # expired), never `delivered`; hops tell it from a push that got no receipt at all.
    assert status["status"] == "expired" and status["hops"] is not None, status
    mine = [m for m in await device.pull() if m.endpoint_id == ep.endpoint_id]
    assert [sub.decrypt(m) for m in mine] == [b"second"] and mine[0].topic == "inbox"
    await device.ack([m.id for m in mine])
    got = await receive_one(device, lambda: webpush(info, "ttl 0 while connected", ttl=0))
    assert sub.decrypt(got) == b"ttl 0 while connected"


async def test_negative_cases_answer_their_codes(lab: dict[str, Any], device: DeviceClient) -> None:
    far = lab["far"]
    sub, sender, other = Subscriber(), Sender(), Sender()
    plain = await device.mint_endpoint()
    bound = await device.mint_endpoint(sender.public)
    url, burl = at(plain, far), at(bound, far)
    aud = origin(url)
    body = WebPusher(sub.info(url)).encode(b"x" * 20, "aes128gcm")["body"]
    good = {"TTL": "60", "Content-Encoding": "aes128gcm"}

    async def post(u: str, headers: dict[str, str], data: bytes = body) -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as c:
            return await c.post(u, headers=headers, content=data)

    jwt = sender.auth(aud)
    t, _, k = jwt.partition(" ")[2].partition(",k=")
    bad_sig = f"vapid {t[:-4]}AAAA,k={k}"
    before = frames_out(far)
    local = [
        (401, burl, {**good, "Authorization": bad_sig}),
        (401, burl, {**good, "Authorization": sender.auth("http://other.example:8480")}),
        (401, burl, {**good, "Authorization": sender.auth(aud, int(time.time()) - 10)}),
        (401, burl, {**good, "Authorization": sender.auth(aud, int(time.time()) + 48 * 3600)}),
        (403, burl, {**good, "Authorization": other.auth(aud)}),
        (401, burl, good),
        (400, url, {"Content-Encoding": "aes128gcm"}),  # no TTL
        (400, url, {**good, "Topic": "t" * 33}),
        (400, url, {**good, "Urgency": "urgent"}),
        (404, url.rsplit("/", 2)[0] + "/AAAA/" + url.rsplit("/", 1)[1], good),  # broken registration
    ]
    for status, u, h in local:
        r = await post(u, h)
        assert r.status_code == status, (status, h, r.text)
        if status == 401:
            assert r.headers["www-authenticate"] == "vapid"
    r = await post(url, good, os.urandom(4097))
    assert r.status_code == 413
    two = http_ece.encrypt(b"y" * 200, private_key=ec.generate_private_key(ec.SECP256R1()), dh=sub.p256dh,
                           auth_secret=sub.auth, version="aes128gcm", rs=100)  # three records in 300 bytes
    assert (await post(url, good, two)).status_code == 400
    short = body[:20]  # shorter than the 21-byte header (salt | rs | idlen)
    bad_rs = body[:16] + (17).to_bytes(4, "big") + body[20:]  # RFC 8188: rs below 18 is invalid
    no_key = body[:20] + bytes([255]) + body[21:40]  # idlen points past the end of the body
    for broken in (short, bad_rs, no_key):
        r = await post(url, good, broken)
        assert r.status_code == 400 and r.json()["code"] == "bad_encoding", r.text
    assert (await post(url, {"TTL": "60"})).status_code == 400  # a body without Content-Encoding
    assert frames_out(far) == before, "the entry relay decided all of these alone: no frame may leave it"
    # A forged capability: the home relay says unknown endpoint; the genuine endpoint still works after.
    raw_e = bytearray(unb64(url.rsplit("/", 1)[1]))
    raw_e[30] ^= 1  # inside the capability: endpoint id(16) | flags(1) | VAPID prefix(8) | cap(16) | seal key
    forged = url.rsplit("/", 1)[0] + "/" + b64(bytes(raw_e))
    r = await post(forged, good)
    assert r.status_code == 404
    assert (await post(url, good)).status_code == 201
    # Revoked: 410; an unregistered device: 410.
    gone = await device.mint_endpoint()
    await device.revoke_endpoint(gone.endpoint_id)
    assert (await post(at(gone, far), good)).status_code == 410
    dev2 = DeviceClient(lab["home"])
    await dev2.register(tokens=1)
    ep2 = await dev2.mint_endpoint()
    await dev2.unregister()
    assert (await post(at(ep2, far), good)).status_code == 410
    # A burst over one endpoint's limit: 429 with Retry-After, while another endpoint still gets 201.
    burst = await device.mint_endpoint()
    codes = [await post(at(burst, far), good) for _ in range(30)]
    limited = [r for r in codes if r.status_code == 429]
    assert limited and int(limited[0].headers["retry-after"]) >= 1
    assert {r.status_code for r in codes} <= {201, 429}
    assert (await post(url, good)).status_code == 201
    m = parse_metrics(httpx.get(far + "/metrics", timeout=5).text)
    assert m["inri_webpush_accepted_total"] >= 3 and m['inri_webpush_refused_total{status="401"}'] >= 5
    assert m['inri_webpush_refused_total{status="429"}'] >= 1 and m["inri_webpush_negative_cache"] >= 2
    leftover = [m.id for m in await device.pull(1000)]
    if leftover:
        await device.ack(leftover)


def test_cli_mints_lists_revokes_and_pulls_web_push(lab: dict[str, Any], tmp_path: Path) -> None:
    """`inri device endpoint mint|list|revoke`, then `inri device pull` shows the Web Push message."""
    def inri(*args: str) -> list[dict[str, Any]]:
        proc = subprocess.run([sys.executable, "-m", "inri.cli", *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

    state = str(tmp_path / "dev.json")
    inri("device", "register", "--relay", lab["home"], "--state", state, "--tokens", "1")
    sender = Sender()
    minted = inri("device", "endpoint", "mint", "--state", state, "--vapid-key", sender.public)[0]
    assert minted["restricted"] and minted["vapid_key"] == sender.public and "/wp/v1/" in minted["url"]
    assert [e["endpoint_id"] for e in inri("device", "endpoint", "list", "--state", state)] == [minted["endpoint_id"]]
    sub = Subscriber()
    r = webpush(sub.info(minted["url"]), "to the cli", vapid_private_key=sender.vapid,
                vapid_claims={"sub": "mailto:ops@example.org"}, ttl=60)
    assert r.status_code == 201
    pulled = inri("device", "pull", "--state", state, "--ack")
    assert [(m["kind"], m["endpoint_id"]) for m in pulled] == [("webpush", minted["endpoint_id"])]
    assert inri("device", "endpoint", "revoke", "--state", state, minted["endpoint_id"])
    assert inri("device", "endpoint", "list", "--state", state) == []
    r2 = httpx.post(lab["far"] + "/wp/v1/AAAA/BBBB", headers={"TTL": "1"}, content=b"", timeout=5)
    assert r2.status_code == 404 and r2.json()["code"] == "not_found"  # random paths: no search started


async def test_matrix_gateway_delivers_one_pushkey_and_rejects_the_foreign_one(lab: dict[str, Any],
                                                                               device: DeviceClient) -> None:
    far = lab["far"]
    ep = await device.mint_endpoint()
    async with httpx.AsyncClient(timeout=10) as c:
        assert (await c.get(far + "/_matrix/push/v1/notify")).json() == {"unifiedpush": {"gateway": "matrix"}}
    secret_text = "matrix room secret " + os.urandom(8).hex()
    note = {"notification": {"event_id": "$e1", "room_id": "!r:example.org", "content": {"body": secret_text},
                             "counts": {"unread": 2},
                             "devices": [{"pushkey": at(ep, far), "app_id": "im.app"},
                                         {"pushkey": "https://push.example.net/up/abc", "app_id": "im.app"}]}}
    SECRETS.append(secret_text.encode())

    def notify() -> None:
        r = httpx.post(far + "/_matrix/push/v1/notify", json=note, timeout=10)
        assert r.status_code == 200 and r.json() == {"rejected": ["https://push.example.net/up/abc"]}

    got = await receive_one(device, notify)
    assert got.kind == "webpush" and got.endpoint_id == ep.endpoint_id and not got.undecryptable
    # Issue 41, item 6: the Push Gateway API body minus `devices`, as Element / Element X / FUTO Circles parse it.
    inner = {k: v for k, v in note["notification"].items() if k != "devices"}
    assert json.loads(got.body) == {"notification": inner} and inner["content"] == {"body": secret_text}


def mesh_push_frames(lab: dict[str, Any]) -> float:
    """Push frames sent by every relay of the lab (the mesh traffic a push causes)."""
    return sum(frames_out(r["api"]) for r in lab["relays"])


def altered_texts(text: str) -> list[str]:
    """text (base64url of some bytes) altered at every position: each byte flipped, each character replaced."""
    raw = unb64(text)
    out = [b64(raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:]) for i in range(len(raw))]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i, c in enumerate(text):
        out.append(text[:i] + alphabet[(alphabet.index(c) + 1 + i % 63) % 64] + text[i + 1:])
    return out


def altered_urls(url: str) -> list[str]:
    """An endpoint URL altered at every position of its path (`/wp/v1/<R>/<E>`)."""
    base, r, e = url.rsplit("/", 2)
    path = url[len(origin(url)):]
    out = [f"{base}/{t}/{e}" for t in altered_texts(r)] + [f"{base}/{r}/{t}" for t in altered_texts(e)]
    for i in range(1, len("/wp/v1/")):  # the fixed prefix too (its first "/" ends the origin)
        out.append(origin(url) + path[:i] + ("x" if path[i] != "x" else "y") + path[i + 1:])
    return list(dict.fromkeys(out))  # a flipped byte and a replaced character can give the same text


async def test_altered_endpoint_and_pushkey_bytes_every_position(lab: dict[str, Any], device: DeviceClient) -> None:
    """Issue 41, item 5: an endpoint URL or Matrix pushkey altered anywhere (each byte of R and E flipped,
    each character replaced) is 404 / `rejected` at the entry relay, with no push frame sent by any relay.
    Unrestricted (with the seal key the SDK sends) and restricted endpoints; a genuine push afterwards
    gets 201 and does move the counter (so the check can fail)."""
    far = lab["far"]
    sub, sender = Subscriber(), Sender()
    plain = at(await device.mint_endpoint(), far)
    bound = at(await device.mint_endpoint(sender.public), far)
    body = WebPusher(sub.info(plain)).encode(b"x" * 20, "aes128gcm")["body"]
    good = {"TTL": "60", "Content-Encoding": "aes128gcm"}
    signed = {**good, "Authorization": sender.auth(origin(plain))}
    def refused_404() -> float:
        return parse_metrics(httpx.get(far + "/metrics", timeout=5).text).get(
            'inri_webpush_refused_total{status="404"}', 0.0)

    before, before_404 = mesh_push_frames(lab), refused_404()
    answers: dict[str, list[str]] = {}
    limits = httpx.Limits(max_connections=4)
    async with httpx.AsyncClient(timeout=10, limits=limits) as c:
        async def post(u: str, h: dict[str, str]) -> None:
            r = await c.post(u, headers=h, content=body)
            answers.setdefault(f"{r.status_code} {r.json().get('code') if r.content else ''}", []).append(u)

        for url, headers in ((plain, good), (bound, signed)):
            urls = altered_urls(url)
            assert len(urls) > 450 and url not in urls
            for i in range(0, len(urls), 4):
                async with trio.open_nursery() as n:
                    for u in urls[i:i + 4]:
                        n.start_soon(post, u, headers)
        assert list(answers) == ["404 not_found"], {k: v[:2] for k, v in answers.items()}
        # Matrix: the same alterations of an INRI pushkey (which is an endpoint URL), plus its origin.
        keys = altered_urls(plain)
        o = origin(plain)
        keys += [plain.replace(o, o[:i] + ("9" if o[i] != "9" else "8") + o[i + 1:], 1)
                 for i in range(len("http://"), len(o))]
        rejected: list[str] = []
        for i in range(0, len(keys), 20):
            chunk = keys[i:i + 20]
            note = {"notification": {"event_id": "$x", "devices": [{"pushkey": k, "app_id": "a"} for k in chunk]}}
            r = await c.post(far + "/_matrix/push/v1/notify", json=note)
            assert r.status_code == 200, r.text
            rejected += r.json()["rejected"]
        assert rejected == keys
    assert mesh_push_frames(lab) == before, "altered endpoints must be refused at the entry relay alone"
    # Every alteration of R or E was refused by the Web Push route itself (the prefix ones by the router).
    assert refused_404() - before_404 == sum(u.startswith(far + "/wp/v1/") for u in answers["404 not_found"])
    # The genuine URLs still work and are routed: the frame counter can move.
    async with httpx.AsyncClient(timeout=10) as c:
        assert (await c.post(plain, headers=good, content=body)).status_code == 201
        assert (await c.post(bound, headers=signed, content=body)).status_code == 201
    assert mesh_push_frames(lab) > before
    await device.ack([m.id for m in await device.pull(1000)])


async def test_kill9_home_then_entry_after_201_delivered_exactly_once(lab: dict[str, Any],
                                                                      device: DeviceClient) -> None:
    """The home relay is down: the entry relay answers 201 from custody (no receipt in time). Then the
    entry relay itself is killed -9, and the relay its attempts went through takes custody of its copy (rule
    C8). Both restart; two copies now travel to the home. The push (its Web Push fields on disk with it) is
    delivered exactly once and decrypts to the bytes sent, also when the device acknowledges it before
    the second copy arrives (the home remembers it: store.WP_DEDUP_MIN_S)."""
    sub = Subscriber()
    ep = await device.mint_endpoint()
    await device.ack([m.id for m in await device.pull(1000)])
    home, entry = relay(lab, "R1"), next(r for r in lab["relays"] if r["api"] == lab["far"])
    others = [r for r in lab["relays"] if r is not home and r is not entry]
    os.killpg(home["pid"], signal.SIGKILL)
    r = await trio.to_thread.run_sync(lambda: webpush(sub.info(at(ep, lab["far"])), "survives two kills",
                                                      ttl=3600, headers={"Topic": "k9"}))
    assert r.status_code == 201
    pid = r.headers["location"].rsplit("/", 1)[1]
    os.killpg(entry["pid"], signal.SIGKILL)

    async def status(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=5) as c:
            return [(await c.get(x["api"] + "/v1/status")).json() for x in rs]

    async def custody(rs: list[dict[str, Any]]) -> int:
        return sum(st["custody"] for st in await status(rs))

    with trio.fail_after(30):  # every relay saw the link to the killed entry fail (keepalive timeout, 6 s)
        while any(n["node_id"] == entry["node_id"] for st in await status(others) for n in st["neighbours"]):
            await trio.sleep(0.2)
    # The relay the entry's attempts went through first took custody of its copy (rule C8), unless that
    # relay was the home itself (the mesh decides).
    adopted = await custody(others)
    mesh.restart_relay(lab, home)
    mesh.restart_relay(lab, entry)
    seen: list[Message] = []
    with trio.fail_after(60):
        async with device.stream(ack=False) as messages:
            while pid not in [m.id for m in seen]:
                seen.append(await messages.receive())
            await device.ack([m.id for m in seen])  # at once: the other copy is still on its way
        while await custody(lab["relays"]) > 0:  # both custodians heard from the home
            await trio.sleep(0.2)
    seen += await device.pull(1000)
    mine = [m for m in seen if m.id == pid]
    assert len(mine) == 1, (adopted, [m.id for m in seen])
    assert sub.decrypt(mine[0]) == b"survives two kills" and mine[0].topic == "k9"
    await device.ack([m.id for m in seen])


NODE_DIR = Path(__file__).parent / "node"


def make_tls(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 signed by it (cert, key, CA): what node web-push will trust."""
    from datetime import UTC, datetime, timedelta
    from ipaddress import IPv4Address

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = datetime.now(UTC)

    def cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey,
             ca: bool) -> x509.Certificate:
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(IPv4Address("127.0.0.1"))]),
                                critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("INRI test CA", ca_key, "INRI test CA", ca_key, True)
    leaf = cert("127.0.0.1", key, "INRI test CA", ca_key, False)
    paths = d / "relay.crt", d / "relay.key", d / "ca.crt"
    paths[0].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return paths


def stop(pid: int) -> None:
    """SIGTERM a relay we started (its own session) and reap it."""
    try:
        os.killpg(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


async def test_node_web_push_over_https_from_the_farthest_relay(lab: dict[str, Any], device: DeviceClient,
                                                                tmp_path: Path) -> None:
    """The unmodified npm `web-push` (https only) pushes to the farthest relay, restarted with `[api]
    tls_cert`/`tls_key` by the documented command; the device decrypts the exact bytes at home."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (Debian's nodejs; .ci/run installs it)")
    if not (NODE_DIR / "node_modules" / "web-push").is_dir():
        pytest.skip("npm web-push is not installed: npm ci --prefix tests/node (.ci/run does it)")
    sub, sender = Subscriber(), Sender()
    ep = await device.mint_endpoint(sender.public)  # restricted to the sender's VAPID key
    entry = next(r for r in lab["relays"] if r["api"] == lab["far"])
    cert, key, ca = make_tls(tmp_path)
    toml = Path(entry["data_dir"]) / "relay.toml"
    plain = toml.read_text()
    stop(entry["pid"])
    toml.write_text(plain.replace("[api]\n", f'[api]\ntls_cert = "{cert}"\ntls_key = "{key}"\n', 1))
    with open(entry["log"], "ab") as log:  # the documented command; its log is the one the privacy scan reads
        proc = subprocess.Popen([sys.executable, "-m", "inri.cli", "relay", "--config", str(toml)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    https = "https://" + entry["api"].split("://", 1)[1]
    try:
        with trio.fail_after(60):
            async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca)), timeout=2) as c:
                while True:
                    assert proc.poll() is None, "the TLS relay exited: see " + entry["log"]
                    try:
                        if (await c.get(https + "/healthz")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    await trio.sleep(0.2)
        payload = os.urandom(16) + b" node web-push, exact bytes \x00\xff"
        SECRETS.append(payload)
        request = {"subscription": sub.info(at(ep, https)), "payload_b64": base64.b64encode(payload).decode(),
                   "ttl": 3600, "topic": "nodeTopic",
                   "vapid": {"subject": "mailto:ops@example.org", "publicKey": sender.public,
                             "privateKey": b64(sender.vapid.private_key.private_numbers().private_value
                                               .to_bytes(32, "big"))}}
        out: list[dict[str, Any]] = []

        def send() -> None:
            r = subprocess.run([node, str(NODE_DIR / "send.js")], input=json.dumps(request), text=True,
                               capture_output=True, timeout=60, cwd=NODE_DIR,
                               env={**os.environ, "NODE_EXTRA_CA_CERTS": str(ca)})
            out.append(json.loads(r.stdout.splitlines()[-1]) if r.stdout else {"error": r.stderr})

        got = await receive_one(device, send)
        answer = out[0]
        assert answer.get("statusCode") == 201, answer
        assert answer["headers"]["ttl"] == "3600" and answer["headers"]["location"].startswith(https + "/v1/push/")
        assert got.endpoint_id == ep.endpoint_id and got.topic == "nodeTopic" and got.urgency == "normal"
        assert got.ttl is not None and 3500 <= got.ttl <= 3600  # the TTL left, counted from the entry relay
        assert sub.decrypt(got) == payload
    finally:
        stop(proc.pid)
        toml.write_text(plain)
        mesh.restart_relay(lab, entry)  # back to plain HTTP for whatever runs next


def test_privacy_scan_of_every_relay_but_the_home(lab: dict[str, Any]) -> None:
    """No relay but the home holds, on disk or in its log, an endpoint token, capability, VAPID key, JWT or
    plaintext: not the entry relays (their custody rows hold the sealed frame only), not the relays between."""
    assert SECRETS, "run with the other tests of this module: they make what is scanned for"
    scanned = 0
    for r in lab["relays"]:
        if r["name"] == "R1":
            continue
        files = [p for p in Path(r["data_dir"]).rglob("*") if p.is_file() and p.name != "node.key"]
        for f in [*files, Path(r["log"])]:
            data = f.read_bytes()
            scanned += len(data)
            for secret in SECRETS:
                assert secret not in data, (r["name"], str(f), secret[:12])
    assert scanned > 10_000
