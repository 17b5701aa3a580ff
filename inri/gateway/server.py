"""Serving the gateway: its key, its providers' HTTP/2 clients, hypercorn, the signals.

hypercorn serves the app (HTTP/1.1, and HTTP/2 over TLS when `tls_cert` is set): the gateway's
traffic is one small request per wake-up, so the relay's lean HTTP/1.1 front is not needed here.
Once it listens, the gateway prints one line `{"gateway": URL}` on stdout (the port, when the
configuration asked for port 0) and logs to stderr.
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import ssl
from contextlib import AsyncExitStack
from typing import Any

import httpx
import structlog
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve

from inri.gateway.apns import ApnsProvider
from inri.gateway.app import GatewayApp
from inri.gateway.config import GatewayConfig, read_service_account
from inri.gateway.fcm import FcmProvider
from inri.gateway.jws import load_p8, load_rsa_pem
from inri.gateway.keys import load_key, public_key
from inri.gateway.provider import Provider
from inri.protocol.wake import WakeProvider

log = structlog.get_logger("inri.gateway")

# Every port faces the internet: a connection that sends nothing for this long is closed (hypercorn has
# no read deadline by default), and a TLS handshake has as long. Relays send one small request at a time.
READ_TIMEOUT_S = 10


class _HypercornLog(logging.Handler):
    """hypercorn's error log (warnings and errors) into ours."""

    def emit(self, record: logging.LogRecord) -> None:
        log.log(record.levelno, record.getMessage(), source="hypercorn")


def _verify(cfg: GatewayConfig, ca_file: str) -> ssl.SSLContext | bool:
    return ssl.create_default_context(cafile=str(cfg.path(ca_file))) if ca_file else True


async def _providers(cfg: GatewayConfig, stack: AsyncExitStack) -> dict[WakeProvider, Provider]:
    """The configured providers, each with its own HTTP/2 client (closed with the stack)."""
    out: dict[WakeProvider, Provider] = {}
    timeout = cfg.gateway.provider_timeout_s
    if cfg.apns is not None:
        client = await stack.enter_async_context(
            httpx.AsyncClient(http2=True, verify=_verify(cfg, cfg.apns.ca_file), timeout=timeout))
        out[WakeProvider.APNS] = ApnsProvider(cfg.apns, str(cfg.path(cfg.apns.key_file)), client)
    if cfg.fcm is not None:
        client = await stack.enter_async_context(
            httpx.AsyncClient(http2=True, verify=_verify(cfg, cfg.fcm.ca_file), timeout=timeout))
        account = read_service_account(cfg.path(cfg.fcm.service_account))
        out[WakeProvider.FCM] = FcmProvider(cfg.fcm, account, client)
    return out


def check_credentials(cfg: GatewayConfig) -> None:
    """Load every key the configuration names (ValueError naming the file that is wrong): what
    `--check-config` checks beyond the file itself."""
    load_key(cfg.path(cfg.gateway.key_file))
    if cfg.apns is not None:
        load_p8(cfg.path(cfg.apns.key_file))
    if cfg.fcm is not None:
        load_rsa_pem(read_service_account(cfg.path(cfg.fcm.service_account)).private_key,
                     f"{cfg.path(cfg.fcm.service_account)}: private_key")


def build_app(cfg: GatewayConfig, providers: dict[WakeProvider, Provider]) -> GatewayApp:
    """The ASGI app over the configured sealing key (ValueError naming the key file when it is bad)."""
    return GatewayApp(cfg.gateway, load_key(cfg.path(cfg.gateway.key_file)), providers)


async def run_gateway(cfg: GatewayConfig, *, shutdown: trio.Event | None = None,
                      task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until SIGINT/SIGTERM (or `shutdown`); task_status gets the URL it listens on."""
    shutdown = trio.Event() if shutdown is None else shutdown
    hc = HyperConfig()
    hc.bind = [cfg.gateway.listen]
    hc.accesslog = None
    hc.errorlog = logging.getLogger("inri.gateway.hypercorn")
    if not hc.errorlog.handlers:
        hc.errorlog.addHandler(_HypercornLog())
        hc.errorlog.setLevel(logging.WARNING)
        hc.errorlog.propagate = False
    hc.graceful_timeout = cfg.gateway.shutdown_grace_s
    hc.read_timeout = READ_TIMEOUT_S
    hc.ssl_handshake_timeout = READ_TIMEOUT_S
    hc.include_server_header = False
    if cfg.gateway.tls_cert:
        hc.certfile, hc.keyfile = str(cfg.path(cfg.gateway.tls_cert)), str(cfg.path(cfg.gateway.tls_key))
    async with AsyncExitStack() as stack:
        providers = await _providers(cfg, stack)
        app = build_app(cfg, providers)
        asgi: Any = app  # hypercorn's ASGI types are stricter than inri.common.http's plain dicts
        async with trio.open_nursery() as nursery:
            signals = trio.CancelScope()
            nursery.start_soon(_first_signal, shutdown, signals)
            binds: list[str] = await nursery.start(functools.partial(serve, asgi, hc, shutdown_trigger=shutdown.wait))
            url = binds[0]
            print(json.dumps({"gateway": url}), flush=True)
            log.info("gateway ready", url=url, providers=sorted(p.value for p in providers),
                     public_key=public_key(app.key))
            task_status.started(url)
            await shutdown.wait()  # then hypercorn finishes in-flight requests (shutdown_grace_s) and returns
            signals.cancel()


async def _first_signal(shutdown: trio.Event, scope: trio.CancelScope) -> None:
    with scope, trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("signal", signal=signal.Signals(signum).name)
            shutdown.set()
            return
