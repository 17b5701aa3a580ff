"""`inri mesh up|down`: a local mesh of real relay and bootstrap processes on loopback.

`up` starts M bootstrap nodes and N relays (each its own process, data dir and ports under DIR),
waits until every relay answers and has its neighbours (`min_neighbours`, or as many as the membership
can give it: waiting_for), writes DIR/mesh.json and prints it. The processes outlive the command
(their own sessions); `down` stops them (SIGTERM, then SIGKILL after a grace).

Ports: every process binds port 0 and reports the ports it got, so no port is picked, released and
bound again by someone else in between. A relay writes them to `relay.json` in its data dir once it
listens (`inri.node.relay.READY_FILE`: node_id, api, quic, pid); a bootstrap prints one line
`{"bootstrap": URL}` on stdout (its log here). Once a relay is up, its relay.toml is rewritten with
the ports it got, so a restart (tests kill -9 and restart relays) comes back on the same addresses.
Bootstrap sync pulls from the peers a node is started with, so with several bootstraps B(i) pulls
from B1..B(i-1) (their ports are known by then); relays announce to B1 first, so records reach all.

Lab settings: short timers (relay profile "test"), loopback/private addresses allowed at the
bootstraps, full traces with one shared salt so `inri demo` can follow a push across relays.

Impaired links (`--link-delay-ms`, `--link-jitter-ms`, `--link-loss`): every relay delays and drops
the QUIC datagrams it sends (`[quic] link_delay_ms / link_jitter_ms / link_loss`, applied in the QUIC
endpoint: inri/node/quic.py, LinkImpairment), so each direction of each relay link gets that one-way
delay, jitter and loss. The kernel's netem is not needed (nor available on every lab machine).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import httpx

MESH_FILE = "mesh.json"


class LinkLimits(NamedTuple):
    """A relay's membership limits (its `[engine]` settings) that decide when the mesh has formed."""

    active_max: int
    priority_join_below: int


class MeshError(RuntimeError):
    """The mesh could not be started or stopped (the message says which process and why)."""


def _died(proc: subprocess.Popen[bytes], log: Path) -> MeshError:
    return MeshError(f"process {proc.args!r} exited ({proc.returncode}); log {log}:\n"
                     + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))


def bootstrap_url(proc: subprocess.Popen[bytes], log: Path, deadline: float) -> str:
    """The URL a bootstrap started with port 0 listens on: its `{"bootstrap": URL}` line in log."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _died(proc, log)
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith('{"bootstrap": '):
                try:
                    return str(json.loads(line)["bootstrap"])
                except (ValueError, KeyError):
                    pass
        time.sleep(0.05)
    raise MeshError(f"bootstrap did not report its URL in time; log {log}")


def relay_ready(data_dir: Path, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> dict[str, Any]:
    """What a relay process reports once it listens (node_id, api URL, quic address, pid): its
    data_dir/relay.json, written by this very process (a stale file of an earlier run is ignored)."""
    from inri.node.relay import READY_FILE

    path = data_dir / READY_FILE
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _died(proc, log)
        try:
            info: dict[str, Any] = json.loads(path.read_text())
            if info.get("pid") == proc.pid:
                return info
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise MeshError(f"relay in {data_dir} did not report ready in time; log {log}")


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, start_new_session=True)


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _died(proc, log)
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise MeshError(f"{url} did not come up in time; log {log}")


def relay_config(data_dir: Path, api_port: int, quic_port: int, bootstraps: list[str], salt: str,
                 trace_level: str = "full", profile: str = "test",
                 engine: dict[str, Any] | None = None, lab_limits: bool = True,
                 quic: dict[str, Any] | None = None) -> str:
    """The TOML of one lab relay (engine: extra [engine] settings, e.g. {"active_max": 8}; quic: extra
    [quic] settings, e.g. the link impairment {"link_delay_ms": 50.0}).

    Ports 0: the relay binds ephemeral ports and reports them in relay.json (see relay_ready).
    lab_limits: raise the API rate limits for load tests; False keeps the documented defaults.
    """
    boots = ", ".join(json.dumps(b) for b in bootstraps)
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (engine or {}).items())
    quic_extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (quic or {}).items())
    return (
        "[relay]\n"
        f'data_dir = "{data_dir}"\napi = "127.0.0.1:{api_port}"\nquic = "127.0.0.1:{quic_port}"\n'
        f'bootstrap = [{boots}]\nprofile = "{profile}"\nlog_format = "json"\npeers_interval_s = 2.0\n'
        # Lab limits: load tests and benchmarks push thousands per second from one address and device.
        + ("[api]\nrate_per_s = 5000.0\nrate_burst = 10000\ndevice_rate_per_s = 100000.0\ndevice_rate_burst = 100000\n"
           if lab_limits else "") +
        f'[trace]\nlevel = "{trace_level}"\nsalt = "{salt}"\n'
        + (f"[engine]\n{extra}" if extra else "")
        + (f"[quic]\n{quic_extra}" if quic_extra else "")
    )


def up(directory: str | Path, relays: int = 6, bootstraps: int = 1, *, timeout_s: float = 60.0,
       min_neighbours: int = 2, trace_level: str = "full", profile: str = "test",
       engine: dict[str, dict[str, Any]] | None = None, lab_limits: bool = True,
       link_delay_ms: float = 0.0, link_jitter_ms: float = 0.0, link_loss: float = 0.0) -> dict[str, Any]:
    """Start the mesh; returns (and writes to DIR/mesh.json) its processes and URLs.

    Returns once every relay lists min_neighbours neighbours (at most relays - 1), or as many as the
    membership can give it (waiting_for); MeshError after timeout_s. engine maps a relay name ("R3") to
    extra [engine] settings for that relay only. link_*: impair every relay link (module docstring):
    one-way delay and jitter in ms, loss as a share of datagrams.
    """
    if not (link_delay_ms >= 0 and link_jitter_ms >= 0 and 0 <= link_loss < 1):
        raise MeshError("link impairment needs --link-delay-ms >= 0, --link-jitter-ms >= 0, 0 <= --link-loss < 1")
    impair = {k: float(v) for k, v in (("link_delay_ms", link_delay_ms), ("link_jitter_ms", link_jitter_ms),
                                       ("link_loss", link_loss)) if v}
    d = Path(directory).resolve()
    if (d / MESH_FILE).exists():
        raise MeshError(f"{d / MESH_FILE} exists: a mesh is already up there (inri mesh down --dir {d})")
    if relays < 1 or bootstraps < 1:
        raise MeshError("need at least one relay and one bootstrap node")
    d.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    deadline = time.monotonic() + timeout_s
    salt = secrets.token_hex(8)
    info: dict[str, Any] = {"dir": str(d), "trace_salt": salt, "bootstraps": [], "relays": [],
                            "link_impairment": impair}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls: list[str] = []
        benv = {"INRI_BOOTSTRAP_PER_PREFIX_MAX": "10000", "INRI_BOOTSTRAP_RATE_PER_S": "1000",
                "INRI_BOOTSTRAP_RATE_BURST": "2000", "INRI_BOOTSTRAP_SYNC_INTERVAL_S": "1",
                "INRI_BOOTSTRAP_LOG_FORMAT": "json"}
        for i in range(bootstraps):
            args = [py, "-m", "bootstrap_nodes.cli", "serve", "--listen", "127.0.0.1:0",
                    "--data-dir", str(d / f"bootstrap-{i + 1}"), "--allow-private"]
            for p in urls:  # the ones started before: their ports are known (see module docstring)
                args += ["--peer", p]
            log = d / f"bootstrap-{i + 1}.log"
            proc = _spawn(args, log, benv)
            procs.append(proc)
            url = bootstrap_url(proc, log, deadline)
            _wait(url + "/healthz", proc, log, deadline)
            urls.append(url)
            info["bootstraps"].append({"name": f"B{i + 1}", "url": url, "pid": proc.pid, "log": str(log)})
        for i in range(relays):
            name = f"R{i + 1}"
            rdir = d / name.lower()
            rdir.mkdir(exist_ok=True)
            cfg = rdir / "relay.toml"
            cfg.write_text(relay_config(rdir, 0, 0, urls, salt, trace_level, profile,
                                        (engine or {}).get(name), lab_limits, impair))
            log = d / f"{name.lower()}.log"
            proc = _spawn([py, "-m", "inri.cli", "relay", "--config", str(cfg)], log, {})
            procs.append(proc)
            info["relays"].append({"name": name, "pid": proc.pid, "data_dir": str(rdir), "log": str(log)})
        for j, r in enumerate(info["relays"]):
            rdir, log = Path(r["data_dir"]), Path(r["log"])
            ready = relay_ready(rdir, procs[bootstraps + j], log, deadline)
            r.update(api=ready["api"], quic=ready["quic"], node_id=ready["node_id"])
            _wait(r["api"] + "/healthz", procs[bootstraps + j], log, deadline)
            # A restart keeps the addresses peers and clients know (see module docstring).
            api_port, quic_port = int(r["api"].rpartition(":")[2]), int(r["quic"].rpartition(":")[2])
            (rdir / "relay.toml").write_text(relay_config(rdir, api_port, quic_port, urls, salt, trace_level,
                                                          profile, (engine or {}).get(r["name"]), lab_limits,
                                                          impair))
        _write(d, info)
        want = min(min_neighbours, relays - 1)
        limits = {r["name"]: relay_limits(Path(r["data_dir"]) / "relay.toml") for r in info["relays"]}
        while want > 0:
            links = mesh_links(info)
            waiting = waiting_for(links, want, limits)
            if not waiting:
                break
            if time.monotonic() > deadline:
                counts = [len(links[r["name"]]) for r in info["relays"]]
                raise MeshError(f"mesh did not form in {timeout_s} s: neighbour counts {counts}; "
                                + "; ".join(f"{name} {why}" for name, why in waiting.items()))
            time.sleep(0.2)
        return info
    except BaseException:
        for proc in procs:
            _stop_pid(proc.pid, 3.0)
        (d / MESH_FILE).unlink(missing_ok=True)
        raise


def relay_limits(config: Path) -> LinkLimits:
    """The membership limits of the relay started with `config` (its TOML, the profile and the INRI_*
    environment it inherits from this process): what waiting_for needs to know of it."""
    from inri.node.config import load_config

    engine = load_config(config).engine
    return LinkLimits(engine.active_max, engine.priority_join_below)


def mesh_links(info: dict[str, Any]) -> dict[str, set[str]]:
    """Relay name -> the relays of the mesh it lists as neighbours (`/v1/status`: links both ends hold)."""
    names = {r["node_id"]: r["name"] for r in info["relays"]}
    return {r["name"]: {names[n["node_id"]] for n in status(r["api"])["neighbours"] if n["node_id"] in names}
            for r in info["relays"]}


def waiting_for(links: Mapping[str, Collection[str]], want: int, limits: Mapping[str, LinkLimits]) -> dict[str, str]:
    """The relays the mesh is still waiting for (name -> why), given each relay's neighbours: those
    with fewer than `want` links that the membership can still give one more. Empty: formed.

    Not simply "every relay has `want` links": the membership does not promise that (rule M4 makes a
    full relay room only for a relay below `priority_join_below` links). A relay with that many links
    whose non-neighbours are all full is refused as full by each of them until one drops a link: it
    stays where it is. An 8-relay lab mesh under CPU load settled so (7 relays full at 4 links, the
    last one at 2; every full relay refused it, for minutes), and `up` waited for a third link to its
    timeout. Such a relay counts as formed; one below `priority_join_below` does not (M4 gets it in).
    """
    waiting: dict[str, str] = {}
    for name, peers in links.items():
        have, lim = len(peers), limits[name]
        if have >= min(want, lim.active_max):
            continue
        if have < lim.priority_join_below:
            waiting[name] = f"has {have} of {want} links (below priority_join_below, rule M4)"
            continue
        room = sorted(o for o, theirs in links.items()
                      if o != name and o not in peers and len(theirs) < limits[o].active_max)
        if room:
            waiting[name] = f"has {have} of {want} links; relays with room: {', '.join(room)}"
    return waiting


def restart_relay(info: dict[str, Any], relay: dict[str, Any], *, timeout_s: float = 30.0) -> None:
    """Start `relay` (an entry of up()'s relays) again from its data directory: its relay.toml keeps the
    addresses it bound, mesh.json is kept current so down() stops the new process. Waits until its API
    answers (MeshError otherwise)."""
    log = Path(relay["log"])
    proc = _spawn([sys.executable, "-m", "inri.cli", "relay", "--config", str(Path(relay["data_dir"]) / "relay.toml")],
                  log, {})
    relay["pid"] = proc.pid
    _write(Path(info["dir"]), info)
    _wait(relay["api"] + "/healthz", proc, log, time.monotonic() + timeout_s)


def status(api: str) -> dict[str, Any]:
    result: dict[str, Any] = httpx.get(api + "/v1/status", timeout=5).json()
    return result


def _write(d: Path, info: dict[str, Any]) -> None:
    tmp = d / (MESH_FILE + ".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    os.replace(tmp, d / MESH_FILE)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _stop_pid(pid: int, grace: float) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace
    while time.monotonic() < end and _alive(pid):
        time.sleep(0.05)
    if _alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def down(directory: str | Path, *, grace_s: float = 10.0) -> int:
    """Stop every process of the mesh in DIR; returns how many were running."""
    d = Path(directory).resolve()
    path = d / MESH_FILE
    if not path.exists():
        raise MeshError(f"no mesh in {d} ({MESH_FILE} not found)")
    info = json.loads(path.read_text())
    pids = [r["pid"] for r in info["relays"]] + [b["pid"] for b in info["bootstraps"]]
    running = [p for p in pids if _alive(p)]
    for pid in running:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for pid in running:
        _stop_pid(pid, grace_s)
    path.unlink()
    return len(running)
