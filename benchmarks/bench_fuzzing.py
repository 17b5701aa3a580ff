"""Fuzz campaign (issue 6): 100,000 decoder cases, 100,000 request heads for the HTTP front's parser against
h11 (fuzz/http_head.py, BENCH_FUZZ_HEAD_CASES), and 10,000 cases each against a live relay's HTTP
API and QUIC port (BENCH_FUZZ_DECODER_CASES, BENCH_FUZZ_LIVE_CASES). Prints what ran, how fast, the
outcomes and every failure; exits 1 on any failure (a crash, an undocumented exception, a 5xx, a
problem without a code, a rejected input that changed the relay's state, a traceback in its log)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # fuzz/ lives beside the package, not in it

from fuzz.campaign import format_report, fuzz_decoders, fuzz_http, fuzz_quic
from fuzz.http_head import fuzz_head_parser
from inri import mesh

SEED = int(os.environ.get("BENCH_FUZZ_SEED", "20261123"))


def main() -> int:
    n_dec = int(os.environ.get("BENCH_FUZZ_DECODER_CASES", "100000"))
    n_live = int(os.environ.get("BENCH_FUZZ_LIVE_CASES", "10000"))
    dec = fuzz_decoders(n_dec, SEED)
    print(format_report("decoders", dec), flush=True)
    heads = fuzz_head_parser(int(os.environ.get("BENCH_FUZZ_HEAD_CASES", "100000")), SEED)
    print(format_report("HTTP head parser vs h11", heads), flush=True)
    with tempfile.TemporaryDirectory() as d:
        info = mesh.up(d, relays=2, bootstraps=1, timeout_s=60, min_neighbours=1)
        try:
            r = info["relays"][0]
            http = trio.run(fuzz_http, r["api"], n_live, SEED)
            print(format_report("http", http), flush=True)
            quic = trio.run(fuzz_quic, r["api"], r["quic"], r["node_id"], n_live, SEED)
            print(format_report("quic + udp", quic), flush=True)
            traceback = "Traceback" in Path(r["log"]).read_text()
        finally:
            mesh.down(d)
    print(f"relay log has a traceback: {traceback}; machine: {os.cpu_count()} cores")
    figures = []
    for name, rep in (("decoders", dec), ("HTTP head parser", heads), ("live http", http),
                      ("live quic+udp", quic)):
        failed = sum(v for k, v in rep.outcomes.items() if k.endswith("FAILED"))
        figures.append({"metric": f"fuzz {name}: cases", "value": rep.total, "unit": "",
                        "ceiling": "failures must be 0",
                        "note": f"{failed} failures, {rep.total / rep.seconds:,.0f} cases/s"})
    print(json.dumps({"bench": "fuzzing", "figures": figures}))
    return 1 if dec.failures or heads.failures or http.failures or quic.failures or traceback else 0


if __name__ == "__main__":
    sys.exit(main())
