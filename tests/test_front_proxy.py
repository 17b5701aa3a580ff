"""A relay behind the TLS-terminating reverse proxy the docs recommend (Debian's nginx, started here) with
`[api] trusted_proxies` and `[webpush] public_origins` (issue 41 item 8): an unmodified pywebpush sender
with the public origin as VAPID `aud` gets 201 and the device receives; two clients behind the proxy
have separate rate limits; nobody, behind the proxy or not, can move its address with X-Forwarded-For.
The bootstrap's rate limit follows the same `trusted_proxies` (no proxy needed to show it)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import requests
import trio
from pywebpush import webpush

from inri.client import DeviceClient
from tests.procs import Proc, bootstrap_cmd, bootstrap_url, relay_cmd, relay_ready
from tests.test_webpush import Sender, Subscriber, make_tls

pytestmark = pytest.mark.integration

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
BURST = 5  # requests per client before 429 (the bucket refills at 1 per 1,000 s: never, in this test)


def free_port() -> int:
    """A port free now (nginx binds its own listener: it cannot be handed one); see start_nginx's retry."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nginx_conf(d: Path, port: int, upstream: str, cert: Path, key: Path) -> str:
    user = "user root;\n" if os.geteuid() == 0 else ""  # as root, workers must still read the test's files
    temp = " ".join(f"{name}_temp_path {d / name};" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""{user}daemon off;
worker_processes 1;
pid {d / 'nginx.pid'};
error_log {d / 'error.log'} info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    {temp}
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{
            proxy_pass http://{upstream};
            proxy_http_version 1.1;
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
        }}
    }}
}}
"""


def start_nginx(d: Path, upstream: str, cert: Path, key: Path) -> tuple[subprocess.Popen[bytes], int]:
    """nginx terminating TLS in front of upstream; (process, port). A port taken meanwhile: another one."""
    assert NGINX is not None
    for _ in range(5):
        port = free_port()
        conf = d / "nginx.conf"
        conf.write_text(nginx_conf(d, port, upstream, cert, key))
        with open(d / "nginx.out", "ab") as out:
            proc = subprocess.Popen([NGINX, "-p", str(d), "-c", str(conf), "-e", str(d / "error.log")],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(100):
            if proc.poll() is not None:
                break
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return proc, port
            time.sleep(0.05)
        stop(proc)
    raise AssertionError("nginx did not start: " + (d / "error.log").read_text()[-2000:])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def client(ca: Path, source: str) -> httpx.AsyncClient:
    """An HTTPS client of the proxy from one loopback address."""
    verify = ssl.create_default_context(cafile=str(ca))
    return httpx.AsyncClient(timeout=10, transport=httpx.AsyncHTTPTransport(local_address=source, verify=verify))


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian's nginx; .ci/run installs it)")
async def test_a_relay_behind_a_tls_proxy_with_trusted_proxies_and_public_origins(tmp_path: Path) -> None:
    cert, key, ca = make_tls(tmp_path)
    relay_dir = tmp_path / "relay"
    relay_dir.mkdir()
    ndir = tmp_path / "nginx"
    ndir.mkdir()
    # The relay first (its port 0 resolved), nginx in front of it, then the relay restarted to learn the
    # proxy's origin (its public name for Web Push): the same data directory, the same devices.
    proc = Proc(relay_cmd(relay_dir), tmp_path / "relay0.log")
    try:
        api = relay_ready(proc, relay_dir)["api"]
    finally:
        proc.stop()
    upstream = api.removeprefix("http://")
    nginx, port = start_nginx(ndir, upstream, cert, key)
    public = f"https://127.0.0.1:{port}"
    toml = tmp_path / "relay.toml"
    toml.write_text(f"""[api]
trusted_proxies = ["127.0.0.1"]
rate_per_s = 0.001
rate_burst = {BURST}
tarpit_s = 0.0

[webpush]
public_origins = ["{public}"]
""")
    proc = Proc(relay_cmd(relay_dir, "--config", str(toml), "--api", upstream), tmp_path / "relay.log")
    try:
        relay_ready(proc, relay_dir)
        with trio.fail_after(90):
            dev = DeviceClient(api)  # the device reaches its home directly (the proxy's address, no header)
            await dev.register(tokens=1)
            sub, sender = Subscriber(), Sender()
            ep = await dev.mint_endpoint()
            assert ep.url.startswith(public + "/wp/v1/"), ep.url  # endpoint URLs carry the public origin
            session = requests.Session()
            session.verify = str(ca)
            session.trust_env = False  # REQUESTS_CA_BUNDLE would win over session.verify
            answers: list[requests.Response] = []

            def push() -> None:
                answers.append(webpush(sub.info(ep.url), "through the proxy", vapid_private_key=sender.vapid,
                                       vapid_claims={"sub": "mailto:ops@example.org"}, ttl=300,
                                       requests_session=session))  # aud: the endpoint's origin, the public one

            await trio.to_thread.run_sync(push)
            r = answers[0]
            assert r.status_code == 201, r.text
            assert r.headers["location"].startswith(public + "/v1/push/")
            async with dev.stream(ack=True) as messages:
                got = await messages.receive()
            assert sub.decrypt(got) == b"through the proxy"

            probe = "/v1/push/" + "00" * 16  # rate limited (404: no such push): one token per request
            async with client(ca, "127.0.0.2") as a, client(ca, "127.0.0.3") as b:
                codes_a = [(await a.get(public + probe)).status_code for _ in range(BURST + 1)]
                assert codes_a == [404] * BURST + [429]
                # b is another client behind the same proxy: its own bucket
                assert (await b.get(public + probe)).status_code == 404
                # a names b in its own X-Forwarded-For: nginx appends a's address, which is what counts
                r = await a.get(public + probe, headers={"x-forwarded-for": "127.0.0.3"})
                assert r.status_code == 429 and r.json()["code"] == "rate_limited"
                assert (await b.get(public + probe)).status_code == 404  # b's bucket untouched
            # A client that is not a trusted proxy, straight to the relay: its header is not believed.
            direct = httpx.AsyncClient(timeout=10, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.4"))
            async with direct:
                codes = [(await direct.get(api + probe, headers={"x-forwarded-for": f"198.51.100.{i}"})).status_code
                         for i in range(BURST + 1)]
            assert codes == [404] * BURST + [429]
    finally:
        proc.stop()
        stop(nginx)
    assert "Traceback" not in (tmp_path / "relay.log").read_text()


async def test_a_bootstraps_rate_limit_believes_only_its_trusted_proxies(tmp_path: Path) -> None:
    """`[bootstrap] trusted_proxies`: requests relayed by the proxy (127.0.0.1 here, adding X-Forwarded-For as
    nginx does) count against the client it names, the last address of the header; a client reaching the
    bootstrap from an address not in the list counts as itself whatever header it sends."""
    boot = Proc(bootstrap_cmd("127.0.0.1:0", tmp_path / "b", []), tmp_path / "b.log",
                {"INRI_BOOTSTRAP_TRUSTED_PROXIES": "127.0.0.1", "INRI_BOOTSTRAP_RATE_PER_S": "0.001",
                 "INRI_BOOTSTRAP_RATE_BURST": str(BURST)})
    try:
        url = bootstrap_url(boot) + "/v1/peers"

        def from_(source: str) -> httpx.AsyncClient:
            return httpx.AsyncClient(timeout=10, transport=httpx.AsyncHTTPTransport(local_address=source))

        with trio.fail_after(60):
            async with from_("127.0.0.1") as proxy, from_("127.0.0.6") as direct:
                one = {"x-forwarded-for": "203.0.113.1"}
                assert [(await proxy.get(url, headers=one)).status_code for _ in range(BURST + 1)] == \
                    [200] * BURST + [429]
                assert (await proxy.get(url, headers={"x-forwarded-for": "203.0.113.2"})).status_code == 200
                # 203.0.113.1 naming another client before it: the proxy appended the address that counts
                spoof = {"x-forwarded-for": "203.0.113.3, 203.0.113.1"}
                assert (await proxy.get(url, headers=spoof)).status_code == 429
                codes = [(await direct.get(url, headers={"x-forwarded-for": f"198.51.100.{i}"})).status_code
                         for i in range(BURST + 1)]
                assert codes == [200] * BURST + [429]  # not a trusted proxy: its own address counts
                assert (await proxy.get(url, headers={"x-forwarded-for": "203.0.113.3"})).status_code == 200
    finally:
        boot.stop()
    assert "Traceback" not in (tmp_path / "b.log").read_text()
