"""`inri gateway` configuration and commands: every refusal names the file and key; keygen never
overwrites a key apps seal to; `seal` makes a token the gateway opens; --check-config loads the keys."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from nacl.public import PrivateKey

from inri.cli import main
from inri.common.b64url import b64d
from inri.gateway.config import ConfigError, load_gateway_config
from inri.gateway.keys import load_key
from inri.protocol.wake import WakeProvider, open_wake_token
from tests.gateway_fakes import apns_device_token, make_tls, write_gateway


@pytest.fixture
def setup(tmp_path: Path) -> Path:
    tls = make_tls(tmp_path / "tls")
    return write_gateway(tmp_path / "gw", tls, apns_url="https://127.0.0.1:1", fcm_url="https://127.0.0.1:2").config


def test_a_valid_file_resolves_paths_and_the_project_id(setup: Path) -> None:
    cfg = load_gateway_config(setup, env={})
    assert cfg.apns is not None and cfg.fcm is not None
    assert cfg.fcm.project_id == "inri-test"  # from the service account
    assert cfg.path(cfg.apns.key_file) == setup.parent / "AuthKey.p8"
    assert load_gateway_config(setup, env={"INRI_GATEWAY_LISTEN": "127.0.0.1:9999"}).gateway.listen == "127.0.0.1:9999"


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('key_id = "ABC123DEFG"', 'key_id = "abc"'), "apns.key_id"),
    (lambda t: t.replace('base_url = "https://127.0.0.1:1"', 'base_url = "http://127.0.0.1:1"'), "apns.base_url"),
    (lambda t: t.replace('key_file = "AuthKey.p8"', 'key_file = "missing.p8"'), "no such file"),
    (lambda t: t + '[relay]\napi = "x"\n', "unknown section"),
    (lambda t: t.replace('[gateway]\n', '[gateway]\nrate_per_s = -1\n'), "rate_per_s"),
    (lambda t: t.replace('[gateway]\n', '[gateway]\nbogus = 1\n'), "unknown key 'bogus'"),
    (lambda t: t.replace("[apns]\n", '[apns]\ntoken_refresh_s = 4000.0\n'), "token_refresh_s"),
    (lambda t: t.replace("[apns]\n", '[apns]\npush_type = "alert"\nalert_body = ""\n'), "alert"),
    (lambda t: t.replace('topic = "org.example.inri-app"\n', ""), "missing key 'topic'"),
    (lambda t: t.split("[apns]")[0], "at least one provider"),
])
def test_refusals_name_the_key(setup: Path, edit: object, message: str) -> None:
    setup.write_text(edit(setup.read_text()))  # type: ignore[operator]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_gateway_config(setup, env={})


def test_a_file_that_is_not_a_service_account_is_refused(setup: Path) -> None:
    (setup.parent / "service-account.json").write_text(json.dumps({"type": "authorized_user"}))
    with pytest.raises(ConfigError, match="not a service account"):
        load_gateway_config(setup, env={})


def test_keygen_makes_a_private_key_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gw.key"
    assert main(["gateway", "keygen", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert printed["public_key"] and bytes(load_key(out).public_key) == b64d(printed["public_key"])
    before = out.read_bytes()
    assert main(["gateway", "keygen", "--out", str(out)]) == 1  # never overwritten
    assert out.read_bytes() == before


def test_seal_makes_a_token_the_gateway_opens(capsys: pytest.CaptureFixture[str]) -> None:
    key = PrivateKey.generate()
    from inri.common.b64url import b64e

    device_token = apns_device_token()
    assert main(["gateway", "seal", "--public-key", b64e(bytes(key.public_key)), "--provider", "apns",
                 "--device-token", device_token]) == 0
    token = b64d(json.loads(capsys.readouterr().out)["token"])
    target = open_wake_token(key, token)
    assert (target.provider, target.device_token) == (WakeProvider.APNS, device_token)
    assert main(["gateway", "seal", "--public-key", b64e(bytes(key.public_key)), "--provider", "apns",
                 "--device-token", "not/hex"]) == 2


def test_check_config_loads_every_key(setup: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", "--config", str(setup), "--check-config"]) == 0
    (setup.parent / "AuthKey.p8").write_text("not a key")
    assert main(["gateway", "--config", str(setup), "--check-config"]) == 2
    assert "AuthKey.p8" in capsys.readouterr().err
