"""Issue 39: the operator's guarantees, through the commands and the running processes.

One relay per data directory; a copied identity refused by the bootstrap and logged by both
relays; backup while pushes flow and restore with every registration; public_addr refused at
--check-config unless IP literals; an unreachable public address named (within 10 s: checked on
virtual time in test_bootstrap_client.py); /healthz degraded when isolated;
SIGHUP reloads the log level and never exits; JSON logs are all JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.procs import Proc, bootstrap_cmd, bootstrap_url, relay_ready

pytestmark = pytest.mark.integration
INRI = [sys.executable, "-m", "inri.cli"]


def _relay(data: Path, log: Path, *extra: str, boot: str = "http://127.0.0.1:9", **env: str) -> Proc:
    return Proc([*INRI, "relay", "--data-dir", str(data), "--api", "127.0.0.1:0", "--quic", "127.0.0.1:0",
                 "--bootstrap", boot, "--profile", "test", *extra], log,
                {"INRI_RELAY_LOG_FORMAT": "json", **env})


def _json_lines(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]  # every line is JSON


def _wait(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(what)


def test_a_second_relay_on_the_same_data_dir_is_refused_in_one_line(tmp_path: Path) -> None:
    first = _relay(tmp_path / "d", tmp_path / "a.log")
    try:
        info = relay_ready(first, tmp_path / "d")
        second = subprocess.run([*INRI, "relay", "--data-dir", str(tmp_path / "d"), "--api", "127.0.0.1:0",
                                 "--quic", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
        assert second.returncode == 1, second.stderr
        assert second.stderr.strip() == (f"inri relay: data directory {tmp_path / 'd'} is in use by another relay "
                                         f"(pid {info['pid']}): one relay per data directory (and per identity)")
        assert (tmp_path / "d" / "relay.json").exists()  # the second did not remove the first's
        assert oct((tmp_path / "d" / "relay.sqlite3").stat().st_mode & 0o777) == "0o600"
    finally:
        first.stop()


def test_a_copied_identity_is_refused_by_the_bootstrap_and_logged(tmp_path: Path) -> None:
    boot = Proc(bootstrap_cmd("127.0.0.1:0", tmp_path / "b", []), tmp_path / "b.log")
    procs = [boot]
    try:
        url = bootstrap_url(boot)
        r2 = _relay(tmp_path / "r2", tmp_path / "r2.log", boot=url)
        procs.append(r2)
        relay_ready(r2, tmp_path / "r2")
        _wait(lambda: any(e.get("event") == "announced" for e in _json_lines(tmp_path / "r2.log")), 30, "r2 listed")
        (tmp_path / "r5").mkdir()
        shutil.copy(tmp_path / "r2" / "node.key", tmp_path / "r5" / "node.key")  # `cp -a r2/data r5/data`
        shutil.copy(tmp_path / "r2" / "relay.sqlite3", tmp_path / "r5" / "relay.sqlite3")
        r5 = _relay(tmp_path / "r5", tmp_path / "r5.log", boot=url)
        procs.append(r5)
        r5_info = relay_ready(r5, tmp_path / "r5")
        _wait(lambda: any("another relay runs with this relay's identity" in str(e.get("event"))
                          for e in _json_lines(tmp_path / "r5.log")), 30, (tmp_path / "r5.log").read_text()[-2000:])
        status = httpx.get(r5_info["api"] + "/v1/status").json()["reachability"]
        assert status["announce"] == "duplicate_identity" and "copied data directory" in status["detail"]
        assert httpx.get(r5_info["api"] + "/healthz").status_code == 503
        _wait(lambda: any(e.get("event") == "announce refused" and e.get("code") == "duplicate_identity"
                          for e in _json_lines(tmp_path / "b.log")), 10, "the bootstrap logs the refusal")
        metrics = httpx.get(url + "/metrics").text
        assert 'inri_bootstrap_events_total{event="announce_failed"}' in metrics
    finally:
        for p in procs:
            p.stop()


def test_backup_while_pushing_then_restore_keeps_every_registration(tmp_path: Path) -> None:
    relay = _relay(tmp_path / "d", tmp_path / "r.log")
    states = [tmp_path / f"dev{i}.json" for i in range(6)]
    try:
        api = old_api = relay_ready(relay, tmp_path / "d")["api"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for i, state in enumerate(states):
            subprocess.run([*INRI, "device", "register", "--relay", api, "--state", str(state)], check=True,
                           capture_output=True, env=env, timeout=60)
            subprocess.run([*INRI, "device", "credential", "--state", str(state), "--out",
                            str(tmp_path / f"cred{i}.json")], check=True, capture_output=True, env=env, timeout=60)
        pushers = [subprocess.Popen([*INRI, "app", "push", "--relay", api, "--credential",
                                     str(tmp_path / f"cred{i}.json"), "--message", f"m{i}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(6)]
        out = subprocess.run([*INRI, "relay", "backup", "--data-dir", str(tmp_path / "d"), "--out",
                              str(tmp_path / "bk")], capture_output=True, text=True, timeout=60)
        for p in pushers:
            p.wait(60)
        assert out.returncode == 0, out.stderr
        manifest = json.loads(out.stdout)
        assert manifest["devices"] == 6 and manifest["schema"] == 2
        assert oct((tmp_path / "bk" / "node.key").stat().st_mode & 0o777) == "0o600"
        refused = subprocess.run([*INRI, "relay", "restore", str(tmp_path / "bk"), "--data-dir",
                                  str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and "stop it before restoring" in refused.stderr  # the relay runs
    finally:
        relay.stop()
    shutil.rmtree(tmp_path / "d")  # the disk is lost
    done = subprocess.run([*INRI, "relay", "restore", str(tmp_path / "bk"), "--data-dir", str(tmp_path / "new")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    relay = _relay(tmp_path / "new", tmp_path / "r2.log")
    try:
        api = relay_ready(relay, tmp_path / "new")["api"]
        assert httpx.get(api + "/v1/status").json()["node_id"] == manifest["node_id"]
        for i, state in enumerate(states):  # every device is still homed: its secret opens its mailbox
            saved = json.loads(state.read_text())  # (the restored relay listens on another port here)
            state.write_text(json.dumps({**saved, **{k: api for k, v in saved.items() if v == old_api}}))
            got = subprocess.run([*INRI, "device", "pull", "--state", str(state)], capture_output=True, text=True,
                                 timeout=60)
            assert got.returncode == 0, (i, got.stderr)
    finally:
        relay.stop()


@pytest.mark.parametrize(("value", "error"), [
    ("relay.example.org:4433", "is not an IP address"),
    ("0.0.0.0:4433", "cannot be announced"),
    ("203.0.113.7:0", "port 0 cannot be announced"),
    ("203.0.113.7:4433,203.0.113.8:4433", "at most one IPv4 and one IPv6"),
    ("203.0.113.7", "is not host:port"),
])
def test_public_addr_is_checked_at_check_config(value: str, error: str, tmp_path: Path) -> None:
    proc = subprocess.run([*INRI, "relay", "--data-dir", str(tmp_path), "--public-addr", value, "--check-config"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert error in proc.stderr and "relay.public_addr" in proc.stderr


def test_ipv4_and_ipv6_public_addresses_are_both_accepted(tmp_path: Path) -> None:
    proc = subprocess.run([*INRI, "relay", "--data-dir", str(tmp_path), "--public-addr",
                           "[2001:db8::7]:4433, 203.0.113.7:4433", "--check-config"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_an_unreachable_public_addr_is_named_in_status_log_metrics_and_healthz(tmp_path: Path) -> None:
    boot = Proc(bootstrap_cmd("127.0.0.1:0", tmp_path / "b", []), tmp_path / "b.log")
    hole = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a UDP port nobody answers on: a closed firewall
    hole.bind(("127.0.0.1", 0))
    port = hole.getsockname()[1]
    relay = None
    try:
        url = bootstrap_url(boot)
        relay = _relay(tmp_path / "d", tmp_path / "r.log", "--public-addr", f"127.0.0.1:{port}", boot=url)
        api = relay_ready(relay, tmp_path / "d")["api"]
        # How soon (virtual time, within 10 s): test_bootstrap_client.py; here the 60 s is a hang guard only.
        _wait(lambda: httpx.get(api + "/v1/status").json()["reachability"]["announce"] == "unreachable", 60,
              (tmp_path / "r.log").read_text()[-2000:])
        lines = [e for e in _json_lines(tmp_path / "r.log") if e.get("event") == f"unreachable from the bootstrap: "
                 f"open UDP {port}"]
        assert lines and lines[0]["level"] == "error"
        metrics = httpx.get(api + "/metrics").text
        assert "inri_unreachable_from_bootstrap 1.0" in metrics
        assert 'inri_announce_failures_total{outcome="unreachable"}' in metrics
        body = httpx.get(api + "/healthz")
        assert body.status_code == 503 and f"open UDP {port}" in " ".join(body.json()["reasons"])
    finally:
        if relay is not None:
            relay.stop()
        boot.stop()
        hole.close()


def test_healthz_is_degraded_once_isolated_too_long_and_sighup_never_exits(tmp_path: Path) -> None:
    relay = _relay(tmp_path / "d", tmp_path / "r.log", INRI_RELAY_ISOLATED_DEGRADED_S="1")
    try:
        api = relay_ready(relay, tmp_path / "d")["api"]
        _wait(lambda: httpx.get(api + "/healthz").status_code == 503, 10, "degraded")
        health = httpx.get(api + "/healthz").json()
        assert health["status"] == "degraded" and "no neighbour for" in health["reasons"][0]
        assert httpx.get(api + "/v1/status").json()["reachability"]["isolated_s"] >= 1
        assert "inri_isolated_seconds" in httpx.get(api + "/metrics").text
        assert 'inri_build_info{python=' in httpx.get(api + "/metrics").text
        assert not any(e.get("level") == "debug" for e in _json_lines(tmp_path / "r.log"))
        relay.p.send_signal(signal.SIGHUP)  # it used to kill the relay (exit 129)
        _wait(lambda: any(e.get("event") == "configuration reloaded" for e in _json_lines(tmp_path / "r.log")), 10,
              "reloaded")
        assert relay.alive() and httpx.get(api + "/v1/status").status_code == 200
    finally:
        assert relay.stop() == 0
    _json_lines(tmp_path / "r.log")


def _served_certificate(api: str) -> bytes:
    """The certificate (DER) a new TLS connection to the relay's API is served."""
    host, port = api.removeprefix("https://").rsplit(":", 1)
    return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate((host, int(port)), timeout=10))


def test_sighup_reloads_a_renewed_tls_certificate_for_new_connections(tmp_path: Path) -> None:
    """Issue 39/41: the files at [api] tls_cert/tls_key replaced (as a renewal does) and SIGHUP sent: new
    connections get the new certificate, a connection opened before keeps working, and files that do not load
    are logged while the running certificate stays."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    from tests.test_webpush import make_tls

    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    cert, key, ca = make_tls(tmp_path / "old")
    cert2, key2, ca2 = make_tls(tmp_path / "new")
    old_der = x509.load_pem_x509_certificate(cert.read_bytes()).public_bytes(Encoding.DER)
    new_der = x509.load_pem_x509_certificate(cert2.read_bytes()).public_bytes(Encoding.DER)
    log = tmp_path / "r.log"
    relay = _relay(tmp_path / "d", log, INRI_API_TLS_CERT=str(cert), INRI_API_TLS_KEY=str(key))
    try:
        api = relay_ready(relay, tmp_path / "d")["api"]
        assert api.startswith("https://") and _served_certificate(api) == old_der
        # One connection, opened on the old certificate and kept across the reloads
        with httpx.Client(verify=ssl.create_default_context(cafile=ca)) as kept:
            assert kept.get(api + "/healthz").status_code in (200, 503)
            key.write_text("not a key\n")  # a renewal half done: the key does not load
            relay.p.send_signal(signal.SIGHUP)
            _wait(lambda: any(e.get("event") == "reload failed; keeping the running configuration"
                              and e.get("hook") == "reload_tls_certificate" and str(key) in str(e.get("error"))
                              for e in _json_lines(log)), 30, log.read_text()[-2000:])
            assert relay.alive() and _served_certificate(api) == old_der
            shutil.copy(cert2, cert)
            shutil.copy(key2, key)
            relay.p.send_signal(signal.SIGHUP)
            _wait(lambda: any(e.get("event") == "TLS certificate reloaded" for e in _json_lines(log)), 30,
                  log.read_text()[-2000:])
            assert _served_certificate(api) == new_der
            with httpx.Client(verify=ssl.create_default_context(cafile=ca2)) as fresh:
                assert fresh.get(api + "/healthz").status_code in (200, 503)
            # Open connections are left alone: this client trusts only the old CA, so it could not open another.
            again = kept.get(api + "/healthz")
            assert again.extensions["network_stream"].get_extra_info("ssl_object").getpeercert(True) == old_der
        assert relay.alive()
    finally:
        assert relay.stop() == 0


def test_metrics_served_on_their_own_listener_and_a_taken_port_is_one_line(tmp_path: Path) -> None:
    """[metrics] listen: /metrics on a listener of its own (relay.json names it), nothing else there, and the
    API's port answers /metrics 404; a second relay whose metrics port is taken refuses to start in one line."""
    relay = _relay(tmp_path / "d", tmp_path / "r.log", INRI_METRICS_LISTEN="127.0.0.1:0")
    try:
        info = relay_ready(relay, tmp_path / "d")
        api, metrics = info["api"], info["metrics"]
        assert metrics != api and metrics.startswith("http://127.0.0.1:")
        scrape = httpx.get(metrics + "/metrics")
        assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
        assert "inri_build_info{" in scrape.text and "inri_http_connections " in scrape.text
        assert httpx.get(api + "/metrics").json()["code"] == "not_found"
        assert httpx.get(metrics + "/v1/status").status_code == 404  # the metrics port serves metrics only
        assert httpx.get(metrics + "/healthz").status_code == 404
        assert httpx.post(metrics + "/metrics").status_code == 405
        assert httpx.get(api + "/v1/status").status_code == 200
        port = metrics.rsplit(":", 1)[1]
        second = subprocess.run([*INRI, "relay", "--data-dir", str(tmp_path / "e"), "--api", "127.0.0.1:0",
                                 "--quic", "127.0.0.1:0"], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "INRI_METRICS_LISTEN": f"127.0.0.1:{port}"})
        assert second.returncode == 1, second.stderr
        assert second.stderr.strip() == (f"inri relay: cannot listen for metrics on 127.0.0.1:{port}: "
                                         "Address already in use")
        assert relay.alive()
    finally:
        assert relay.stop() == 0


def test_a_second_bootstrap_on_a_taken_port_is_refused_in_one_line(tmp_path: Path) -> None:
    boot = Proc(bootstrap_cmd("127.0.0.1:0", tmp_path / "b", []), tmp_path / "b.log")
    try:
        port = bootstrap_url(boot).rsplit(":", 1)[1]
        second = subprocess.run(bootstrap_cmd(f"127.0.0.1:{port}", tmp_path / "c", []), capture_output=True,
                                text=True, timeout=60)
        assert second.returncode == 1, second.stderr
        assert second.stderr.strip() == f"inri-bootstrap: cannot listen on 127.0.0.1:{port}: Address already in use"
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200  # the first one still serves
    finally:
        boot.stop()


def test_sighup_reloads_the_log_level_from_the_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "relay.toml"
    conf.write_text('[relay]\nlog_level = "warning"\n')
    relay = Proc([*INRI, "relay", "--config", str(conf), "--data-dir", str(tmp_path / "d"), "--api", "127.0.0.1:0",
                  "--quic", "127.0.0.1:0", "--bootstrap", "http://127.0.0.1:9", "--profile", "test"],
                 tmp_path / "r.log", {"INRI_RELAY_LOG_FORMAT": "json"})
    try:
        api = relay_ready(relay, tmp_path / "d")["api"]
        assert not any(e.get("event") == "relay ready" for e in _json_lines(tmp_path / "r.log"))  # info: off
        conf.write_text('[relay]\nlog_level = "info"\n')
        relay.p.send_signal(signal.SIGHUP)
        _wait(lambda: any(e.get("event") == "configuration reloaded" for e in _json_lines(tmp_path / "r.log")), 10,
              (tmp_path / "r.log").read_text()[-1000:])
        conf.write_text('[relay]\nlog_level = "loud"\n')  # a broken file: logged, the relay keeps running
        relay.p.send_signal(signal.SIGHUP)
        _wait(lambda: any(e.get("event") == "reload failed; keeping the running configuration"
                          for e in _json_lines(tmp_path / "r.log")), 10, "reload failure logged")
        assert relay.alive() and httpx.get(api + "/healthz").status_code in (200, 503)
    finally:
        assert relay.stop() == 0
