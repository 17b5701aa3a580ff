"""Prometheus text exposition (format 0.0.4) of a relay's counters, gauges and histograms.

No client library: the relay's metrics are a few dozen numbers it already keeps, rendered on demand
at GET /metrics. Names are prefixed `inri_`; counters end in `_total`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inri.node.service import PUSH_LATENCY_BUCKETS

if TYPE_CHECKING:
    from inri.node.api import RelayApi
    from inri.node.service import RelayService

# engine counter prefix -> (metric name, label name): every counter with that prefix becomes one
# labelled series, so a new drop reason in the engine shows up without touching this table.
_LABELLED = (
    ("reg_dropped_", "inri_gossip_dropped_total", "reason"),
    ("push_refused_", "inri_pushes_refused_total", "reason"),
    ("push_dropped_", "inri_pushes_dropped_total", "reason"),
    ("custody_", "inri_custody_settled_total", "status"),
    ("frames_in_", "inri_frames_in_total", "type"),
    ("frames_out_", "inri_frames_out_total", "type"),
    ("score_", "inri_peer_penalties_total", "reason"),
)


def _line(out: list[str], name: str, value: float, labels: dict[str, str] | None = None) -> None:
    if labels:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        out.append(f"{name}{{{inner}}} {value}")
    else:
        out.append(f"{name} {value}")


def render_metrics(service: RelayService, api: RelayApi, extra: dict[str, int]) -> str:
    """Every metric as Prometheus text."""
    out: list[str] = []
    eng = service.engine
    stats = eng.stats()
    counters: dict[str, int] = {**eng.counters, **service.counters, "reg_duplicate": eng.reg_duplicates}

    def typed(name: str, kind: str, help_: str) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")

    gauges = {
        "inri_routes_cached": ("route ids with a cached route vector", stats["routes"]),
        "inri_neighbours": ("active neighbours", stats["active"]),
        "inri_passive_peers": ("passive-view candidates", stats["passive"]),
        "inri_custody_pushes": ("pushes held in custody (on disk until their receipt)", stats["custody"]),
        "inri_reverse_path_entries": ("reverse-path state entries", stats["reverse"]),
        "inri_seen_cache_entries": ("push seen-cache entries", stats["seen"]),
        "inri_devices": ("devices homed here", service.store.device_count()),
        "inri_mailbox_messages": ("stored, unacknowledged messages", service.store.mailbox_size()),
        "inri_websockets_open": ("open device streams", api.ws_open),
        "inri_peers_banned": ("neighbours cut for their score and refused for now", stats["banned"]),
        "inri_pushes_awaiting_receipt": ("forwarded pushes waiting for an answer", stats["awaiting_receipt"]),
    }
    for name, (help_, value) in gauges.items():
        typed(name, "gauge", help_)
        _line(out, name, value)
    plain = {
        "inri_pushes_accepted_total": ("pushes accepted from home apps (202)", "pushes_accepted"),
        "inri_pushes_delivered_total": ("pushes stored in a mailbox here", "delivered_here"),
        "inri_pushes_in_total": ("push frames received from neighbours", "frames_in_push"),
        "inri_pushes_out_total": ("push frames sent to neighbours", "frames_out_push"),
        "inri_gossip_in_total": ("registration gossip frames received", "frames_in_reg_gossip"),
        "inri_gossip_out_total": ("registration gossip frames sent", "frames_out_reg_gossip"),
        "inri_gossip_duplicates_total": ("gossip arrivals already known (dropped)", "reg_duplicate"),
        "inri_frames_invalid_total": ("malformed frames from peers", "frames_invalid"),
        "inri_peers_cut_total": ("links cut because the neighbour's score fell too low", "peer_cut_score"),
        "inri_internal_errors_total": ("frames whose handling raised (bugs)", "internal_errors"),
        "inri_frames_dropped_congested_total": ("frames to a neighbour dropped: its send queue was full",
                                                "frames_dropped_congested"),
        "inri_messages_acked_total": ("messages acknowledged and deleted", "messages_acked"),
        "inri_devices_registered_total": ("devices registered", "devices_registered"),
    }
    for name, (help_, key) in plain.items():
        typed(name, "counter", help_)
        _line(out, name, counters.get(key, 0))
    for prefix, name, label in _LABELLED:
        typed(name, "counter", f"by {label}")
        for key in sorted(counters):
            if key.startswith(prefix):
                _line(out, name, counters[key], {label: key[len(prefix):]})
    typed("inri_rate_limited_total", "counter", "requests refused by a rate limit (per client, device, token)")
    _line(out, "inri_rate_limited_total", api.rate.hits, {"key": "client"})
    _line(out, "inri_rate_limited_total", api.device_rate.hits, {"key": "device"})
    _line(out, "inri_rate_limited_total", api.token_rate.hits, {"key": "token"})
    typed("inri_http_responses_total", "counter", "HTTP responses by status code")
    for code in sorted(api.http_codes):
        _line(out, "inri_http_responses_total", api.http_codes[code], {"code": str(code)})
    for key in sorted(extra):
        name = "inri_" + key + ("_total" if not key.endswith("_total") else "")
        typed(name, "counter", key.replace("_", " "))
        _line(out, name, extra[key])
    name = "inri_push_accept_seconds"
    typed(name, "histogram", "time to verify, commit and send a push a home app injected")
    cum = 0
    for bound, n in zip(PUSH_LATENCY_BUCKETS, service.push_latency, strict=False):
        cum += n
        _line(out, name + "_bucket", cum, {"le": str(bound)})
    cum += service.push_latency[-1]
    _line(out, name + "_bucket", cum, {"le": "+Inf"})
    _line(out, name + "_sum", round(service.push_latency_sum, 6))
    _line(out, name + "_count", cum)
    return "\n".join(out) + "\n"


def parse_metrics(text: str) -> dict[str, float]:
    """'name{labels}' -> value, for tests and tools (not a full Prometheus parser)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


__all__: list[Any] = ["render_metrics", "parse_metrics"]
