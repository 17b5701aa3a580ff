"""Issue 42's acceptance runner: scenarios x seeds x loss models, two code versions side by side.

Every run goes through the real CLI (`inri-sim run FILE --seed S --loss-model M --trace-dir T
--trace-level summary`) of each version, one run at a time, the versions alternating case by case, on
the same scenario file (this checkout's, with `[engine] stem` set as `--stem` says: the acceptance is
measured with the stem on). Per run it prints:

- `delivery_ratio`, `pushes_never_delivered`, `pushes_late` (the version's own summary);
- `never_home_up`: pushes never delivered whose home stayed up (`pushes_never_delivered_home_up`,
  docs/metrics.md: no `push_delivered` row, and the home never down from injection to the end);
- `live_home`: `messages_per_delivered_push_live_home`, and `ideal`: the latency-first route's
  push + receipt cost on the run's mesh (`bench_route_ideal.py`), and their ratio (the issue's bars:
  <= 2x at 3% churn, <= 4x at 15%);
- `home_down`: `messages_per_push_home_down` (bar <= 50);
- latency p95 / p99, `stretch_p95` (the version's own summary).

The three home figures are computed from each run's trace by this checkout's collector
(simulations/metrics.py), so a version that predates them is measured by the same definition; for a
version that has them, its own summary must agree (a mismatch is printed). Then, per seed and
version, `inri-sim privacy --stem on` (1,000 relays, 5% colluders): colluders pin the home (bar
<= 0.10), colluders link two route ids (bar <= 0.2), one relay names the home over chance beside the
printed floor of any stem (bar: floor + 0.1x). Last, the worst over seeds of every figure.

Usage: python benchmarks/bench_sparse.py [--acceptance] [--scenarios A,B] [--seeds 1-5]
       [--loss-models quic,drop] [--stem on|off|scenario] [--baseline-dir OTHER_CHECKOUT]
       [--results FILE.jsonl] [--no-privacy] [--privacy-relays 1000] [--privacy-devices 100]
With no arguments (what `make bench` runs): geo-5k-3n-c3l1, seed 1, quic, privacy seed 1 (about 7
minutes on this 2-core machine, 2026-11-29: the run 336 s, `inri-sim privacy` 57 s). Quick mode (the
test's): a small scenario file and `--privacy-relays 120 --privacy-devices 20`, seconds. `--acceptance`:
geo-5k-3n, geo-5k-3n-c3l1, built-5k, built-5k-c3l1, metro-4k and built-3k-world, seeds 1-5, both loss
models: 60 runs a version of 200-1,200 s each here (geo-5k-3n quic 1,141 s, built-5k drop 1,204 s;
6,670 s a seed), about 9 hours a version: run it a seed at a time with `--results`.
`--baseline-dir DIR`: DIR is another checkout whose `.venv` is made (`make venv`); each case runs
there too, and the tables show both. `--results FILE`: each record is appended as it is measured,
and records already in the file are not measured again (a long run can be resumed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from bench_route_ideal import measure as route_ideal  # this directory: the script's own

from simulations.metrics import PUSH_MESSAGE_KINDS, Collector
from simulations.scenario import from_dict

ROOT = Path(__file__).resolve().parent.parent
ACCEPTANCE = ("geo-5k-3n", "geo-5k-3n-c3l1", "built-5k", "built-5k-c3l1", "metro-4k", "built-3k-world")
HOME_KEYS = ("messages_per_delivered_push_live_home", "messages_per_push_home_down", "pushes_never_delivered_home_up")
# The trace rows the home figures read (HomeCosts in simulations/metrics.py; on-time delivery).
_KINDS = ("reg_originated", "push_injected", "push_delivered", "push_excluded", "relay_down", "relay_up",
          *PUSH_MESSAGE_KINDS)
_COLUMNS = ("t", "relay", "kind", "msg", "route", "count", "reason")


@dataclass(frozen=True)
class Version:
    """A checkout and the Python of its venv."""

    label: str
    root: Path
    python: str

    def commit(self) -> str:
        got = subprocess.run(["git", "-C", str(self.root), "describe", "--always", "--dirty"], capture_output=True,
                             text=True)
        return got.stdout.strip() or "unknown"

    def run(self, args: list[str]) -> tuple[str, float]:
        """The CLI's standard output and the wall time. Its code is the checkout's own: run from its root,
        with it first on the path."""
        env = {**os.environ, "PYTHONPATH": str(self.root)}
        t0 = time.perf_counter()
        proc = subprocess.run([self.python, "-m", "simulations.cli", *args], cwd=self.root, env=env,
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{self.label}: inri-sim {' '.join(args)} failed ({proc.returncode}): "
                               f"{proc.stderr.strip()[-2000:]}")
        return proc.stdout, wall


def last_json(out: str) -> dict[str, Any]:
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return got


def scenario_text(name: str) -> str:
    """A scenario by path, or by name from this checkout's simulations/scenarios/."""
    path = Path(name)
    if not path.exists():
        path = ROOT / "simulations" / "scenarios" / (name.removesuffix(".toml") + ".toml")
    return path.read_text(encoding="utf-8")


def with_stem(text: str, stem: bool) -> str:
    """The scenario with `[engine] stem` set. An edit of the text (the standard library reads TOML but
    does not write it), checked by parsing the result: comments and layout stay as they were."""
    lines = text.splitlines()
    engine = next((i for i, ln in enumerate(lines) if re.fullmatch(r"\s*\[engine\]\s*(#.*)?", ln)), None)
    value = "true" if stem else "false"
    if engine is None:
        lines += ["", "[engine]", f"stem = {value}"]
    else:
        end = next((i for i in range(engine + 1, len(lines)) if re.match(r"\s*\[", lines[i])), len(lines))
        own = [i for i in range(engine + 1, end) if re.match(r"\s*stem\s*=", lines[i])]
        if own:
            lines[own[0]] = f"stem = {value}"
        else:
            lines.insert(engine + 1, f"stem = {value}")
    out = "\n".join(lines) + "\n"
    assert tomllib.loads(out)["engine"]["stem"] is stem
    return out


def _trace_rows(path: Path) -> Iterator[tuple[Any, ...]]:
    """The rows of an events.parquet that the home figures read, in file order, in trace column order."""
    wanted = pc.field("kind").isin(list(_KINDS))
    for batch in pq.ParquetFile(path).iter_batches(batch_size=200_000, columns=list(_COLUMNS)):
        batch = batch.filter(wanted)
        cols = [batch.column(c).to_pylist() for c in _COLUMNS]
        for t, relay, kind, msg, route, count, reason in zip(*cols, strict=True):
            yield (t, relay, kind, msg, route, None, None, None, None, count, None, reason)


def home_figures(trace_dir: Path) -> dict[str, object]:
    """The three home figures of a run, from its trace (summary level) and meta.json."""
    meta = json.loads((trace_dir / "meta.json").read_text())
    c = Collector(int(meta["relays"]), float(meta["deadline_s"]), float(meta["coverage_after_s"]))
    c.add_all(_trace_rows(trace_dir / "events.parquet"))
    return c.home_cost_summary()


class Ideal:
    """bench_route_ideal's latency-first push + receipt cost, once per mesh (topology, membership, seed)."""

    def __init__(self) -> None:
        self.cache: dict[tuple[str, int], float] = {}

    def cost(self, text: str, seed: int) -> float:
        sc = from_dict(tomllib.loads(text))
        key = (repr((sc.topology, sc.engine.active_min, sc.engine.active_max)), seed)
        if key not in self.cache:
            row = route_ideal(sc, seed)[0]
            value = row["messages_push_and_receipt"]
            assert isinstance(value, float)
            self.cache[key] = value
        return self.cache[key]


def parse_seeds(spec: str) -> list[int]:
    """'1-5' or '1,3,5' or '2'."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


class Results:
    """Records measured so far (and appended to --results, when given)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.records: dict[str, dict[str, Any]] = {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    self.records[rec["key"]] = rec

    def get(self, key: str) -> dict[str, Any] | None:
        return self.records.get(key)

    def add(self, rec: dict[str, Any]) -> None:
        self.records[rec["key"]] = rec
        if self.path is not None:
            with self.path.open("a") as fh:
                fh.write(json.dumps(rec, sort_keys=True) + "\n")


def measure_run(v: Version, name: str, text: str, seed: int, model: str, stem: str, ideal: Ideal,
                work: Path) -> dict[str, Any]:
    """One scenario run of one version, with its home figures from the trace."""
    scenario = work / f"{name}.toml"
    scenario.write_text(text)
    trace = work / f"trace-{v.label}"
    out, wall = v.run(["run", str(scenario), "--seed", str(seed), "--loss-model", model, "--trace-dir", str(trace),
                       "--trace-level", "summary", "--progress", "off"])
    s = last_json(out)
    figures = home_figures(trace)
    mismatch = {k: (s[k], figures[k]) for k in HOME_KEYS if k in s and s[k] != figures[k]}
    subprocess.run(["rm", "-rf", str(trace)], check=True)
    fail = float(tomllib.loads(text).get("churn", {}).get("fail_fraction", 0.0))
    best = ideal.cost(text, seed)
    live = figures["messages_per_delivered_push_live_home"]
    return {
        "kind": "run", "version": v.label, "commit": v.commit(), "scenario": name, "seed": seed, "loss_model": model,
        "stem": stem, "fail_fraction": fail, "wall_s": round(wall, 1),
        **{k: s.get(k) for k in ("delivery_ratio", "pushes", "pushes_counted", "pushes_never_delivered",
                                  "pushes_late", "loss_by_reason", "messages_per_delivered_push", "latency_p50_s",
                                  "latency_p95_s", "latency_p99_s", "stretch_median", "stretch_p95",
                                  "path_stretch_p95", "events")},
        **figures,
        "ideal_latency_first": best,
        "live_home_over_ideal": round(live / best, 2) if isinstance(live, float) and best else None,
        "summary_mismatch": mismatch or None,
    }


def measure_privacy(v: Version, seed: int, stem: str, relays: int, devices: int) -> dict[str, Any]:
    """`inri-sim privacy` with 5% colluders (the acceptance's size: 1,000 relays, 100 devices)."""
    out, wall = v.run(["privacy", "--stem", stem, "--seed", str(seed), "--relays", str(relays), "--devices",
                       str(devices)])
    p = last_json(out)
    chance = p["single_relay_chance_home"]
    return {
        "kind": "privacy", "version": v.label, "commit": v.commit(), "seed": seed, "stem": stem,
        "relays": relays, "devices": devices, "wall_s": round(wall, 1),
        "colluders_home_exact": p["colluders_home_exact"], "colluders_epoch_link": p["colluders_epoch_link"],
        "single_relay_x": round(p["single_relay_home_guess"] / chance, 3),
        "floor_x": round(p["single_relay_floor"] / chance, 3),
    }


def _f(x: object, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec) if isinstance(x, (int, float)) else str(x)


RUN_HEAD = ("| version | scenario | seed | loss | delivery | never (home up) | late | msgs/push (live home) | ideal "
            "| ratio | msgs/push home down | latency p95 / p99 | stretch p95 | wall |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def run_row(r: dict[str, Any]) -> str:
    return (f"| {r['version']} | {r['scenario']} | {r['seed']} | {r['loss_model']} | {_f(r['delivery_ratio'], '.4f')} "
            f"| {_f(r['pushes_never_delivered'])} ({_f(r['pushes_never_delivered_home_up'])}) | {_f(r['pushes_late'])} "
            f"| {_f(r['messages_per_delivered_push'], '.1f')} "
            f"({_f(r['messages_per_delivered_push_live_home'], '.1f')}) "
            f"| {_f(r['ideal_latency_first'], '.1f')} | {_f(r['live_home_over_ideal'], '.2f')} "
            f"| {_f(r['messages_per_push_home_down'], '.1f')} "
            f"| {_f(r['latency_p95_s'], '.3g')} / {_f(r['latency_p99_s'], '.3g')} s | {_f(r['stretch_p95'], '.3g')} "
            f"| {r['wall_s']:.0f} s |" + (f" MISMATCH {r['summary_mismatch']}" if r.get("summary_mismatch") else ""))


PRIV_HEAD = ("| version | seed | stem | colluders pin the home (<= 0.10) | colluders link route ids (<= 0.2) "
             "| one relay / chance | floor / chance (bar: floor + 0.1) | wall |\n|---|---|---|---|---|---|---|---|")


def priv_row(r: dict[str, Any]) -> str:
    return (f"| {r['version']} | {r['seed']} | {r['stem']} | {r['colluders_home_exact']} | {r['colluders_epoch_link']} "
            f"| {r['single_relay_x']}x | {r['floor_x']}x | {r['wall_s']:.0f} s |")


def _worst(vals: list[Any], high: bool) -> Any:
    got = [v for v in vals if v is not None]
    if not got:
        return None
    return max(got) if high else min(got)


def worst_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (version, scenario, loss model): the worst of each figure over the seeds."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["version"], r["scenario"], r["loss_model"]), []).append(r)
    out = []
    for (version, scenario, model), rs in groups.items():
        w: dict[str, Any] = {"version": version, "scenario": scenario, "loss_model": model, "fail_fraction":
                             rs[0]["fail_fraction"], "seed": ",".join(str(r["seed"]) for r in sorted(rs, key=lambda r:
                                                                                                    r["seed"]))}
        w["delivery_ratio"] = _worst([r["delivery_ratio"] for r in rs], False)
        for k in ("pushes_never_delivered", "pushes_never_delivered_home_up", "pushes_late",
                  "messages_per_delivered_push", "messages_per_delivered_push_live_home", "live_home_over_ideal",
                  "messages_per_push_home_down", "latency_p95_s", "latency_p99_s", "stretch_p95", "wall_s",
                  "ideal_latency_first"):
            w[k] = _worst([r[k] for r in rs], True)
        w["summary_mismatch"] = None
        out.append(w)
    return out


def bars(w: dict[str, Any]) -> list[tuple[str, object, str]]:
    """The issue's bars for a worst-over-seeds row: (figure, value, bar)."""
    mild = w["fail_fraction"] <= 0.03
    out: list[tuple[str, object, str]] = [
        ("delivery_ratio (worst)", w["delivery_ratio"], ">= 0.999"),
        ("pushes never delivered, home up (worst)", w["pushes_never_delivered_home_up"], "0"),
        ("msgs/delivered push, live home / ideal (worst)", w["live_home_over_ideal"], "<= 2x" if mild else "<= 4x"),
        ("msgs per push while its home is down (worst)", w["messages_per_push_home_down"], "<= 50"),
    ]
    if w["loss_model"] == "quic":
        out.append(("latency p99 (worst)", w["latency_p99_s"], "<= 2 s") if mild
                   else ("latency p95 (worst)", w["latency_p95_s"], "<= 2.5 s"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--acceptance", action="store_true", help="issue 42's set: " + ", ".join(ACCEPTANCE) +
                    "; seeds 1-5; quic and drop (each flag below still overrides)")
    ap.add_argument("--scenarios", help="comma-separated scenario names or files (default geo-5k-3n-c3l1)")
    ap.add_argument("--seeds", help="e.g. 1-5 or 1,3 (default 1)")
    ap.add_argument("--loss-models", help="comma-separated: quic, drop (default quic)")
    ap.add_argument("--stem", choices=("on", "off", "scenario"), default="on",
                    help="[engine] stem for every run (scenario: as the file says); privacy runs on unless off")
    ap.add_argument("--baseline-dir", type=Path, help="another checkout (with .venv) to run side by side")
    ap.add_argument("--baseline-python", help="its Python (default BASELINE_DIR/.venv/bin/python)")
    ap.add_argument("--results", type=Path, help="append records here; skip what it already holds")
    ap.add_argument("--no-privacy", action="store_true", help="skip the inri-sim privacy runs")
    ap.add_argument("--privacy-relays", type=int, default=1000, help="inri-sim privacy --relays (default 1000)")
    ap.add_argument("--privacy-devices", type=int, default=100, help="inri-sim privacy --devices (default 100)")
    args = ap.parse_args()
    scenarios = (args.scenarios or (",".join(ACCEPTANCE) if args.acceptance else "geo-5k-3n-c3l1")).split(",")
    try:
        seeds = parse_seeds(args.seeds or ("1-5" if args.acceptance else "1"))
    except ValueError:
        ap.error(f"--seeds {args.seeds!r}: give seeds as 1-5 or 1,3,5")
    models = (args.loss_models or ("quic,drop" if args.acceptance else "quic")).split(",")
    versions = []
    if args.baseline_dir is not None:
        base = args.baseline_dir.resolve()
        if not (base / "simulations" / "cli.py").is_file():
            ap.error(f"--baseline-dir {base}: not a checkout of this project (no simulations/cli.py)")
        python = args.baseline_python or str(base / ".venv" / "bin" / "python")
        if not args.results and not Path(python).is_file():
            ap.error(f"--baseline-dir {base}: no {python} (make venv there, or give --baseline-python)")
        versions.append(Version("baseline", base, python))
    versions.append(Version("this", ROOT, sys.executable))
    results = Results(args.results)
    ideal = Ideal()
    runs: list[dict[str, Any]] = []
    print(f"{len(scenarios)} scenarios x {len(seeds)} seeds x {len(models)} loss models x {len(versions)} versions "
          f"({', '.join(f'{v.label} {v.commit()}' for v in versions)}), stem {args.stem}", flush=True)
    print(RUN_HEAD, flush=True)
    with tempfile.TemporaryDirectory(prefix="inri-sparse-") as tmp:
        work = Path(tmp)
        k = 0
        for name in scenarios:
            text = scenario_text(name)
            if args.stem != "scenario":
                text = with_stem(text, args.stem == "on")
            label = Path(name).stem
            for seed in seeds:
                for model in models:
                    k += 1
                    # the versions alternate which goes first, so neither always runs on a warmer machine
                    for v in versions if k % 2 else versions[::-1]:
                        key = json.dumps(["run", v.label, v.commit(), label, seed, model, args.stem])
                        rec = results.get(key)
                        if rec is None:
                            rec = {"key": key, **measure_run(v, label, text, seed, model, args.stem, ideal, work)}
                            results.add(rec)
                        runs.append(rec)
                        print(run_row(rec), flush=True)
    privacy: list[dict[str, Any]] = []
    if not args.no_privacy:
        stem = "off" if args.stem == "off" else "on"
        print("\n" + PRIV_HEAD, flush=True)
        for seed in seeds:
            for v in versions:
                key = json.dumps(["privacy", v.label, v.commit(), seed, stem, args.privacy_relays,
                                  args.privacy_devices])
                rec = results.get(key)
                if rec is None:
                    rec = {"key": key, **measure_privacy(v, seed, stem, args.privacy_relays, args.privacy_devices)}
                    results.add(rec)
                privacy.append(rec)
                print(priv_row(rec), flush=True)
    worst = worst_rows(runs)
    print("\nWorst over seeds:\n" + RUN_HEAD.replace("| seed |", "| seeds |"))
    for w in worst:
        print(run_row(w))
    figures: list[dict[str, object]] = []
    for w in worst:
        if w["version"] != "this":
            continue
        other = next((b for b in worst if b["version"] == "baseline" and b["scenario"] == w["scenario"]
                      and b["loss_model"] == w["loss_model"]), None)
        for (metric, value, bar), theirs in zip(bars(w), bars(other) if other else [None] * 5, strict=False):
            if isinstance(value, float):
                value = round(value, 4)
            fig: dict[str, object] = {"metric": f"{w['scenario']} {w['loss_model']}: {metric}", "value": value,
                                      "unit": "", "ceiling": bar, "note": f"seeds {w['seed']}"}
            if theirs is not None:
                fig["baseline"] = round(theirs[1], 4) if isinstance(theirs[1], float) else theirs[1]
                fig["note"] = f"seeds {w['seed']}; baseline {fig['baseline']}"
            figures.append(fig)
    for v in versions:
        mine = [p for p in privacy if p["version"] == v.label]
        if mine:
            over = max(p["single_relay_x"] - p["floor_x"] for p in mine)
            print(f"privacy worst ({v.label}, seeds {','.join(str(p['seed']) for p in mine)}): colluders pin the home "
                  f"{max(p['colluders_home_exact'] for p in mine)}, link route ids "
                  f"{max(p['colluders_epoch_link'] for p in mine)}, one relay over its floor +{over:.3f}x")
            if v.label == "this":
                figures += [
                    {"metric": "privacy: colluders pin the home (worst)", "value":
                     max(p["colluders_home_exact"] for p in mine), "unit": "share", "ceiling": 0.10},
                    {"metric": "privacy: colluders link route ids (worst)", "value":
                     max(p["colluders_epoch_link"] for p in mine), "unit": "P", "ceiling": 0.2},
                    {"metric": "privacy: one relay over the floor of any stem (worst)", "value": round(over, 3),
                     "unit": "x chance", "ceiling": 0.1}]
    print(json.dumps({"bench": "sparse", "figures": figures}))


if __name__ == "__main__":
    main()
