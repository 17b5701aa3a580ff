"""Scenario files: a TOML document that fixes a whole simulated workload.

```toml
name = "baseline-1k"
seed = 1
duration_s = 120.0            # virtual seconds simulated
deadline_s = 30.0             # a push counts as delivered when stored within this time
coverage_after_s = 10.0       # route_coverage is measured this long after each registration
trace_level = "summary"       # default when the CLI gives none: off | summary | full

[topology]
kind = "random"               # random | geographic | built (the shipped bootstrap ranking and membership
                              # form it: simulations/built.py; min/max_degree must equal active_min/max)
relays = 1000
min_degree = 3                # each relay gets 3-4 neighbours
max_degree = 4
latency_min_s = 0.005         # random: per-link base latency, uniform
latency_max_s = 0.060
asymmetry = 0.1               # each direction differs from the base by up to +-10%
clusters = 0                  # geographic, built: relays uniform on the unit square (0), or around this
                              # many metro centres of weight 1/k, a Gaussian cluster_spread (0.05) away
processing_min_s = 0.0002     # per-relay processing delay added to each frame it handles
processing_max_s = 0.002

[network]
loss = 0.0                    # probability that any one packet is lost on a link
loss_model = "drop"           # drop: a lost frame is gone (recovered by custody retries only);
                              # quic: on a live link a lost packet is retransmitted by QUIC one probe
                              # timeout later (aioquic's PTO from the link RTT), frames behind it on the
                              # link's stream wait for it; frames to a relay that is down are still lost

[workload]
registrations = 200
registration_start_s = 0.0
registration_end_s = 20.0
tokens_per_registration = 8
refresh_interval_s = 0.0      # re-register with epoch + 1 this often (0: never)
rotate_receipt_keys = false   # each refresh hands the home a new receipt key
pushes = 1000
push_start_s = 30.0
push_end_s = 90.0

multi_home_share = 0.0        # share of devices registered at several homes (one route id, anycast)
homes_per_device = 2          # how many homes such a device has (2 or 3)
multi_home_reregister_s = 0.0 # such a device re-registers (epoch + 1) this long after a home fails (0: never)

[churn]
fail_fraction = 0.0           # share of relays that fail during [start_s, end_s]
rejoin_fraction = 0.5         # of those, the share that rejoin after downtime_s
start_s = 30.0
end_s = 90.0
downtime_s = 30.0
multi_home_failures = 0       # per multi-home device, how many of its homes fail (< homes_per_device)
durable_custody = true        # a failed relay's custody is on disk and comes back at its rejoin

[[partitions]]                # optional: cut the mesh in two for an interval
start_s = 40.0
end_s = 60.0
fraction = 0.5                # relays with index < fraction * relays form one side

[engine]                      # EngineConfig overrides
keepalive_interval_s = 2.0

[[adversaries]]               # optional: hostile relays or clients (simulations/adversary.py)
kind = "black_hole"           # black_hole | rushing | forger | reg_spammer | receipt_forger |
                              # push_spammer | stale_sender
fraction = 0.1                # share of relays (or count = N)
# rate_per_s, start_s, end_s: spam rates and window (reg_spammer, forger; stale_sender: its pushes per
# second); rate_x, capacity_per_s, honest_share, connections, reject_cost: push_spammer (ingress.py);
# devices: stale_sender's own devices (stale.py; needs [workload] refresh_interval_s > 0)
```
"""

from __future__ import annotations

import math
import tomllib
import typing
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from inri.common.config import Setting, build, check_value, engine_config
from inri.core.api import TraceLevel
from inri.core.config import EngineConfig
from simulations.adversary import CLIENT_KINDS, KINDS, Adversary

LOSS_MODELS = ("drop", "quic")
MAX_HOMES = 3  # homes of one device (issue 42, item 3: "2 (at most 3)")


class ScenarioError(ValueError):
    """A scenario file that cannot be run, with the key at fault."""


T = TypeVar("T")


@dataclass(frozen=True)
class Topology:
    kind: str = "random"
    relays: int = 100
    min_degree: int = 3
    max_degree: int = 4
    latency_min_s: float = 0.005
    latency_max_s: float = 0.060
    asymmetry: float = 0.1
    processing_min_s: float = 0.0002
    processing_max_s: float = 0.002
    # geographic: relays on a unit square, latency = base + distance * per_unit (then asymmetry)
    geo_base_s: float = 0.002
    geo_per_unit_s: float = 0.150
    # geographic and built: 0 places relays uniformly; N > 0 around N metro centres (topology.py)
    clusters: int = 0
    cluster_spread: float = 0.05


@dataclass(frozen=True)
class Workload:
    registrations: int = 10
    registration_start_s: float = 0.0
    registration_end_s: float = 5.0
    tokens_per_registration: int = 8
    refresh_interval_s: float = 0.0
    pushes: int = 50
    push_start_s: float = 10.0
    push_end_s: float = 20.0
    # Key rotation: registration 2d + 1 is device d's next route key (a new route id) at the same
    # home relay as registration 2d (simulations/privacy.py measures whether relays can link them).
    rotate: bool = False
    # Every refresh hands the home a new receipt key (docs/api.md, "Refresh"; rule F5c): pushes made
    # with the credential of an earlier epoch are answered under that epoch's key.
    rotate_receipt_keys: bool = False
    # Homes in two places (issue 42, item 3): this share of devices registers the same route key at
    # homes_per_device homes (2, at most 3), drawn like the first; every home originates the route id.
    multi_home_share: float = 0.0
    homes_per_device: int = 2
    # A multi-home device whose stream to one of its homes drops (the home failed) registers again at a new
    # epoch this long after (0: never), so the route id's next flood leads every relay to a live home.
    multi_home_reregister_s: float = 0.0


@dataclass(frozen=True)
class Churn:
    fail_fraction: float = 0.0
    rejoin_fraction: float = 0.5
    start_s: float = 0.0
    end_s: float = 0.0
    downtime_s: float = 30.0
    # For each multi-home device, this many of its homes fail (never the last one) in [start_s, end_s],
    # down for downtime_s (rejoin_fraction applies); they count in fail_fraction's share.
    multi_home_failures: int = 0
    # A failed relay's custody survives on its disk and comes back at its rejoin (as the daemon's SQLite
    # custody does, committed before its 202); false: lost, as after a crash without disk.
    durable_custody: bool = True


@dataclass(frozen=True)
class Partition:
    start_s: float
    end_s: float
    fraction: float = 0.5



def sim_engine_config() -> EngineConfig:
    """The engine settings a scenario starts from: the relay's defaults, except the route table.

    The simulator's route table defaults to the dict (the relay's to "compact"): its engines share
    every route id object, so a dict entry costs about 130 B there instead of 180, and a run is about
    1.5x faster (churn-2k seed 3: 15.9 s against 24.1 s, the same summary). A scenario sets
    `route_table = "compact"` where memory is the wall (scale-100k)."""
    return EngineConfig(route_table="dict")

@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int = 1
    duration_s: float = 60.0
    deadline_s: float = 30.0
    coverage_after_s: float = 10.0
    trace_level: TraceLevel = TraceLevel.SUMMARY
    loss: float = 0.0
    loss_model: str = "drop"  # LOSS_MODELS: what a lost packet costs (see the module docstring)
    topology: Topology = field(default_factory=Topology)
    workload: Workload = field(default_factory=Workload)
    churn: Churn = field(default_factory=Churn)
    partitions: tuple[Partition, ...] = ()
    engine: EngineConfig = field(default_factory=sim_engine_config)
    adversaries: tuple[Adversary, ...] = ()


KINDS_OF_TOPOLOGY = ("random", "geographic", "built")


def _check_degrees(t: Topology, engine: EngineConfig) -> None:
    """Degrees the builder cannot honour, and membership settings that contradict the topology."""
    if t.relays > 2 and t.max_degree < 2:
        raise ScenarioError(f"[topology] max_degree = {t.max_degree}: a connected mesh of {t.relays} relays needs "
                            "relays of degree 2 or more")
    if t.min_degree == t.max_degree and t.relays * t.min_degree % 2 and t.kind != "built":
        raise ScenarioError(f"[topology] min_degree = max_degree = {t.min_degree} cannot be honoured with "
                            f"{t.relays} relays (an odd number of link ends): change relays or max_degree")
    if t.kind == "built":
        # The membership decides the degrees: the topology's must be the engine's.
        for topo_key, eng_key in (("min_degree", "active_min"), ("max_degree", "active_max")):
            if getattr(t, topo_key) != getattr(engine, eng_key):
                raise ScenarioError(
                    f"[topology] {topo_key} = {getattr(t, topo_key)} contradicts [engine] {eng_key} = "
                    f"{getattr(engine, eng_key)}: a \"built\" mesh takes its degrees from the membership")
        return
    if t.max_degree > engine.active_max:
        raise ScenarioError(f"[topology] max_degree = {t.max_degree} contradicts [engine] active_max = "
                            f"{engine.active_max}: relays would refuse the links above active_max")
    if t.min_degree < engine.active_min:
        raise ScenarioError(f"[topology] min_degree = {t.min_degree} contradicts [engine] active_min = "
                            f"{engine.active_min}: membership would dial more links at run time")


def _nonnegative(cls: type) -> dict[str, msgspec.Meta]:
    """Every number of a scenario table is a count, a time, a rate or a share: none is negative."""
    return {name: _NONNEG for name, hint in typing.get_type_hints(cls).items() if hint in (int, float)}


_NONNEG = msgspec.Meta(ge=0)


def _section(cls: type[T], raw: Any, name: str) -> T:
    if raw is None:
        return cls()
    return build(cls, raw, where=f"[{name}]", rules=_nonnegative(cls), error=ScenarioError)


def _top(raw: dict[str, Any], key: str, default: Any, hint: Any) -> Any:
    return check_value(raw.pop(key, default), hint, key, error=ScenarioError)


def parse_level(value: str) -> TraceLevel:
    """'off' | 'summary' | 'full' -> TraceLevel."""
    try:
        return TraceLevel[value.upper()]
    except KeyError:
        raise ScenarioError(f"trace level must be off, summary or full, not {value!r}") from None


def load(source: str | Path) -> Scenario:
    """Load a scenario from a path, or by bare name from simulations/scenarios/."""
    path = Path(source)
    if not path.exists():
        name = str(source).removesuffix(".toml") + ".toml"
        packaged = resources.files("simulations").joinpath("scenarios", name)
        if not packaged.is_file():
            raise ScenarioError(f"no scenario file {source!r} (nor simulations/scenarios/{name})")
        text = packaged.read_text()
        default_name = name.removesuffix(".toml")
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ScenarioError(f"{source}: not UTF-8 text") from None
        default_name = path.stem
    try:
        raw = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ScenarioError(f"{source}: not valid TOML: {str(exc)[:200]}") from None
    return from_dict(raw, default_name)


def from_dict(raw: dict[str, Any], default_name: str = "scenario") -> Scenario:
    """Build a Scenario from parsed TOML, refusing unknown keys."""
    if not isinstance(raw, dict):
        raise ScenarioError("a scenario must be a table")
    raw = dict(raw)
    top = {f.name for f in fields(Scenario)} | {"network"}  # includes "adversaries"
    unknown = sorted(set(raw) - top)
    if unknown:
        raise ScenarioError(f"unknown top-level keys: {', '.join(unknown)}")
    engine_raw = raw.pop("engine", {}) or {}
    if not isinstance(engine_raw, dict):
        raise ScenarioError("[engine] must be a table")
    settings = {k: Setting(v, f"[engine] {k}") for k, v in engine_raw.items()}
    engine = engine_config(sim_engine_config(), settings, where="[engine]", error=ScenarioError)
    network = raw.pop("network", {}) or {}
    if not isinstance(network, dict) or set(network) - {"loss", "loss_model"}:
        raise ScenarioError("[network] must be a table with only the keys loss and loss_model")
    parts = raw.pop("partitions", []) or []
    advs = raw.pop("adversaries", []) or []
    if not isinstance(parts, list) or not isinstance(advs, list):
        raise ScenarioError("[[partitions]] and [[adversaries]] must be arrays of tables")
    sc = Scenario(
        name=_top(raw, "name", default_name, str),
        seed=_top(raw, "seed", 1, int),
        duration_s=_top(raw, "duration_s", 60.0, float),
        deadline_s=_top(raw, "deadline_s", 30.0, float),
        coverage_after_s=_top(raw, "coverage_after_s", 10.0, float),
        trace_level=parse_level(_top(raw, "trace_level", "summary", str)),
        loss=check_value(network.get("loss", 0.0), float, "[network] loss", error=ScenarioError),
        loss_model=check_value(network.get("loss_model", "drop"), str, "[network] loss_model", error=ScenarioError),
        topology=_section(Topology, raw.pop("topology", None), "topology"),
        workload=_section(Workload, raw.pop("workload", None), "workload"),
        churn=_section(Churn, raw.pop("churn", None), "churn"),
        partitions=tuple(_section(Partition, p, "partitions") for p in parts),
        adversaries=tuple(_section(Adversary, a, "adversaries") for a in advs),
        engine=engine,
    )
    for key in ("duration_s", "deadline_s", "coverage_after_s"):
        v = getattr(sc, key)
        if not (math.isfinite(v) and v >= 0):
            raise ScenarioError(f"{key} must be a finite number >= 0")
    t = sc.topology
    if t.relays > 1_000_000:
        raise ScenarioError("[topology] relays: at most 1,000,000")
    if t.relays < 2 or t.min_degree < 1 or t.max_degree < t.min_degree or t.relays <= t.max_degree:
        raise ScenarioError("[topology] needs relays > max_degree >= min_degree >= 1")
    if t.kind not in KINDS_OF_TOPOLOGY:
        raise ScenarioError(f"[topology] kind must be one of {', '.join(KINDS_OF_TOPOLOGY)}, not {t.kind!r}")
    if t.clusters and t.kind == "random":
        raise ScenarioError("[topology] clusters places relays on the square: it needs kind geographic or built")
    _check_degrees(t, sc.engine)
    if not 0.0 <= sc.loss < 1.0:
        raise ScenarioError("[network] loss must be in [0, 1)")
    if sc.loss_model not in LOSS_MODELS:
        raise ScenarioError(f"[network] loss_model must be one of {', '.join(LOSS_MODELS)}, not {sc.loss_model!r}")
    hostile = 0
    for a in sc.adversaries:
        if a.kind not in KINDS:
            raise ScenarioError(f"[[adversaries]] kind must be one of {', '.join(KINDS)}, not {a.kind!r}")
        if not 0.0 <= a.fraction < 1.0 or a.count < 0 or a.rate_per_s < 0 or a.rate_x < 0 or a.capacity_per_s <= 0:
            raise ScenarioError("[[adversaries]] needs 0 <= fraction < 1, count >= 0, rates >= 0, capacity_per_s > 0")
        if a.kind not in CLIENT_KINDS:
            hostile += a.count or int(round(a.fraction * t.relays))
        if a.kind == "stale_sender" and (sc.workload.refresh_interval_s <= 0 or a.devices < 1):
            raise ScenarioError("[[adversaries]] stale_sender needs devices >= 1 and [workload] refresh_interval_s > 0 "
                                "(its credentials go stale at refreshes)")
    if hostile >= t.relays:
        raise ScenarioError("[[adversaries]] leave no honest relay")
    w = sc.workload
    if w.pushes and w.registrations < 1:
        raise ScenarioError("[workload] pushes need at least one registration")
    if w.registrations and w.pushes > w.registrations * w.tokens_per_registration:
        raise ScenarioError("[workload] more pushes than tokens: raise tokens_per_registration")
    if not 0.0 <= w.multi_home_share <= 1.0:
        raise ScenarioError("[workload] multi_home_share must be in [0, 1]")
    if not 2 <= w.homes_per_device <= MAX_HOMES or w.homes_per_device >= t.relays:
        raise ScenarioError(f"[workload] homes_per_device must be 2 to {MAX_HOMES} (and fewer than the relays)")
    if w.multi_home_share and w.rotate:
        raise ScenarioError("[workload] multi_home_share and rotate cannot be combined (rotate re-uses a home)")
    if w.multi_home_reregister_s and w.refresh_interval_s:
        raise ScenarioError("[workload] multi_home_reregister_s and refresh_interval_s cannot be combined (both "
                            "number the device's epochs)")
    if sc.churn.multi_home_failures >= w.homes_per_device:
        raise ScenarioError(f"[churn] multi_home_failures = {sc.churn.multi_home_failures}: at most "
                            f"homes_per_device - 1 ({w.homes_per_device - 1}); a device keeps one home up")
    return sc
