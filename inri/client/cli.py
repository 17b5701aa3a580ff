"""`inri device ...` and `inri app ...`: the SDK from the command line (JSON on stdout, errors on stderr)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import trio

from inri.client.app import HomeAppClient
from inri.client.credential import PushCredential, b64e
from inri.client.device import MAX_HOMES, DeviceClient, Message
from inri.client.errors import ApiError, NoTokensLeft
from inri.client.failover import REREGISTER_AFTER_S
from inri.common.b64url import b64d
from inri.protocol.wake import WAKE_TOKEN_MAX_BYTES


def _message(m: Message) -> dict[str, Any]:
    """A message as one JSON line: native ones decrypted; Web Push ones as their raw body (base64url)."""
    if m.kind == "webpush":
        return {"id": m.id, "kind": m.kind, "body": b64e(m.body), "encoding": m.encoding, "urgency": m.urgency,
                "topic": m.topic, "endpoint_id": m.endpoint_id, "received_at": m.received_at}
    return {"id": m.id, "message": m.plaintext.decode("utf-8", "replace"), "received_at": m.received_at}


def _print(obj: Any) -> None:
    print(json.dumps(obj), flush=True)


async def _device(args: argparse.Namespace) -> int:
    if args.device_cmd == "register":
        dev = DeviceClient(args.relay, state_path=args.state)
    elif args.device_cmd == "listen":
        dev = DeviceClient.from_state(args.state, reregister_after=args.reregister_after)
    else:
        dev = DeviceClient.from_state(args.state)
    async with dev:
        return await _device_cmd(args, dev)


async def _device_cmd(args: argparse.Namespace, dev: DeviceClient) -> int:
    cmd = args.device_cmd
    if cmd == "register":
        device_id = await dev.register(tokens=args.tokens)
        _print({"device_id": device_id, "relay": dev.relay_url, "homes": [h.relay_url for h in dev.homes],
                "tokens": len(dev.tokens), "state": str(args.state)})
        return 0
    if cmd == "credential":
        cred = dev.export_credential(args.tokens)
        if args.out:
            cred.save(args.out)
            _print({"credential": str(args.out), "tokens": len(cred.tokens)})
        else:
            print(cred.to_json())
    elif cmd == "tokens":
        _print({"tokens": await dev.more_tokens(args.count)})
    elif cmd == "pull":
        msgs = await dev.pull()
        for m in msgs:
            _print(_message(m))
        if args.ack and msgs:
            await dev.ack([m.id for m in msgs])
    elif cmd == "listen":
        n = 0
        with trio.move_on_after(args.timeout if args.timeout else float("inf")):
            async with dev.stream(ack=False) as messages:
                async for m in messages:
                    _print(_message(m))
                    await dev.ack([m.id])  # printed, so acknowledged: never shown again
                    n += 1
                    if args.count and n >= args.count:
                        break
        if args.count and n < args.count:
            print(f"inri device listen: timed out after {n} of {args.count} messages", file=sys.stderr)
            return 1
    elif cmd == "unregister":
        await dev.unregister()
        _print({"unregistered": True})
    elif cmd == "endpoint":
        if args.endpoint_cmd == "mint":
            _print(dataclasses.asdict(await dev.mint_endpoint(args.vapid_key)))
        elif args.endpoint_cmd == "list":
            for ep in await dev.list_endpoints():
                _print(dataclasses.asdict(ep))
        else:
            await dev.revoke_endpoint(args.endpoint_id)
            _print({"revoked": args.endpoint_id})
    elif cmd == "wake":
        if args.wake_cmd == "set":
            hook = await dev.set_wake_hook(args.url, b64d(args.token, "--token", max_size=WAKE_TOKEN_MAX_BYTES))
            _print(dataclasses.asdict(hook))
        elif args.wake_cmd == "show":
            shown = await dev.wake_hook()
            _print(None if shown is None else dataclasses.asdict(shown))
        else:
            await dev.remove_wake_hook()
            _print({"removed": True})
    return 0


async def _app(args: argparse.Namespace) -> int:
    if args.app_cmd == "push":
        cred = PushCredential.load(args.credential)
        async with HomeAppClient(args.relay) as app:
            receipt = await app.push(cred, args.message.encode())
        cred.save(args.credential)  # without the spent token
        _print({"push_id": receipt.push_id, "relay": receipt.relay_url, "status": receipt.status,
                "tokens_left": len(cred.tokens)})
    else:
        async with HomeAppClient([args.relay]) as app:
            _print(await app.status(args.push_id, args.relay))
    return 0


async def _distributor(args: argparse.Namespace) -> int:
    from inri.client.distributor import run_distributor  # jeepney is an extra: imported only here

    await run_distributor(args.relay, args.state_dir, args.name, lifetime_s=args.lifetime)
    return 0


def _run(args: argparse.Namespace) -> int:
    fn = {"device": _device, "app": _app, "distributor": _distributor}[args.command]
    try:
        return trio.run(fn, args)
    except ApiError as exc:
        print(f"inri {args.command}: {exc.code}: {exc.detail}", file=sys.stderr)
    except NoTokensLeft as exc:
        print(f"inri {args.command}: no_tokens: {exc}", file=sys.stderr)
    except httpx.HTTPError as exc:
        print(f"inri {args.command}: unreachable: {type(exc).__name__}: {exc}", file=sys.stderr)
    except ImportError as exc:
        print(f"inri {args.command}: missing: {exc} (pip install 'inri[distributor]')", file=sys.stderr)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        print(f"inri {args.command}: error: {exc}", file=sys.stderr)
    return 1


def _seconds(text: str) -> float:
    """A finite number of seconds >= 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, not {text!r}")
    return value


def add_commands(sub: Any) -> None:
    """Add `device` and `app` to the `inri` command's subparsers."""
    dev = sub.add_parser("device", help="act as a device: register, export credentials, receive")
    dsub = dev.add_subparsers(dest="device_cmd", required=True)
    p = dsub.add_parser("register", help="register at a home relay (or at 2-3: repeat --relay)")
    p.add_argument("--relay", required=True, action="append",
                   help=f"home relay API URL; repeat to register the same route key at up to {MAX_HOMES} homes")
    p.add_argument("--state", required=True, type=Path, help="device state file (created, mode 0600)")
    p.add_argument("--tokens", type=int, default=50)
    p = dsub.add_parser("credential", help="export a push credential for a home app")
    p.add_argument("--state", required=True, type=Path)
    p.add_argument("--tokens", type=int, default=20)
    p.add_argument("--out", type=Path, help="write it here (mode 0600) instead of stdout")
    p = dsub.add_parser("tokens", help="fetch more tokens from the home relay")
    p.add_argument("--state", required=True, type=Path)
    p.add_argument("--count", type=int, default=50)
    p = dsub.add_parser("pull", help="print stored messages (JSON lines)")
    p.add_argument("--state", required=True, type=Path)
    p.add_argument("--ack", action="store_true", help="acknowledge (delete) what was printed")
    p = dsub.add_parser("listen", help="print live messages as they arrive (JSON lines), acknowledging them")
    p.add_argument("--state", required=True, type=Path)
    p.add_argument("--count", type=int, default=0, help="stop after this many messages")
    p.add_argument("--timeout", type=float, default=0.0, help="stop after this many seconds")
    p.add_argument("--reregister-after", type=_seconds, default=REREGISTER_AFTER_S, metavar="SECONDS",
                   help="with several homes: when one fails and stays down this long, register again at the next "
                        "epoch at the live ones, so the whole mesh routes to them (0: never; default %(default)s)")
    p = dsub.add_parser("unregister", help="delete the device at its relay")
    p.add_argument("--state", required=True, type=Path)
    p = dsub.add_parser("endpoint", help="Web Push endpoints of this device: mint, list, revoke")
    esub = p.add_subparsers(dest="endpoint_cmd", required=True)
    e = esub.add_parser("mint", help="mint an endpoint URL to hand to a Web Push app server (JSON)")
    e.add_argument("--state", required=True, type=Path)
    e.add_argument("--vapid-key", help="restrict it to this application server key (base64url P-256 point)")
    e = esub.add_parser("list", help="the device's live endpoints (JSON lines)")
    e.add_argument("--state", required=True, type=Path)
    e = esub.add_parser("revoke", help="revoke an endpoint: its senders then get 410")
    e.add_argument("--state", required=True, type=Path)
    e.add_argument("endpoint_id", help="the endpoint's id (hex)")
    p = dsub.add_parser("wake", help="the device's wake hook (APNs/FCM through its app's gateway): set, show, remove")
    wsub = p.add_subparsers(dest="wake_cmd", required=True)
    w = wsub.add_parser("set", help="register or replace the hook")
    w.add_argument("--state", required=True, type=Path)
    w.add_argument("--url", required=True, help="the gateway's wake URL (https://.../v1/wake)")
    w.add_argument("--token", required=True, help="the wake token, base64url (`inri gateway seal`)")
    for name, help_ in (("show", "print the hook (JSON; null when none)"), ("remove", "remove the hook")):
        w = wsub.add_parser(name, help=help_)
        w.add_argument("--state", required=True, type=Path)
    dev.set_defaults(func=_run)

    app = sub.add_parser("app", help="act as a home app: push with a device's credential")
    asub = app.add_subparsers(dest="app_cmd", required=True)
    p = asub.add_parser("push", help="push a message (at any relay)")
    p.add_argument("--relay", required=True, action="append", help="relay API URL (repeat for fallbacks)")
    p.add_argument("--credential", required=True, type=Path, help="push credential file (rewritten without the token)")
    p.add_argument("--message", required=True)
    p = asub.add_parser("status", help="status of a push at the relay that accepted it")
    p.add_argument("--relay", required=True)
    p.add_argument("push_id")
    app.set_defaults(func=_run)

    dist = sub.add_parser("distributor", help="a UnifiedPush distributor on the D-Bus session bus")
    dist.add_argument("--relay", required=True, help="home relay API URL")
    dist.add_argument("--state-dir", required=True, type=Path, help="registrations and device states (mode 0600)")
    dist.add_argument("--name", default="inri", help="bus name suffix: org.unifiedpush.Distributor.<name>")
    dist.add_argument("--lifetime", type=int, default=7 * 24 * 3600, metavar="SECONDS",
                      help="registration lifetime signed for each app; endpoints are re-issued at 80%% of it")
    dist.set_defaults(func=_run)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inri-client")
    add_commands(ap.add_subparsers(dest="command", required=True))
    args = ap.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
