"""The `inri` command: relay daemon, local mesh, demo, device and home-app tools."""

from __future__ import annotations

import argparse
import json
import sys


def _relay(args: argparse.Namespace) -> int:
    from inri.node.config import ConfigError, describe, load_config

    try:
        cfg = load_config(args.config, overrides={"relay": {
            "data_dir": args.data_dir, "api": args.api, "quic": args.quic,
            "bootstrap": tuple(args.bootstrap) if args.bootstrap else None,
            "public_addr": args.public_addr, "profile": args.profile}})
    except ConfigError as exc:
        print(f"inri relay: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(json.dumps(describe(cfg), indent=2))
        print("configuration OK", file=sys.stderr)
        return 0
    import trio

    from inri.common.logs import configure_logging
    from inri.node.relay import StartupError, run_relay, tune_gc

    configure_logging(cfg.relay.log_format, cfg.relay.log_level)
    tune_gc()
    try:
        trio.run(run_relay, cfg)
    except KeyboardInterrupt:
        pass
    except StartupError as exc:  # one line for the operator; non-zero so systemd restarts and reports it
        print(f"inri relay: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"inri relay: {exc}", file=sys.stderr)
        return 1
    return 0


def _mesh(args: argparse.Namespace) -> int:
    from inri.mesh import MeshError, down, up

    try:
        if args.mesh_cmd == "up":
            print(json.dumps(up(args.dir, args.relays, args.bootstraps, timeout_s=args.timeout,
                                link_delay_ms=args.link_delay_ms, link_jitter_ms=args.link_jitter_ms,
                                link_loss=args.link_loss), indent=2))
        else:
            n = down(args.dir)
            print(json.dumps({"stopped": n}))
    except MeshError as exc:
        print(f"inri mesh: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inri", description="INRI: Independent Notification Relay Infrastructure")
    sub = parser.add_subparsers(dest="command", required=True)

    relay = sub.add_parser("relay", help="run a relay (docs/operations.md)")
    relay.add_argument("--config", help="TOML config file (every option: docs/operations.md)")
    relay.add_argument("--data-dir", help="identity, store and traces (default ./inri-data)")
    relay.add_argument("--api", help="HTTP/WebSocket listen HOST:PORT (default 127.0.0.1:8480)")
    relay.add_argument("--quic", help="QUIC listen HOST:PORT for relay links (default 0.0.0.0:4433)")
    relay.add_argument("--public-addr", help="QUIC HOST:PORT announced to peers (default: the --quic address)")
    relay.add_argument("--bootstrap", action="append", metavar="URL", help="bootstrap node URL (repeatable)")
    relay.add_argument("--profile", choices=["default", "test"], help="'test': short timers for loopback tests")
    relay.add_argument("--check-config", action="store_true", help="validate the configuration, print it, exit")

    mesh = sub.add_parser("mesh", help="a local mesh of real relay and bootstrap processes on loopback")
    msub = mesh.add_subparsers(dest="mesh_cmd", required=True)
    mup = msub.add_parser("up", help="start the mesh and print its URLs as JSON")
    mup.add_argument("--relays", type=int, default=6)
    mup.add_argument("--bootstraps", type=int, default=1)
    mup.add_argument("--dir", required=True, help="directory for the processes' data, logs and mesh.json")
    mup.add_argument("--timeout", type=float, default=60.0)
    mup.add_argument("--link-delay-ms", type=float, default=0.0, metavar="MS",
                     help="lab: one-way delay added to every relay-to-relay QUIC datagram (each direction)")
    mup.add_argument("--link-jitter-ms", type=float, default=0.0, metavar="MS",
                     help="lab: +- uniform jitter around --link-delay-ms")
    mup.add_argument("--link-loss", type=float, default=0.0, metavar="SHARE",
                     help="lab: share of relay-to-relay QUIC datagrams dropped, e.g. 0.02 (QUIC retransmits)")
    mdown = msub.add_parser("down", help="stop the mesh started in --dir")
    mdown.add_argument("--dir", required=True)

    demo = sub.add_parser("demo", help="6 relays + a bootstrap: register at R1, push at R6, show the path")
    demo.add_argument("--json", action="store_true", help="print one JSON object (relays, path, delivered, latency_ms)")
    demo.add_argument("--virtual", action="store_true",
                      help="the seed's exact figure, engines in memory on a virtual clock (no processes)")
    demo.add_argument("--keep", metavar="DIR", help="run the mesh in DIR and leave it up afterwards")

    from inri.client.cli import add_commands

    add_commands(sub)
    args = parser.parse_args(argv)
    if args.command == "relay":
        return _relay(args)
    if args.command == "mesh":
        return _mesh(args)
    if args.command == "demo":
        if args.virtual:
            from inri.demo import main as virtual_main

            return virtual_main(as_json=args.json)
        from inri.live_demo import main as demo_main

        return demo_main(as_json=args.json, keep=args.keep)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
