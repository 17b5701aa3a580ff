"""Run every benchmark in benchmarks/ and print one table of their figures.

Each benchmark is a script `bench_*.py` that prints human-readable figures and, as its LAST line, may
print one JSON object `{"bench": NAME, "figures": [{"metric", "value", "unit", "ceiling"?, "note"?}]}`.
This runner collects those lines into one table. Benchmarks never gate anything: a failing benchmark
is reported in the table and the runner still exits 0 (timings on shared machines are noisy; quote
medians and ratios measured side by side in one run).

Usage: python benchmarks/run_all.py [NAME_SUBSTRING ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                got: dict[str, Any] = json.loads(line)
                return got
            except json.JSONDecodeError:
                return None
    return None


def main(argv: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if argv:
        scripts = [s for s in scripts if any(a in s.stem for a in argv)]
    rows: list[tuple[str, str, str, str, str]] = []
    env = dict(os.environ)
    env.setdefault("HYPOTHESIS_PROFILE", "full")
    for script in scripts:
        print(f"== {script.stem}", flush=True)
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(script)], env=env, cwd=HERE.parent, capture_output=True, text=True
        )
        wall = time.perf_counter() - started
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            sys.stdout.write(proc.stderr[-3000:])
            rows.append((script.stem, "FAILED", f"exit {proc.returncode}", "", f"{wall:.0f} s"))
            continue
        result = _last_json(proc.stdout)
        if not result:
            rows.append((script.stem, "(see output)", "", "", f"{wall:.0f} s"))
            continue
        for fig in result.get("figures", []):
            value = fig.get("value")
            shown = f"{value:,.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else f"{value}"
            rows.append(
                (
                    result.get("bench", script.stem),
                    str(fig.get("metric", "")),
                    f"{shown} {fig.get('unit', '')}".strip(),
                    str(fig.get("ceiling", fig.get("baseline", ""))),
                    str(fig.get("note", "")),
                )
            )
    headers = ("benchmark", "metric", "value", "ceiling / baseline (same run)", "note")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
