"""The `inri` command: relay daemon, local mesh, demo, device and home-app tools."""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from inri.common.docs import DocsHelpFormatter, docs_hint, version_line


def _relay(args: argparse.Namespace) -> int:
    if args.relay_cmd == "init":
        return _relay_init(args)
    if args.relay_cmd in ("backup", "restore"):
        return _relay_backup(args)
    if args.relay_cmd == "rotate-key":
        return _relay_rotate(args)
    from inri.node.config import ConfigError, describe, load_config

    overrides: dict[str, dict[str, object]] = {"relay": {
        "data_dir": args.data_dir, "api": args.api, "quic": args.quic,
        "bootstrap": tuple(args.bootstrap) if args.bootstrap else None,
        "public_addr": args.public_addr, "profile": args.profile}}
    try:
        cfg = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"inri relay: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(json.dumps(describe(cfg), indent=2))
        print("configuration OK", file=sys.stderr)
        return 0
    import trio

    from inri.common.logs import configure_logging
    from inri.node.datadir import DataDirError
    from inri.node.relay import StartupError, run_relay, tune_gc
    from inri.node.reload import config_reloader

    configure_logging(cfg.relay.log_format, cfg.relay.log_level)
    tune_gc()
    try:
        trio.run(partial(run_relay, cfg, on_sighup=[config_reloader(args.config, overrides)]))
    except KeyboardInterrupt:
        pass
    except (StartupError, DataDirError) as exc:  # one line for the operator; non-zero so systemd reports it
        print(f"inri relay: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"inri relay: {exc}", file=sys.stderr)
        return 1
    return 0


def _relay_init(args: argparse.Namespace) -> int:
    """`inri relay init DIR`: config, key, the ports to open and the next command (inri/node/init.py)."""
    from inri.node.init import InitError, init_relay, report

    try:
        made = init_relay(Path(args.dir), {"api": args.api, "quic": args.quic, "public_addr": args.public_addr,
                                           "bootstrap": tuple(args.bootstrap or ()), "geo": args.geo})
    except InitError as exc:
        print(f"inri relay init: {exc}", file=sys.stderr)
        return 1
    print(report(made))
    return 0


def _relay_backup(args: argparse.Namespace) -> int:
    """`inri relay backup` (a consistent copy while the relay runs) and `restore` (inri/node/backup.py)."""
    from inri.node.backup import BackupError, backup, restore
    from inri.node.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, overrides={"relay": {"data_dir": args.data_dir}})
        if args.relay_cmd == "backup":
            made = backup(cfg.data_path, Path(args.out))
        else:
            made = restore(Path(args.source), cfg.data_path)
    except (ConfigError, BackupError) as exc:
        print(f"inri relay {args.relay_cmd}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(made))
    return 0


def _relay_rotate(args: argparse.Namespace) -> int:
    """`inri relay rotate-key`: new identity, the old one withdrawn at the bootstraps (inri/node/rotate.py)."""
    import trio

    from inri.node.config import ConfigError, load_config
    from inri.node.datadir import DataDirError
    from inri.node.rotate import rotate_key

    try:
        cfg = load_config(args.config, overrides={"relay": {"data_dir": args.data_dir}})
        made = trio.run(rotate_key, cfg)
    except (ConfigError, DataDirError) as exc:
        print(f"inri relay rotate-key: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(made))
    return 0


def _health(args: argparse.Namespace) -> int:
    """`inri health --data-dir DIR`: exit 0 when the relay or bootstrap using DIR answers /healthz with 200.

    It reads the URL the daemon wrote into its data directory once it listened (relay.json or
    bootstrap.json), so one check fits both daemons whatever their ports: the container's HEALTHCHECK."""
    import httpx

    for name, key in (("relay.json", "api"), ("bootstrap.json", "bootstrap")):
        ready = Path(args.data_dir) / name
        if ready.is_file():
            try:
                url = str(json.loads(ready.read_text())[key])
                answer = httpx.get(url.rstrip("/") + "/healthz", timeout=args.timeout)
            except (OSError, ValueError, KeyError, httpx.HTTPError) as exc:
                print(f"inri health: {ready}: {exc}", file=sys.stderr)
                return 1
            print(answer.text.strip())
            return 0 if answer.status_code == 200 else 1
    print(f"inri health: no relay.json or bootstrap.json in {args.data_dir}: not started (yet)", file=sys.stderr)
    return 1


def _gateway(args: argparse.Namespace) -> int:
    """`inri gateway`: run the wake-up gateway, or make its key, or seal a device token (docs/gateway.md)."""
    from inri.common.b64url import b64d, b64e

    if args.gateway_cmd == "keygen":
        from inri.gateway.keys import generate_key, public_key

        try:
            key = generate_key(args.out)
        except OSError as exc:
            print(f"inri gateway keygen: {args.out}: {exc.strerror or exc} (an existing key is never replaced: "
                  "apps seal their tokens to it)", file=sys.stderr)
            return 1
        print(json.dumps({"key_file": args.out, "public_key": public_key(key)}))
        return 0
    if args.gateway_cmd == "seal":
        from inri.protocol.wake import seal_wake_token

        try:
            token = seal_wake_token(b64d(args.public_key, "--public-key", 32), args.provider, args.device_token)
        except ValueError as exc:
            print(f"inri gateway seal: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"token": b64e(token)}))
        return 0
    from inri.gateway.config import ConfigError, load_gateway_config

    if not args.config:
        print("inri gateway: --config FILE is required (docs/gateway.md)", file=sys.stderr)
        return 2
    try:
        cfg = load_gateway_config(args.config, overrides={"listen": args.listen})
        from inri.gateway.server import check_credentials

        check_credentials(cfg)
    except (ConfigError, ValueError) as exc:
        print(f"inri gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print("configuration OK", file=sys.stderr)
        return 0
    import trio

    from inri.common.logs import configure_logging
    from inri.gateway.server import run_gateway

    configure_logging(cfg.gateway.log_format, cfg.gateway.log_level)
    try:
        trio.run(run_gateway, cfg)
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"inri gateway: {exc}", file=sys.stderr)
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
    parser = argparse.ArgumentParser(prog="inri", description="INRI: Independent Notification Relay Infrastructure",
                                     epilog=docs_hint(), formatter_class=DocsHelpFormatter)
    parser.add_argument("--version", action="version", version=version_line("inri"))
    sub = parser.add_subparsers(dest="command", required=True)

    relay = sub.add_parser("relay", help="run a relay (docs/operations.md)", epilog=docs_hint(),
                           formatter_class=DocsHelpFormatter)
    rsub = relay.add_subparsers(dest="relay_cmd", metavar="{init,backup,restore,rotate-key}")
    rinit = rsub.add_parser("init", help="write DIR/relay.toml (every key, commented) and DIR/data/node.key",
                            epilog=docs_hint(), formatter_class=DocsHelpFormatter)
    rinit.add_argument("dir", help="the relay's directory (created; an existing relay in it is never replaced)")
    rinit.add_argument("--api", help="HTTP/WebSocket listen HOST:PORT (default 127.0.0.1:8480)")
    rinit.add_argument("--quic", help="QUIC listen HOST:PORT (default 0.0.0.0:4433)")
    rinit.add_argument("--public-addr", help="this host's public QUIC address(es): IP:PORT[,[IPv6]:PORT]")
    rinit.add_argument("--bootstrap", action="append", metavar="URL", help="bootstrap node URL (repeatable)")
    rinit.add_argument("--geo", help='coarse "lat,lon" (one decimal) for proximity ranking')
    rbackup = rsub.add_parser("backup", help="copy the key and a consistent snapshot of the store, relay running "
                              "or not", epilog=docs_hint(), formatter_class=DocsHelpFormatter)
    rbackup.add_argument("--config", help="the relay's TOML config (for its data_dir)")
    rbackup.add_argument("--data-dir", help="the relay's data directory (overrides the config's)")
    rbackup.add_argument("--out", required=True, help="a new directory for the backup (never overwritten)")
    rrestore = rsub.add_parser("restore", help="put a backup back into the data directory (the relay stopped)",
                               epilog=docs_hint(), formatter_class=DocsHelpFormatter)
    rrestore.add_argument("source", help="the backup directory (`inri relay backup --out`)")
    rrestore.add_argument("--config", help="the relay's TOML config (for its data_dir)")
    rrestore.add_argument("--data-dir", help="the relay's data directory (overrides the config's)")
    rrotate = rsub.add_parser("rotate-key", help="new node key; the old identity is withdrawn at the bootstraps "
                              "(the relay stopped)", epilog=docs_hint(), formatter_class=DocsHelpFormatter)
    rrotate.add_argument("--config", help="the relay's TOML config (data_dir, bootstrap, public_addr)")
    rrotate.add_argument("--data-dir", help="the relay's data directory (overrides the config's)")
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

    health = sub.add_parser("health", help="exit 0 when the relay or bootstrap of a data dir answers /healthz 200")
    health.add_argument("--data-dir", required=True, help="the daemon's data directory")
    health.add_argument("--timeout", type=float, default=4.0)

    demo = sub.add_parser("demo", help="6 relays + a bootstrap: register at R1, push at R6, show the path")
    demo.add_argument("--json", action="store_true", help="print one JSON object (relays, path, delivered, latency_ms)")
    demo.add_argument("--virtual", action="store_true",
                      help="the seed's exact figure, engines in memory on a virtual clock (no processes)")
    demo.add_argument("--keep", metavar="DIR", help="run the mesh in DIR and leave it up afterwards")

    gateway = sub.add_parser("gateway", help="the wake-up gateway an app developer runs for APNs/FCM (docs/gateway.md)",
                             epilog=docs_hint("gateway.md"), formatter_class=DocsHelpFormatter)
    gateway.add_argument("--version", action="version", version=version_line("inri gateway"))
    gateway.add_argument("--config", help="gateway TOML file: [gateway], [apns] and/or [fcm]")
    gateway.add_argument("--listen", help="HTTP listen HOST:PORT (overrides [gateway] listen)")
    gateway.add_argument("--check-config", action="store_true", help="validate the file and the keys it names, exit")
    gsub = gateway.add_subparsers(dest="gateway_cmd")
    keygen = gsub.add_parser("keygen", help="make the gateway's sealing key; prints its public half")
    keygen.add_argument("--out", required=True, help="key file to create (mode 0600; never overwritten)")
    seal = gsub.add_parser("seal", help="seal a device token to a gateway key (what the app does on the phone)")
    seal.add_argument("--public-key", required=True, help="the gateway's public key (base64url; GET /v1/key)")
    seal.add_argument("--provider", required=True, choices=["apns", "fcm"])
    seal.add_argument("--device-token", required=True, help="the APNs (hex) or FCM registration token")

    from inri.client.cli import add_commands

    add_commands(sub)
    args = parser.parse_args(argv)
    if args.command == "relay":
        return _relay(args)
    if args.command == "mesh":
        return _mesh(args)
    if args.command == "gateway":
        return _gateway(args)
    if args.command == "health":
        return _health(args)
    if args.command == "demo":
        if args.virtual:
            from inri.demo import main as virtual_main

            return virtual_main(as_json=args.json)
        from inri.live_demo import main as demo_main

        return demo_main(as_json=args.json, keep=args.keep)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
