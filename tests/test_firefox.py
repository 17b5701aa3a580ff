"""A real browser receives through INRI: Debian's firefox-esr, headless, on a fresh profile whose push server
(`dom.push.serverURL`) is relay R1 of a 5-relay mesh; a loopback page's service worker subscribes with a
VAPID key; an unmodified pywebpush sends from the relay farthest from R1 (the endpoint's origin swapped, as
any entry relay takes it). Then, each with its own assertion: Firefox closed while three pushes are sent,
all arrive once each after it starts again; a kill -9 of R1 after the senders' 201s loses nothing;
`unsubscribe()` makes the next push 410; a subscription bound to another VAPID key answers 403 to the
first key; and no relay but R1 holds an endpoint token, a p256dh/auth key, a VAPID key or a plaintext (R1
no plaintext). Skips where firefox-esr is absent (.ci/run installs it)."""

from __future__ import annotations

import base64
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pywebpush import WebPushException, webpush

from inri import mesh
from tests.firefox import FIREFOX, Firefox, PageServer
from tests.test_relay_mesh import distances, graph, relay
from tests.test_webpush import Sender, unb64

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(FIREFOX is None, reason="firefox-esr is not installed (Debian's firefox-esr; "
                                                         ".ci/run installs it)")]
CLAIMS = {"sub": "mailto:ops@example.org"}
SECRETS: list[bytes] = []  # what no relay but R1 may hold (the privacy scan, last)
PLAINTEXTS: list[bytes] = []  # what no relay at all may hold


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("ffmesh")
    info = mesh.up(d / "mesh", relays=5, bootstraps=1, timeout_s=120, min_neighbours=2)
    page = PageServer()
    try:
        dist = distances(graph(info), "R1")
        assert len(dist) == 5, f"mesh not connected: {dist}"
        far = max(sorted(dist), key=lambda n: dist[n])
        home = relay(info, "R1")
        ff = Firefox(d / "profile", home["api"].replace("http://", "ws://") + "/v1/mozpush", page.url + "/",
                     d / "firefox.log")
        lab = {"mesh": info, "page": page, "firefox": ff, "home": home["api"], "far": relay(info, far)["api"],
               "hops": dist[far], "senders": [Sender(), Sender()], "subs": {}}
        try:
            yield lab
        finally:
            ff.stop()
    finally:
        page.close()
        mesh.down(d / "mesh")


def connections(api: str) -> int:
    return int(httpx.get(api + "/v1/status", timeout=5).json()["mozpush"]["connections"])


def wait_connected(lab: dict[str, Any], want: int = 1, timeout: float = 90.0) -> None:
    """Firefox's push service is connected to R1 (a subscribe sent before that is never sent: GUIDE 5)."""
    deadline = time.monotonic() + timeout
    while connections(lab["home"]) < want:
        assert time.monotonic() < deadline, "Firefox did not connect to R1:\n" + lab["firefox"].tail()
        time.sleep(0.2)


def at_far(lab: dict[str, Any], sub: dict[str, Any]) -> dict[str, Any]:
    """The subscription with its endpoint entered at the farthest relay (only the origin changes)."""
    endpoint = sub["endpoint"]
    assert endpoint.startswith(lab["home"] + "/wp/v1/"), endpoint
    return {**sub, "endpoint": lab["far"] + endpoint[len(lab["home"]):]}


def push(lab: dict[str, Any], sub: dict[str, Any], text: str, sender: Sender, ttl: int = 600) -> int:
    """pywebpush from the farthest relay; the HTTP status (pywebpush raises on a refusal)."""
    PLAINTEXTS.append(text.encode())
    try:
        r = webpush(at_far(lab, sub), text, vapid_private_key=sender.vapid, vapid_claims=dict(CLAIMS), ttl=ttl)
    except WebPushException as exc:
        assert exc.response is not None
        return int(exc.response.status_code)
    return int(r.status_code)


def subscribe(lab: dict[str, Any], scope: str, sender: Sender) -> dict[str, Any]:
    page: PageServer = lab["page"]
    page.command(do="subscribe", scope=scope, key=sender.public)
    sub: dict[str, Any] = page.wait_for("subscription", 60, scope=scope)[0]["sub"]
    e_part = sub["endpoint"].rsplit("/", 1)[1]
    keys = sub["keys"]
    SECRETS.extend([e_part.encode(), unb64(e_part)[25:41], keys["p256dh"].encode(),
                    unb64(keys["p256dh"]), keys["auth"].encode(), unb64(keys["auth"]), sender.public.encode(),
                    unb64(sender.public)])
    lab["subs"][scope] = sub
    return sub


def arrived(lab: dict[str, Any], text: str, timeout: float) -> dict[str, Any]:
    """The service worker's report of the push carrying text (Firefox's log in the failure)."""
    try:
        return lab["page"].wait_for("push", timeout, text=text)[0]
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nFirefox log:\n{lab['firefox'].tail()}") from None


def texts(lab: dict[str, Any], scope: str) -> list[str]:
    return [r["text"] for r in lab["page"].reports if r.get("kind") == "push" and r["scope"].endswith(scope)]


def sentinel(lab: dict[str, Any], scope: str, sender: Sender) -> None:
    """One more push and its arrival: copies of earlier pushes would have come before it (they are sent in
    order, and stored ones first on a connection)."""
    text = "sentinel " + os.urandom(4).hex()
    assert push(lab, lab["subs"][scope], text, sender) == 201
    arrived(lab, text, 60)


def test_firefox_receives_the_exact_text_from_the_farthest_relay(lab: dict[str, Any]) -> None:
    ff: Firefox = lab["firefox"]
    ff.start()
    lab["page"].wait_for("page", 60)
    wait_connected(lab)
    sender = lab["senders"][0]
    sub = subscribe(lab, "/a/", sender)
    text = "hello Firefox through INRI " + os.urandom(4).hex() + " é✓"
    assert push(lab, sub, text, sender) == 201
    assert arrived(lab, text, 60)["scope"].endswith("/a/")


def test_three_pushes_sent_while_firefox_is_closed_arrive_once_each(lab: dict[str, Any]) -> None:
    ff: Firefox = lab["firefox"]
    sender = lab["senders"][0]
    ff.stop()
    assert ff.saved_uaid() is not None, "Firefox quit without saving its uaid: it would drop its subscriptions"
    deadline = time.monotonic() + 30
    while connections(lab["home"]):
        assert time.monotonic() < deadline, "R1 still holds Firefox's connection"
        time.sleep(0.2)
    sent = [f"while closed {i} {os.urandom(3).hex()}" for i in range(3)]
    for text in sent:
        assert push(lab, lab["subs"]["/a/"], text, sender) == 201
    ff.start()
    for text in sent:
        arrived(lab, text, 90)
    sentinel(lab, "/a/", sender)
    got = texts(lab, "/a/")
    assert [got.count(t) for t in sent] == [1, 1, 1], got


def test_kill9_of_r1_after_the_201s_loses_nothing(lab: dict[str, Any]) -> None:
    """R1 (Firefox's home) is killed -9; two pushes are answered 201 by the farthest relay (custody); R1
    restarts, Firefox reconnects by itself and gets both, once each."""
    sender = lab["senders"][0]
    home = relay(lab["mesh"], "R1")
    os.killpg(home["pid"], signal.SIGKILL)
    sent = [f"across a kill {i} {os.urandom(3).hex()}" for i in range(2)]
    for text in sent:
        assert push(lab, lab["subs"]["/a/"], text, sender) == 201
    mesh.restart_relay(lab["mesh"], home)
    for text in sent:
        arrived(lab, text, 120)
    sentinel(lab, "/a/", sender)
    got = texts(lab, "/a/")
    assert [got.count(t) for t in sent] == [1, 1], got


def test_a_second_subscription_bound_to_another_key_refuses_the_first_key(lab: dict[str, Any]) -> None:
    first, second = lab["senders"]
    wait_connected(lab)
    sub_b = subscribe(lab, "/b/", second)
    assert push(lab, sub_b, "signed with the wrong key", first) == 403
    text = "signed with its own key " + os.urandom(3).hex()
    assert push(lab, sub_b, text, second) == 201
    assert arrived(lab, text, 60)["scope"].endswith("/b/")


def test_unsubscribe_makes_the_next_push_410(lab: dict[str, Any]) -> None:
    page: PageServer = lab["page"]
    page.command(do="unsubscribe", scope="/a/")
    assert page.wait_for("unsubscribed", 60, scope="/a/")[0]["ok"] is True
    assert push(lab, lab["subs"]["/a/"], "after unsubscribe", lab["senders"][0]) == 410


def test_privacy_scan_no_relay_but_r1_holds_tokens_keys_or_plaintext(lab: dict[str, Any]) -> None:
    """As tests/test_webpush.py's scan: every file of every relay's data directory and its log."""
    assert SECRETS and PLAINTEXTS, "run with the other tests of this module: they make what is scanned for"
    lab["firefox"].stop()  # nothing more arrives; R1's files are scanned too (for plaintext)
    scanned = 0
    for r in lab["mesh"]["relays"]:
        files = [p for p in Path(r["data_dir"]).rglob("*") if p.is_file() and p.name != "node.key"]
        for f in [*files, Path(r["log"])]:
            data = f.read_bytes()
            scanned += len(data)
            for text in PLAINTEXTS:
                assert text not in data and base64.b64encode(text) not in data, (r["name"], str(f), text[:20])
            if r["name"] == "R1":
                continue
            for secret in SECRETS:
                assert secret not in data, (r["name"], str(f), secret[:12])
    assert scanned > 10_000
