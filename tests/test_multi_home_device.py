"""Homes in two places (issue 42 item 3), the device side: one route key registered at two home relays,
through the `inri device` CLI and the SDK against two relays' real HTTP/WebSocket APIs (in this process,
no mesh between them: each push is handed to a home directly, as the mesh would deliver it there).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from inri.client import DeviceClient, HomeAppClient
from inri.client.credential import seal
from inri.common.b64url import b64e
from inri.core.api import InjectOutcome
from inri.node.service import RelayService
from tests.inproc import relay_service


@asynccontextmanager
async def two_homes(tmp: Path) -> AsyncIterator[list[tuple[str, RelayService]]]:
    """Two relays with no link between them, each a home of the device under test."""
    async with relay_service(tmp / "a") as a, relay_service(tmp / "b") as b:
        yield [a, b]


async def cli(*args: str, ok: bool = True) -> tuple[int, list[dict[str, object]], str]:
    """`inri device ...` as a user runs it: its exit code, JSON lines on stdout, stderr."""
    r = await trio.run_process([sys.executable, "-m", "inri.cli", "device", *args], capture_stdout=True,
                               capture_stderr=True, check=False)
    out, err = r.stdout.decode(), r.stderr.decode()
    assert (r.returncode == 0) == ok, (r.returncode, out, err)
    return r.returncode, [json.loads(line) for line in out.splitlines() if line.strip()], err


def same_push_at_both(homes: list[tuple[str, RelayService]], dev: DeviceClient, text: bytes) -> str:
    """One push stored at both homes under one push id: what a custodian that re-sent it after the first
    home went down (its receipt lost) leaves behind."""
    cred = dev.export_credential(1)
    pid, ct = os.urandom(16), seal(cred.seal_key, text)
    for _, service in homes:
        got = service.inject_push(cred.registration, cred.tokens[0], ct, push_id=pid)
        assert got.outcome is InjectOutcome.ACCEPTED, got
    return pid.hex()


@pytest.mark.integration
async def test_cli_registers_at_two_homes_and_either_home_takes_the_credentials_tokens(tmp_path: Path) -> None:
    state = tmp_path / "dev.json"
    with trio.fail_after(60):
        async with two_homes(tmp_path) as homes:
            (a, _), (b, _) = homes
            _, out, _ = await cli("register", "--relay", a, "--relay", b, "--state", str(state), "--tokens", "4")
            assert out[0]["homes"] == [a, b] and out[0]["relay"] == a and out[0]["tokens"] == 4
            dev = DeviceClient.from_state(state)
            cred = dev.export_credential(4)
            async with httpx.AsyncClient() as c:
                # Either home accepts any token (home B never issued them: it was given them).
                sent = []
                for url, text in ((a, b"via A"), (b, b"via B"), (b, b"B again"), (a, b"A again")):
                    async with HomeAppClient([url]) as app:
                        receipt = await app.push(cred, text)
                    status = (await c.get(f"{url}/v1/push/{receipt.push_id}")).json()["status"]
                    assert status == "delivered", (url, text, status)
                    sent.append(text)
            _, out, _ = await cli("pull", "--state", str(state), "--ack")
            assert sorted(m["message"] for m in out) == sorted(t.decode() for t in sent)
            _, out, _ = await cli("pull", "--state", str(state))
            assert out == []  # acked at both homes
            await dev.aclose()


@pytest.mark.integration
async def test_more_than_three_homes_is_a_clear_error_and_registers_nowhere(tmp_path: Path) -> None:
    state = tmp_path / "dev.json"
    urls = [f"http://127.0.0.1:{9 + i}" for i in range(4)]  # never contacted
    _, _, err = await cli("register", *[x for u in urls for x in ("--relay", u)], "--state", str(state), ok=False)
    assert err.strip() == "inri device: error: a device has 1 to 3 home relays, 4 given"
    assert not state.exists()


@pytest.mark.integration
async def test_a_push_held_by_both_homes_is_shown_once_and_one_ack_clears_both(tmp_path: Path) -> None:
    state = tmp_path / "dev.json"
    with trio.fail_after(60):
        async with two_homes(tmp_path) as homes:
            (a, sa), (b, sb) = homes
            await cli("register", "--relay", a, "--relay", b, "--state", str(state), "--tokens", "3")
            dev = DeviceClient.from_state(state)
            pid = same_push_at_both(homes, dev, b"twice stored")
            dev._save()  # the credential's token is exported
            await dev.aclose()
            rid = bytes.fromhex(str(dev.device_id))
            assert [len(sa.pending(rid)), len(sb.pending(rid))] == [1, 1]
            _, out, _ = await cli("pull", "--state", str(state), "--ack")
            assert [(m["id"], m["message"]) for m in out] == [(pid, "twice stored")]
            assert sa.pending(rid) == [] and sb.pending(rid) == []
            # listen: the same, live, from both homes' streams.
            pid2 = same_push_at_both(homes, dev, b"live twice")
            dev._save()
            assert [len(sa.pending(rid)), len(sb.pending(rid))] == [1, 1]
            _, out, _ = await cli("listen", "--state", str(state), "--count", "1")
            assert [(m["id"], m["message"]) for m in out] == [(pid2, "live twice")]
            assert sa.pending(rid) == [] and sb.pending(rid) == []


async def test_stream_drops_the_second_homes_copy_and_acks_it_everywhere(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_homes(tmp_path) as homes:
            (a, sa), (b, sb) = homes
            async with DeviceClient([a, b]) as dev:
                await dev.register(tokens=4)
                rid = bytes.fromhex(str(dev.device_id))
                async with dev.stream() as messages:
                    ids = [same_push_at_both(homes, dev, f"m{i}".encode()) for i in range(3)]
                    got = [await messages.receive() for _ in ids]
                    assert sorted(m.id for m in got) == sorted(ids)
                    with trio.fail_after(10):  # both homes' copies were seen and acked: hang guard only
                        while sa.pending(rid) or sb.pending(rid) or dev.duplicates_dropped < 3:
                            await trio.sleep(0.02)
                    with trio.move_on_after(0.3):
                        extra = await messages.receive()
                        raise AssertionError(f"a duplicate got through: {extra}")
                assert dev.duplicates_dropped == 3
                # An id a home does not hold (or no home holds) is harmless to ack.
                assert await dev.ack([ids[0], "00" * 16]) == 0


async def test_unregister_removes_the_device_at_every_home(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_homes(tmp_path) as homes:
            (a, sa), (b, sb) = homes
            async with DeviceClient([a, b], state_path=tmp_path / "dev.json") as dev:
                await dev.register(tokens=2)
                rid = bytes.fromhex(str(dev.device_id))
                assert sa.store.registration(rid) is not None and sb.store.registration(rid) is not None
                await dev.unregister()
                assert sa.store.registration(rid) is None and sb.store.registration(rid) is None
            assert json.loads((tmp_path / "dev.json").read_text())["homes"] == [
                {"relay_url": a, "device_secret": None}, {"relay_url": b, "device_secret": None}]


async def test_a_failed_second_home_leaves_the_device_registered_nowhere(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with relay_service(tmp_path / "a") as (a, sa):
            async with DeviceClient([a, "http://127.0.0.1:9"]) as dev:
                with pytest.raises(httpx.ConnectError):
                    await dev.register(tokens=2)
                assert sa.store.registration(bytes.fromhex(str(dev.device_id))) is None


async def test_a_single_home_state_file_from_before_loads_and_keeps_its_form(tmp_path: Path) -> None:
    state = tmp_path / "dev.json"
    with trio.fail_after(60):
        async with relay_service(tmp_path / "a") as (a, _), relay_service(tmp_path / "b") as (b, _):
            async with DeviceClient(a) as first:
                await first.register(tokens=3)
                # The state file as the SDK wrote it before homes in two places.
                legacy = {"relay_url": a, "keys": first.keys.to_dict(), "device_id": first.device_id,
                          "device_secret": first.secret, "tokens": [b64e(t) for t in first.tokens]}
            state.write_text(json.dumps(legacy))
            async with DeviceClient.from_state(state) as dev:
                assert [h.relay_url for h in dev.homes] == [a] and dev.secret == legacy["device_secret"]
                async with HomeAppClient([a]) as app:
                    receipt = await app.push(dev.export_credential(1), b"still works")
                assert [(m.id, m.plaintext) for m in await dev.pull()] == [(receipt.push_id, b"still works")]
                assert await dev.more_tokens(2) == 4
            # Written back in the same form (older SDKs, and scripts that edit relay_url, still read it).
            saved = json.loads(state.read_text())
            assert set(saved) == set(legacy) and saved["relay_url"] == a
            assert saved["device_secret"] == legacy["device_secret"] and len(saved["tokens"]) == 4
            async with DeviceClient.from_state(state) as again:
                assert len(again.tokens) == 4 and again.secret == legacy["device_secret"]
            # A two-home device's file lists its homes, and loads back with both secrets.
            two = tmp_path / "two.json"
            async with DeviceClient([a, b], state_path=two) as multi:
                await multi.register(tokens=2)
            saved = json.loads(two.read_text())
            assert saved["v"] == 2 and [h["relay_url"] for h in saved["homes"]] == [a, b]
            async with DeviceClient.from_state(two) as multi:
                assert [h.secret is not None for h in multi.homes] == [True, True]
                assert await multi.pull() == []
