"""Simulator scale curve (issue 18): the scale-100k scenario's shape (1,000 registrations, 10,000 pushes,
5% churn) at 1k, 10k, 30k and 100k relays: wall time, events/s and peak memory per relay.

Each point runs the real CLI (`inri-sim run`, trace level summary) in its own process, so the peak
memory (the process's max RSS) is that point's alone. A point that runs past its time limit is
stopped, and its figures are those it reached (virtual time, events: read off the progress bar).
Before a point of 30k relays or more, the machine must have BENCH_SCALE_MIN_FREE_GIB free (default 12:
the machine may be shared), or the point is skipped and says so.

BENCH_SCALE_RELAYS: comma-separated sizes (default 1000,10000,30000,100000).
BENCH_SCALE_TIMEOUT_S: time limit per point (default 1800; the 100k point needs hours of CPU).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCENARIO = Path(__file__).resolve().parent.parent / "simulations" / "scenarios" / "scale-100k.toml"


def free_gib() -> float:
    """MemAvailable, GiB (inf where /proc/meminfo is missing)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def scenario_for(relays: int, tmp: Path) -> Path:
    text = SCENARIO.read_text()
    text = re.sub(r"(?m)^relays = \d+$", f"relays = {relays}", text)
    text = re.sub(r'(?m)^name = "scale-100k"$', f'name = "scale-{relays // 1000}k"', text)
    path = tmp / f"scale-{relays}.toml"
    path.write_text(text)
    return path


def run_point(relays: int, timeout_s: float, tmp: Path) -> dict[str, Any]:
    args = [sys.executable, "-m", "simulations.cli", "run", str(scenario_for(relays, tmp)), "--trace-level",
            "summary", "--progress", "on"]
    err_path = tmp / f"err-{relays}.txt"
    with err_path.open("w") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True)
        while True:  # os.wait4, not Popen.wait: it gives this child's own peak memory
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout_s:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.5)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
    finished = proc.returncode == 0
    point: dict[str, Any] = {"relays": relays, "finished": finished, "wall_s": round(wall, 1)}
    peak = usage.ru_maxrss * 1024  # Linux: KiB
    point["peak_rss_gib"] = round(peak / 2**30, 2)
    point["bytes_per_relay"] = round(peak / relays)
    point["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
    if finished:
        s = json.loads(out.strip().splitlines()[-1])
        point.update(events=s["events"], events_per_s=s["events_per_s"], sim_wall_s=s["wall_s"],
                     events_per_cpu_s=round(s["events"] / max(point["cpu_s"], 1e-9), 1),
                     delivery_ratio=s["delivery_ratio"], route_coverage=s["route_coverage"])
    else:
        text = err_path.read_text()
        ev = re.findall(r"([\d,]+) events", text)
        vt = re.findall(r"(\d+)/\d+ sim-s", text)
        if ev:
            events = int(ev[-1].replace(",", ""))
            point.update(events=events, events_per_s=round(events / wall, 1),
                         events_per_cpu_s=round(events / max(point["cpu_s"], 1e-9), 1),
                         reached_sim_s=int(vt[-1]) if vt else None)
    return point


def main() -> None:
    sizes = [int(x) for x in os.environ.get("BENCH_SCALE_RELAYS", "1000,10000,30000,100000").split(",")]
    timeout_s = float(os.environ.get("BENCH_SCALE_TIMEOUT_S", "1800"))
    min_free = float(os.environ.get("BENCH_SCALE_MIN_FREE_GIB", "12"))
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        for relays in sizes:
            if relays >= 30000 and free_gib() < min_free:
                print(f"{relays:>7,} relays: skipped, {free_gib():.1f} GiB free (< {min_free:g})", flush=True)
                continue
            p = run_point(relays, timeout_s, Path(tmp))
            print(f"{relays:>7,} relays: " + " ".join(f"{k}={v}" for k, v in p.items() if k != "relays"), flush=True)
            note = "finished" if p["finished"] else f"stopped at {p.get('reached_sim_s')} sim-s (time limit)"
            figures.append({"metric": f"scale {relays:,} relays events/s", "value": p.get("events_per_s"), "unit": "/s",
                            "ceiling": "aim 200,000/s at 10k", "note": f"wall {p['wall_s']} s, {note}"})
            figures.append({"metric": f"scale {relays:,} relays peak memory per relay", "value": p["bytes_per_relay"],
                            "unit": "B", "note": f"peak RSS {p['peak_rss_gib']} GiB"})
    print(json.dumps({"bench": "scale", "figures": figures}))


if __name__ == "__main__":
    main()
