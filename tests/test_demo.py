"""`inri demo`: real processes (the README's main job) and the seed's exact figure (--virtual)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _inri(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inri.cli", *args], capture_output=True, text=True, check=True,
                          timeout=timeout)


@pytest.mark.integration
def test_live_demo_delivers_over_real_processes() -> None:
    out = json.loads(_inri("demo", "--json").stdout.strip().splitlines()[-1])
    assert out["relays"] == 6 and out["bootstraps"] == 1
    assert out["delivered"] is True and out["custody_status"] == "delivered"
    assert out["message"] == "calendar: new-event"
    assert out["path"][0] == "R6" and out["path"][-1] == "R1"
    assert len(out["path"]) == out["hops"] + 1  # the trace path agrees with the receipt's hop count
    for a, b in zip(out["path"], out["path"][1:], strict=False):
        assert f"{min(a, b)}-{max(a, b)}" in out["links"]  # every hop is a real link of the mesh
    assert 0 < out["latency_ms"] < 10_000


@pytest.mark.integration
def test_virtual_demo_shows_the_seed_path_and_a_decrypted_delivery() -> None:
    out = json.loads(_inri("demo", "--virtual", "--json").stdout.strip().splitlines()[-1])
    assert out["relays"] == 6
    assert out["path"] == ["R6", "R5", "R4", "R2", "R1"]  # R4 cached R2: the first arrival
    assert out["delivered"] is True and out["custody"] == "delivered"
    assert out["message"] == "calendar: new-event"
    assert 0 < out["latency_ms"] < 200


@pytest.mark.integration
def test_virtual_demo_text_names_every_relay() -> None:
    text = _inri("demo", "--virtual").stdout
    for relay in ("R1", "R2", "R3", "R4", "R5", "R6"):
        assert f"  {relay}:" in text
    assert "R6 -> R5 -> R4 -> R2 -> R1" in text
