"""The `inri` command."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inri", description="INRI: Independent Notification Relay Infrastructure")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the seed's six-relay figure: register at R1, push at R6, show the path")
    demo.add_argument("--json", action="store_true", help="print one JSON object (relays, path, delivered, latency_ms)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from inri.demo import main as demo_main

        return demo_main(as_json=args.json)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
