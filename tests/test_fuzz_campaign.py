"""The fuzz campaign of benchmarks/bench_fuzz.py: a short profile through its command line (2,000 decoder
cases, 300 live ones against a lab relay), and proof that its checkers fail what they must fail."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from inri import mesh

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "bench_fuzz.py"


def _bench() -> ModuleType:
    """benchmarks/ is not a package: load the campaign module from its file."""
    if "bench_fuzz" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_fuzz", BENCH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_fuzz"] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules["bench_fuzz"]


@pytest.mark.integration
def test_a_short_campaign_finds_no_crash(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    env = {**os.environ, "BENCH_FUZZ_DECODER_CASES": "2000", "BENCH_FUZZ_LIVE_CASES": "300",
           "BENCH_FUZZ_SEED": "7", "BENCH_FUZZ_LAB_DIR": str(lab)}
    try:
        proc = subprocess.run([sys.executable, str(BENCH)], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=240)
    finally:
        if (lab / mesh.MESH_FILE).exists():  # the campaign was killed before it stopped its lab
            mesh.down(lab)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-3000:]
    figures = {f["metric"]: f["value"] for f in json.loads(proc.stdout.strip().splitlines()[-1])["figures"]}
    assert figures["fuzz decoders: cases"] == 2000 and figures["fuzz live: cases"] == 300
    assert figures["fuzz decoders: crashes"] == 0 and figures["fuzz live: crashes"] == 0
    for target in ("codec.decode[PUSH]", "peer_record.decode_record+verify", "bootstrap._sync_from",
                   "credential.PushCredential.from_json", "http POST /v1/push", "http GET /openapi.json",
                   "ws /v1/devices/{device_id}/stream", "quic link (auth, framing)", "udp datagram"):
        assert f"\n{target} " in proc.stdout, f"{target} not fuzzed"
    assert "\nquic frame " in proc.stdout


def test_the_checker_reports_a_decoder_that_raises_an_undocumented_error() -> None:
    bench = _bench()

    def broken(data: bytes) -> object:
        if len(data) % 2:
            raise KeyError("undocumented")
        return None

    seeds = (b"\x93\x01\x02\x03", b"\x92\xa1a\xc4\x02ab")
    tally = bench.run_decoders(300, 3, extra={"broken": bench.Decoder(broken, (ValueError,), "msgpack", seeds)})
    assert tally.crashes["broken"] > 0
    assert all(target == "broken" for target in tally.crashes)  # every real decoder still passes
    failure = next(f for f in tally.failures if f.target == "broken")
    assert "KeyError" in failure.what and failure.data.startswith("hex:") and not failure.known
    assert bench.exit_status(tally) == 1
    assert "broken" in bench.table(tally, "decoders")


def test_a_known_finding_is_excluded_but_another_failure_on_its_target_is_not() -> None:
    bench = _bench()
    known = (bench.KnownFinding("FX", r"^t$", r"RecursionError", "a reported bug"),)
    tally = bench.Tally(known_findings=known)
    tally.fail("t", "deep", "raised RecursionError: too deep", b"[[[")
    assert tally.crash_count == 0 and tally.known["t"]["FX"] == 1 and bench.exit_status(tally) == 0
    tally.fail("t", "bytes", "raised KeyError: 'x'", b"\x00")
    assert tally.crash_count == 1 and bench.exit_status(tally) == 1


def test_the_http_checker_fails_5xx_bare_4xx_and_undocumented_codes() -> None:
    bench = _bench()
    codes = bench._documented_problem_codes()
    assert codes["invalid_field"] == 422 and codes["rate_limited"] == 429
    problem = {"content-type": "application/problem+json"}

    def body(code: str, status: int) -> bytes:
        return json.dumps({"code": code, "status": status}).encode()

    assert bench.classify_http(422, problem, body("invalid_field", 422), codes) == ("422 invalid_field", None)
    assert bench.classify_http(202, {"content-type": "application/json"}, b"{}", codes)[1] is None
    assert bench.classify_http(500, problem, body("internal", 500), codes)[1] is not None
    assert bench.classify_http(404, {"content-type": "text/html"}, b"<h1>no</h1>", codes)[1] is not None
    assert bench.classify_http(404, problem, body("no_such_code", 404), codes)[1] is not None
    assert bench.classify_http(404, problem, body("invalid_field", 422), codes)[1] is not None  # wrong status
    assert "server-level" in (bench.classify_http(431, {}, b"", codes)[1] or "")
