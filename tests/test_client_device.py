"""The device SDK against a relay's real HTTP/WebSocket API (its HTTP front on loopback, port 0 read back)."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from inri.client import DeviceClient, HomeAppClient
from inri.client.credential import PushCredential
from inri.common.b64url import b64e
from inri.protocol.codec import encode_registration
from tests.inproc import relay_api


async def push_garbage(url: str, cred: PushCredential) -> str:
    """What anyone holding the credential can do: push a ciphertext that is not sealed to the device."""
    body = {"registration": b64e(encode_registration(cred.registration)), "token": b64e(cred.take_token()),
            "ciphertext": b64e(b"not sealed to anybody" * 3)}
    async with httpx.AsyncClient() as c:
        r = await c.post(url + "/v1/push", json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["push_id"])


async def test_an_undecryptable_message_is_delivered_marked_and_can_be_acked(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with relay_api(tmp_path) as url:
            dev = DeviceClient(url)
            await dev.register(tokens=6)
            cred = dev.export_credential(6)
            async with HomeAppClient([url]) as app:
                bad = await push_garbage(url, cred)
                good = await app.push(cred, b"hello")
                # pull: the whole batch comes back, the bad one marked with its id.
                pulled = await dev.pull()
                assert [(m.id, m.plaintext, m.undecryptable) for m in pulled] == [
                    (bad, b"", True), (good.push_id, b"hello", False)]
                assert await dev.ack([bad]) == 1
                assert [m.id for m in await dev.pull()] == [good.push_id]
                assert await dev.ack([good.push_id]) == 1
                # stream: a bad message arrives marked, is acked, and the stream goes on.
                async with dev.stream() as messages:
                    bad2 = await push_garbage(url, cred)
                    got = await messages.receive()
                    assert (got.id, got.undecryptable) == (bad2, True)
                    after = await app.push(cred, b"still here")
                    got = await messages.receive()
                    assert (got.id, got.plaintext, got.undecryptable) == (after.push_id, b"still here", False)
                # The stream acked the undecryptable message before it read the next one.
                assert bad2 not in [m.id for m in await dev.pull()]
            await dev.aclose()
