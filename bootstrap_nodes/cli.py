"""`inri-bootstrap serve [--listen HOST:PORT | --listen-fd N] [--data-dir DIR] [--config FILE]` and
`check-config`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import stat
import sys
from dataclasses import asdict

import structlog
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve as hyper_serve

from bootstrap_nodes.config import BootstrapConfig, ConfigError, load_bootstrap_config
from bootstrap_nodes.service import Bootstrap, BootstrapApp
from inri.common.addr import format_addr, parse_addr
from inri.common.identity import NodeIdentity
from inri.common.logs import configure_logging
from inri.node.quic import probe

log = structlog.get_logger("inri.bootstrap")


def check_listen_fd(fd: int) -> None:
    """ValueError unless fd is an open TCP (stream) socket: what `--listen-fd` must be handed."""
    try:
        is_socket = stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError as exc:
        raise ValueError(f"--listen-fd {fd}: {exc.strerror}") from None
    if not is_socket:
        raise ValueError(f"--listen-fd {fd}: not a socket")
    with socket.socket(fileno=os.dup(fd)) as sock:  # a duplicate: closing it leaves fd open
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            raise ValueError(f"--listen-fd {fd}: not a TCP socket")


async def serve(cfg: BootstrapConfig, listen_fd: int | None = None) -> None:
    """Run a bootstrap node until SIGINT/SIGTERM, on cfg.listen or on the inherited socket listen_fd."""
    # The probe's own key is throwaway: it proves nothing about us, it only asks the relay to prove itself.
    prober_id = NodeIdentity.generate()

    async def prober(addr: str, node_id: str) -> bool:
        return await probe(prober_id, addr, node_id, timeout_s=cfg.probe_timeout_s)

    boot = Bootstrap(cfg, prober)
    app = BootstrapApp(boot)
    hc = HyperConfig()
    if listen_fd is not None:
        # Bound by whoever started us (a supervisor's socket activation, a test that must know every
        # bootstrap's URL before any starts): hypercorn serves it as is and listens on it.
        hc.bind = [f"fd://{listen_fd}"]
    else:
        host, port = parse_addr(cfg.listen)
        hc.bind = [format_addr(host, port)]
    hc.accesslog = None
    hc.graceful_timeout = 3.0
    hc.include_server_header = False
    shutdown = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(lambda task_status: hyper_serve(app, hc, shutdown_trigger=shutdown.wait,  # type: ignore[arg-type]
                                                                        task_status=task_status))
            nursery.start_soon(boot.sweep_loop)
            if cfg.peers:
                nursery.start_soon(boot.sync_loop)
            url = binds[0] if binds else f"http://{cfg.listen}"
            log.info("bootstrap ready", url=url, records=len(boot.store.entries), peers=list(cfg.peers))
            print(json.dumps({"bootstrap": url}), flush=True)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            log.info("bootstrap stopping")
            shutdown.set()
            with trio.move_on_after(4):
                while any("hyper" in t.name or "lambda" in t.name for t in nursery.child_tasks):
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    finally:
        boot.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inri-bootstrap", description="INRI bootstrap node (antediluvian)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, help_ in (("serve", "run a bootstrap node"), ("check-config", "validate a config file and print it")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--listen", help="HTTP listen HOST:PORT (default 0.0.0.0:8470)")
        p.add_argument("--data-dir", help="where records are stored (default ./bootstrap-data)")
        p.add_argument("--config", help="TOML file with a [bootstrap] table (docs/operations.md)")
        p.add_argument("--peer", action="append", help="another bootstrap's URL to sync records with (repeatable)")
        p.add_argument("--allow-private", action="store_true", default=None,
                       help="accept loopback/private addresses (local meshes and tests)")
        if name == "serve":
            p.add_argument("--listen-fd", type=int, metavar="N",
                           help="serve on an inherited, bound TCP socket (file descriptor N) instead of binding "
                                "--listen (docs/operations.md)")
    args = ap.parse_args(argv)
    try:
        cfg = load_bootstrap_config(args.config, overrides={
            "listen": args.listen, "data_dir": args.data_dir, "allow_private": args.allow_private,
            "peers": args.peer})
        parse_addr(cfg.listen)
        listen_fd = getattr(args, "listen_fd", None)
        if listen_fd is not None:
            check_listen_fd(listen_fd)
    except (ConfigError, ValueError) as exc:
        print(f"inri-bootstrap: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "check-config":
        print(json.dumps(asdict(cfg), indent=2))
        return 0
    configure_logging(cfg.log_format, cfg.log_level)
    try:
        trio.run(serve, cfg, listen_fd)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
