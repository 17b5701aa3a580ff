"""`inri-sim run SCENARIO.toml [--trace-dir DIR] [--seed N] [--trace-level L] [--unsigned-receipts]
[--loss-model drop|quic]`.

The LAST line of standard output is the run's summary as one JSON object (docs/metrics.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from simulations.extras import INSTALL_HINT, MissingExtra
from simulations.scenario import ScenarioError, load, parse_level


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inri-sim", description="Simulate an INRI mesh running the shipped engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one scenario and print its summary as JSON (last line)")
    run.add_argument("scenario", help="a scenario TOML file, or a name from simulations/scenarios/")
    run.add_argument("--trace-dir", type=Path, help="write the trace (events, meta.json, topology.csv) here")
    run.add_argument("--seed", type=int, help="override the scenario's seed")
    run.add_argument("--trace-level", help="off | summary | full (default: the scenario's)")
    run.add_argument("--trace-format", default="parquet", choices=("parquet", "jsonl"))
    run.add_argument("--no-adversaries", action="store_true",
                     help="hostile relays behave honestly and spammers stay silent: the comparison run")
    run.add_argument("--unsigned-receipts", action="store_true",
                     help="relays believe any receipt ([engine] receipt_signatures = false): the comparison run")
    run.add_argument("--loss-model", choices=("drop", "quic"),
                     help="override the scenario's [network] loss_model (drop: a lost frame is gone; quic: "
                          "retransmitted one probe timeout later on a live link)")
    run.add_argument("--gossip-scheme", choices=("flood", "tree"),
                     help="override the scenario's [engine] gossip_scheme: the side-by-side comparison run")
    run.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                     help="progress bar on stderr (auto: when stderr is a terminal)")
    priv = sub.add_parser("privacy", help="measure linkability (home relay, key rotations) against chance")
    priv.add_argument("--relays", type=int, default=1000)
    priv.add_argument("--devices", type=int, default=100)
    priv.add_argument("--colluders", type=float, default=0.05, help="share of colluding relays (default 0.05)")
    priv.add_argument("--seed", type=int, default=1)
    priv.add_argument("--stem", choices=("on", "off", "both"), default="both",
                      help="the stem phase ([engine] stem): on, off, or both side by side (default)")
    args = parser.parse_args(argv)
    try:
        # Imported here: the simulator needs the sim extra, and a missing module gets one line, not a traceback.
        from simulations.privacy import main as privacy_main
        from simulations.sim import Simulator, summary_line
    except ImportError as exc:
        print(f"inri-sim: {exc.name or exc} is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    if args.command == "privacy":
        try:
            return privacy_main([f"--relays={args.relays}", f"--devices={args.devices}",
                                 f"--colluders={args.colluders}", f"--seed={args.seed}", f"--stem={args.stem}"])
        except MissingExtra as exc:
            print(f"inri-sim: {exc}", file=sys.stderr)
            return 2
    try:
        scenario = load(args.scenario)
        level = parse_level(args.trace_level) if args.trace_level else None
    except ScenarioError as exc:
        print(f"inri-sim: {exc}", file=sys.stderr)
        return 2
    if args.unsigned_receipts:
        scenario = dataclasses.replace(scenario, engine=dataclasses.replace(scenario.engine, receipt_signatures=False))
    if args.loss_model:
        scenario = dataclasses.replace(scenario, loss_model=args.loss_model)
    if args.gossip_scheme:
        scenario = dataclasses.replace(scenario, engine=dataclasses.replace(scenario.engine,
                                                                            gossip_scheme=args.gossip_scheme))
    progress = args.progress == "on" or (args.progress == "auto" and sys.stderr.isatty())
    try:
        sim = Simulator(scenario, seed=args.seed, trace_dir=args.trace_dir, trace_level=level,
                        trace_format=args.trace_format, progress=progress, adversaries=not args.no_adversaries)
    except MissingExtra as exc:
        print(f"inri-sim: {exc}", file=sys.stderr)
        return 2
    n = sim.net.n
    degrees = ", ".join(f"{c} of degree {d}" for d, c in sim.net.degrees().items())
    print(f"inri-sim: {scenario.name}: {n} relays, {len(sim.net.undirected_edges())} links ({degrees}), "
          f"seed {sim.seed}", file=sys.stderr)
    result = sim.run()
    print(summary_line(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
