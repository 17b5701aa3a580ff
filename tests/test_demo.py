"""`inri demo` reproduces the seed's figure through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys


def test_demo_json_shows_the_seed_path_and_a_decrypted_delivery() -> None:
    proc = subprocess.run([sys.executable, "-m", "inri.cli", "demo", "--virtual", "--json"], capture_output=True, text=True,
                          check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["relays"] == 6
    assert out["path"] == ["R6", "R5", "R4", "R2", "R1"]  # R4 cached R2: the first arrival
    assert out["delivered"] is True and out["custody"] == "delivered"
    assert out["message"] == "calendar: new-event"
    assert 0 < out["latency_ms"] < 200


def test_demo_text_names_every_relay() -> None:
    proc = subprocess.run([sys.executable, "-m", "inri.cli", "demo", "--virtual"], capture_output=True, text=True, check=True)
    for relay in ("R1", "R2", "R3", "R4", "R5", "R6"):
        assert f"  {relay}:" in proc.stdout
    assert "R6 -> R5 -> R4 -> R2 -> R1" in proc.stdout
