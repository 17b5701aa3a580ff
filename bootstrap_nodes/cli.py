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
from pathlib import Path

import structlog
import trio

from bootstrap_nodes.config import BootstrapConfig, ConfigError, load_bootstrap_config
from bootstrap_nodes.service import Bootstrap, BootstrapApp
from inri.common.addr import format_addr, parse_addr
from inri.common.docs import DocsHelpFormatter, docs_hint, version_line
from inri.common.front import HttpServer, listening_socket, raise_fd_limit
from inri.common.front.server import LISTEN_BACKLOG
from inri.common.identity import NodeIdentity
from inri.common.lock import DataDirBusy, DataDirLock
from inri.common.logs import configure_logging
from inri.node.quic import probe

log = structlog.get_logger("inri.bootstrap")
READY_FILE = "bootstrap.json"  # written into the data dir once the bootstrap listens: its URL and pid
GRACEFUL_S = 3.0  # requests in flight at SIGINT/SIGTERM get this long


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
    if listen_fd is not None:
        # Bound by whoever started us (a supervisor's socket activation, a test that must know every
        # bootstrap's URL before any starts): served as it is, listening.
        sock = socket.socket(fileno=listen_fd)
        sock.listen(LISTEN_BACKLOG)
    else:
        sock = listening_socket(cfg.listen)
    fds = raise_fd_limit(cfg.connections_max)
    if fds < cfg.connections_max:
        log.warning("the descriptor limit is below connections_max: accepting pauses when it is reached",
                    limit=fds, connections_max=cfg.connections_max)
    server = HttpServer(app, cfg, stats=app.front, graceful_s=GRACEFUL_S)
    served = trio.Event()

    async def run_server(task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await server.run([sock], shutdown_trigger=shutdown.wait, task_status=task_status)
        finally:
            served.set()

    shutdown = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(run_server)
            nursery.start_soon(boot.sweep_loop)
            if cfg.peers:
                nursery.start_soon(boot.sync_loop)
            url = binds[0] if binds else f"http://{cfg.listen}"
            log.info("bootstrap ready", url=url, records=len(boot.store.entries), peers=list(cfg.peers))
            print(json.dumps({"bootstrap": url}), flush=True)
            ready = Path(cfg.data_dir) / READY_FILE  # for `inri health` (the container's health check) and scripts
            ready.write_text(json.dumps({"bootstrap": url, "pid": os.getpid()}))
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            log.info("bootstrap stopping")
            shutdown.set()
            with trio.move_on_after(GRACEFUL_S + 1):  # requests in flight finish, then everything stops
                await served.wait()
            nursery.cancel_scope.cancel()
    finally:
        sock.close()
        boot.close()


def bind_listen(addr: str) -> socket.socket:
    """The listening socket for `addr`, bound before the server starts: a taken port is one line naming it."""
    host, port = parse_addr(addr)
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ValueError(f"cannot listen on {format_addr(host, port)}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {format_addr(host, port)}: {exc.strerror or exc}") from None
    return sock


def _init(args: argparse.Namespace) -> int:
    from bootstrap_nodes.init import InitError, init_bootstrap, report

    try:
        config, cfg = init_bootstrap(Path(args.dir), {"listen": args.listen, "peers": tuple(args.peer or ()),
                                                      "allow_private": args.allow_private})
    except InitError as exc:
        print(f"inri-bootstrap init: {exc}", file=sys.stderr)
        return 1
    print(report(config, cfg))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inri-bootstrap", description="INRI bootstrap node (antediluvian)",
                                 epilog=docs_hint(), formatter_class=DocsHelpFormatter)
    ap.add_argument("--version", action="version", version=version_line("inri-bootstrap"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    init = sub.add_parser("init", help="write DIR/bootstrap.toml (every key, commented) and DIR/data",
                          epilog=docs_hint(), formatter_class=DocsHelpFormatter)
    init.add_argument("dir", help="the bootstrap's directory (created; an existing config is never replaced)")
    init.add_argument("--listen", help="HTTP listen HOST:PORT (default 0.0.0.0:8470)")
    init.add_argument("--peer", action="append", help="another bootstrap's URL to sync records with (repeatable)")
    init.add_argument("--allow-private", action="store_true", help="accept loopback/private addresses (labs)")
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
    if args.cmd == "init":
        return _init(args)
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
    lock = DataDirLock(Path(cfg.data_dir), "bootstrap")
    try:
        Path(cfg.data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        lock.acquire()
        if listen_fd is None:  # the server takes the descriptor over (and closes it)
            listen_fd = bind_listen(cfg.listen).detach()
    except (DataDirBusy, ValueError, OSError) as exc:  # one line naming the directory or the address
        lock.release()
        print(f"inri-bootstrap: {exc}", file=sys.stderr)
        return 1
    try:
        trio.run(serve, cfg, listen_fd)
    except KeyboardInterrupt:
        pass
    finally:
        lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
