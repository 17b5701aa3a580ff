"""The device registering again after one of its homes fails (docs/api.md, "Homes in two places"): the
policy's bounds (inri/client/failover.py) on a virtual clock, the SDK's failover task under trio's
MockClock, and `inri device listen --reregister-after` against two in-process relays.
"""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from inri.client import DeviceClient, HomeAppClient
from inri.client.device import Home
from inri.client.failover import GAP_MAX_S, GAP_MIN_S, REREGISTER_AFTER_S, Failover
from tests.inproc import relay_service

# -- the policy, sans-IO ----------------------------------------------------------------------------


def test_a_home_down_for_the_delay_while_another_is_up_is_due_once() -> None:
    f = Failover(2, 3.0)
    f.up(0)
    f.up(1)
    assert f.deadline() == math.inf
    f.lost(1, 100.0)
    assert f.deadline() == 103.0 and not f.due(102.9) and f.due(103.0)
    f.lost(1, 101.0)  # its reconnect attempts fail too: still the failure that began at 100
    assert f.deadline() == 103.0
    f.done(103.0)
    assert f.reregistrations == 1 and f.deadline() == math.inf  # at most once per failure
    f.lost(1, 200.0)  # still down (no `up` in between): the same failure
    assert f.deadline() == math.inf


def test_a_home_back_within_the_delay_costs_nothing() -> None:
    f = Failover(2, 3.0)
    f.up(0)
    f.up(1)
    f.lost(0, 10.0)
    f.up(0)  # a restart or a blip shorter than the delay
    assert f.deadline() == math.inf and f.reregistrations == 0


def test_never_while_every_home_is_down_and_then_once_another_comes_back() -> None:
    f = Failover(2, 3.0)
    f.up(0)
    f.up(1)
    f.lost(0, 10.0)
    f.lost(1, 11.0)
    assert f.deadline() == math.inf  # no live home to register at
    f.up(1)  # home 1 comes back, home 0 stays down since 10: due 3 s after that
    assert f.deadline() == 13.0
    f.done(13.0)
    assert f.deadline() == math.inf


def test_two_homes_failing_together_cost_one_reregistration() -> None:
    f = Failover(3, 3.0)
    for i in range(3):
        f.up(i)
    f.lost(0, 5.0)
    f.lost(1, 6.0)
    assert f.deadline() == 8.0
    f.done(8.0)
    assert f.deadline() == math.inf and f.reregistrations == 1


def test_a_flapping_home_is_backed_off_and_the_gap_resets_after_a_quiet_hour() -> None:
    """A home down 5 s of every 10 s for two hours: each re-registration waits GAP_MIN_S, then twice as
    long, ... up to GAP_MAX_S; after an hour without one, the first gap is GAP_MIN_S again."""
    f = Failover(2, 3.0)
    f.up(0)
    f.up(1)
    at: list[float] = []
    t = 0.0
    while t < 2 * 3600:
        f.lost(1, t)
        for step in range(1, 6):  # the device looks at its deadline as time passes
            if f.due(t + step):
                at.append(t + step)
                f.done(t + step)
        f.up(1)
        t += 10.0
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    assert at[0] == 3.0
    # Each gap at least the back-off's (30, 60, 120, ... 3600 s), at most one flap period more.
    want = [min(GAP_MIN_S * 2 ** k, GAP_MAX_S) for k in range(len(gaps))]
    assert all(w <= g < w + 10 for g, w in zip(gaps, want, strict=True)), (gaps, want)
    assert len(at) == 8  # two hours of flapping every 10 s (720 failures): 8 floods
    # A quiet hour and more: the next failure waits only the delay, and the next gap is GAP_MIN_S again.
    t = at[-1] + GAP_MAX_S + 1
    f.lost(1, t)
    assert f.deadline() == t + 3.0
    f.done(t + 3.0)
    f.up(1)
    f.lost(1, t + 4.0)
    assert f.deadline() == t + 3.0 + GAP_MIN_S


def test_zero_disables_it_and_a_bad_delay_is_refused() -> None:
    f = Failover(2, 0)
    f.up(0)
    f.lost(1, 0.0)
    assert f.deadline() == math.inf and not f.due(1e9)
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="reregister_after"):
            Failover(2, bad)


def test_a_home_known_to_be_behind_is_not_a_new_failure() -> None:
    f = Failover(2, 3.0)
    f.known_down(1, 0.0)  # a restarted device whose state says home 1 missed the last epoch
    f.up(0)
    assert f.deadline() == math.inf
    f.up(1)
    f.lost(1, 50.0)  # a later failure counts
    assert f.deadline() == 53.0


# -- the SDK's failover task, on trio's MockClock -------------------------------------------------


def test_the_registration_sent_again_is_one_per_epoch_and_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every home gets the same signed registration of an epoch, signed again once half its lifetime is
    spent (a home that comes back days later must not be sent an expired one)."""
    dev = DeviceClient(["http://home-a.invalid", "http://home-b.invalid"])
    dev.lifetime_s = 1000
    first = dev._registration()
    assert dev._registration() is first
    later = types.SimpleNamespace(time=lambda: first.issued_at + 600)  # its lifetime is 1,060 s (a minute early)
    monkeypatch.setattr("inri.client.device.time", later)
    monkeypatch.setattr("inri.client.credential.time", later)
    again = dev._registration()
    assert again is not first and again.epoch == first.epoch and again.issued_at > first.issued_at
    assert dev._registration() is again


class _Recorder(DeviceClient):
    """A two-home device whose relay calls are recorded instead of sent (the policy and the task are
    under test here; tests/test_multi_home_relays.py runs them against real relays)."""

    def __init__(self, state: Path) -> None:
        super().__init__(["http://home-a.invalid", "http://home-b.invalid"], state_path=state)
        self.device_id = "00" * 32
        for h in self.homes:
            h.secret, h.epoch = "s", self.keys.epoch
        self.calls: list[tuple[float, str, int]] = []

    async def _refresh_at(self, home: Home) -> None:
        self.calls.append((trio.current_time(), home.relay_url, self.keys.epoch))
        home.epoch = self.keys.epoch
        self._save()


async def test_the_stream_task_registers_again_once_per_failure_with_back_off(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    dev = _Recorder(tmp_path / "dev.json")
    async with trio.open_nursery() as n:
        n.start_soon(dev._watch_homes)
        dev._home_up(0)
        dev._home_up(1)
        await trio.sleep(100)
        assert dev.calls == []
        t0 = trio.current_time()
        dev._home_lost(1)
        await trio.sleep(REREGISTER_AFTER_S - 0.01)
        assert dev.calls == []  # not before the delay
        await trio.sleep(0.02)
        # At the live home only, at epoch 2, recorded in the state file before (and after) it was sent.
        assert dev.calls == [(t0 + REREGISTER_AFTER_S, "http://home-a.invalid", 2)]
        saved = json.loads((tmp_path / "dev.json").read_text())
        assert saved["keys"]["epoch"] == 2 and [h.get("epoch") for h in saved["homes"]] == [None, 1]
        await trio.sleep(600)  # home b stays down: nothing more
        assert len(dev.calls) == 1
        # Home b flaps: up 1 s, down 9 s, for ten minutes. Re-registrations only at the back-off's pace.
        for _ in range(60):
            dev._home_up(1)
            await trio.sleep(1)
            dev._home_lost(1)
            await trio.sleep(9)
        times = [t for t, _, _ in dev.calls]
        # The first flap's failure is due 3 s after it began; then the gaps double (60, 120, 240 s: the
        # gap doubled at the first re-registration too), each ending within one flap period.
        gaps = [b - a for a, b in zip(times[1:], times[2:], strict=False)]
        want = [GAP_MIN_S * 2 ** k for k in range(1, len(gaps) + 1)]
        assert len(times) == 5 and all(w <= g < w + 10 for g, w in zip(gaps, want, strict=True)), times
        # Both homes down: never.
        dev._home_lost(0)
        await trio.sleep(3600)
        assert len(dev.calls) == 5
        n.cancel_scope.cancel()
    assert dev.failover.reregistrations == 5 and dev.keys.epoch == 6


# -- the CLI ------------------------------------------------------------------------------------------


async def _cli(*args: str) -> list[dict[str, object]]:
    r = await trio.run_process([sys.executable, "-m", "inri.cli", "device", *args], capture_stdout=True,
                               capture_stderr=True, check=False)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return [json.loads(line) for line in r.stdout.decode().splitlines() if line.strip()]


async def _ws_open(c: httpx.AsyncClient, url: str) -> float:
    text = (await c.get(url + "/metrics")).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("inri_websockets_open"))


@pytest.mark.integration
async def test_cli_listen_registers_again_at_the_live_home_when_the_other_stops(tmp_path: Path) -> None:
    state = tmp_path / "dev.json"
    with trio.fail_after(90):  # hang guard
        async with relay_service(tmp_path / "a") as (a, sa), httpx.AsyncClient(timeout=5) as c:
            async with relay_service(tmp_path / "b") as (b, _):
                await _cli("register", "--relay", a, "--relay", b, "--state", str(state), "--tokens", "2")
                rid = bytes.fromhex(json.loads(state.read_text())["device_id"])
                listen = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "inri.cli", "device", "listen", "--state", str(state), "--count", "1",
                     "--reregister-after", "0.5"], stdout=-1)
                while await _ws_open(c, a) < 1 or await _ws_open(c, b) < 1:  # both streams are up
                    await trio.sleep(0.05)
            # Home b stopped: half a second on, the listener registers again at a.
            stored = sa.store.registration(rid)
            while stored is None or stored.epoch < 2:
                await trio.sleep(0.05)
                stored = sa.store.registration(rid)
            saved = json.loads(state.read_text())
            assert saved["keys"]["epoch"] == 2 and [h.get("epoch") for h in saved["homes"]] == [None, 1]
            async with HomeAppClient([a]) as app:
                receipt = await app.push(DeviceClient.from_state(state).export_credential(1), b"after b stopped")
            assert listen.stdout is not None
            out = b""
            while listen.poll() is None or not out.endswith(b"\n"):
                chunk = await listen.stdout.receive_some()
                if not chunk:
                    break
                out += chunk
            assert await listen.wait() == 0
            [line] = [json.loads(x) for x in out.decode().splitlines()]
            assert (line["id"], line["message"]) == (receipt.push_id, "after b stopped")
