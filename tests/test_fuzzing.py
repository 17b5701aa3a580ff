"""The fuzz campaign (inri.fuzzing) with its short CI profile; `make bench` runs 100,000 decoder cases
and 10,000 live ones (benchmarks/bench_fuzzing.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inri import mesh
from inri.fuzzing import format_report, fuzz_decoders, fuzz_http, fuzz_quic


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("fuzzlab")
    info = mesh.up(d, relays=2, bootstraps=1, timeout_s=60, min_neighbours=1)
    try:
        yield info
    finally:
        mesh.down(d)


def test_every_decoder_raises_only_its_documented_error() -> None:
    report = fuzz_decoders(3000, seed=11)
    assert not report.failures, format_report("decoders", report)
    assert len(report.cases) >= 10 and report.total == 3000
    # The mutations reach both sides: some inputs decode, most are refused.
    for target in ("codec.decode", "peer_record.decode_record", "scenario.from_dict"):
        assert report.outcomes[f"{target}: accepted"] > 0
        assert sum(v for k, v in report.outcomes.items() if k.startswith(f"{target}: rejected")) > 0


def test_the_campaign_reports_a_decoder_that_raises_the_wrong_error() -> None:
    def broken(data: bytes) -> object:
        if len(data) % 3 == 0:
            raise KeyError("oops")
        return None

    report = fuzz_decoders(200, seed=1, extra={"broken": (broken, (ValueError,), "bytes", [b"\x93\x01\x02\x03"])})
    assert report.outcomes["broken: FAILED"] > 0
    assert any("KeyError" in f for f in report.failures)


async def test_a_live_relay_api_and_quic_port_survive_fuzzing(lab: dict[str, Any]) -> None:
    r = lab["relays"][0]
    http = await fuzz_http(r["api"], 300, seed=5)
    assert not http.failures, format_report("http", http)
    assert http.cases["http"] == 300 and any(k.startswith("http: rejected 422") for k in http.outcomes)
    quic = await fuzz_quic(r["api"], r["quic"], r["node_id"], 150, seed=5)
    assert not quic.failures, format_report("quic", quic)
    assert quic.outcomes["quic: rejected with error frame"] > 50
    assert "Traceback" not in Path(r["log"]).read_text()
