"""The relay's Prometheus metrics: a `prometheus_client` collector over counters the relay already keeps.

The engine and the service count in plain dicts (a dict increment is all the hot path pays); this
collector reads them only when /metrics is scraped. prometheus_client renders the text format (label
values escaped, names checked). Names are prefixed `inri_`; counters end in `_total`; the list is in
docs/operations.md and the Grafana dashboard in deploy/ reads them.

Each counter comes from exactly one source, so a key counted by both the engine and the service
(`custody_expired`: the engine's deadline sweep, the service's settled statuses) is two series, never
one value overwriting the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from inri.common.buildinfo import build_info
from inri.node.reachability import AnnounceOutcome, Reachability
from inri.node.service import PUSH_LATENCY_BUCKETS

if TYPE_CHECKING:
    from inri.node.api import RelayApi
    from inri.node.service import RelayService

# Counter key prefix -> (metric name, label): every key with that prefix becomes one labelled sample,
# so a new drop reason shows up without touching this table. Engine and service tables are separate.
_ENGINE_LABELLED = (
    ("reg_dropped_", "inri_gossip_dropped", "reason"),
    ("push_refused_", "inri_pushes_refused", "reason"),
    ("push_dropped_", "inri_pushes_dropped", "reason"),
    ("score_", "inri_peer_penalties", "reason"),
)
_SERVICE_LABELLED = (
    ("custody_", "inri_custody_settled", "status"),
    ("frames_in_", "inri_frames_in", "type"),
    ("frames_out_", "inri_frames_out", "type"),
)
# metric -> (help, source, key); source "engine" or "service"
_PLAIN = {
    "inri_pushes_accepted": ("pushes accepted from home apps (202)", "service", "pushes_accepted"),
    "inri_pushes_delivered": ("pushes stored in a mailbox here", "service", "delivered_here"),
    "inri_pushes_in": ("push frames received from neighbours", "service", "frames_in_push"),
    "inri_pushes_out": ("push frames sent to neighbours", "service", "frames_out_push"),
    "inri_gossip_in": ("registration gossip frames received", "service", "frames_in_reg_gossip"),
    "inri_gossip_out": ("registration gossip frames sent", "service", "frames_out_reg_gossip"),
    "inri_gossip_duplicates": ("gossip arrivals already known (dropped)", "engine", "reg_duplicate"),
    "inri_frames_invalid": ("malformed frames from peers", "engine", "frames_invalid"),
    "inri_peers_cut": ("links cut because the neighbour's score fell too low", "engine", "peer_cut_score"),
    "inri_peers_cut_spared": ("cuts for missing receipts not made: the neighbour was the last link", "engine",
                              "peer_cut_spared_last_link"),
    "inri_pushes_overloaded": ("pushes answered 429 overloaded: custody beyond what the path drains", "service",
                               "pushes_refused_overloaded"),
    "inri_receipts_late": ("answers that came after receipt_timeout_s, in a slow neighbour's grace", "engine",
                           "receipt_in_grace"),
    "inri_receipts_late_credited": ("answers that came after their push was blamed: penalty given back",
                                    "engine", "receipt_late_credited"),
    "inri_internal_errors": ("frames whose handling raised (bugs)", "service", "internal_errors"),
    "inri_frames_dropped_congested": ("frames to a neighbour dropped: its send queue was full", "service",
                                      "frames_dropped_congested"),
    "inri_messages_acked": ("messages acknowledged and deleted", "service", "messages_acked"),
    "inri_devices_registered": ("devices registered", "service", "devices_registered"),
}
_ENGINE_PLAIN_KEYS = frozenset(key for _, source, key in _PLAIN.values() if source == "engine")
_ENGINE_PREFIXES = tuple(prefix for prefix, _, _ in _ENGINE_LABELLED)


class RelayCollector(Collector):
    """Every relay metric, read from the service, its engine and the API at scrape time."""

    def __init__(self, service: RelayService, api: RelayApi) -> None:
        self.service = service
        self.api = api

    def collect(self) -> Iterator[Metric]:
        service, api = self.service, self.api
        stats = service.engine.stats()  # table sizes plus the engine's counters (and reg_duplicate)
        sources = {"engine": stats, "service": service.counters}
        gauges = (
            ("inri_routes_cached", "route ids with a cached route vector", stats["routes"]),
            ("inri_neighbours", "neighbours both ends hold (rule M7)", len(service.listed_peers())),
            ("inri_routes_provisional", "routes learnt from a neighbour at link-up, not yet from gossip (G11)",
             stats["routes_provisional"]),
            ("inri_passive_peers", "passive-view candidates", stats["passive"]),
            ("inri_custody_pushes", "pushes held in custody (on disk until their receipt)", stats["custody"]),
            ("inri_reverse_path_entries", "reverse-path state entries", stats["reverse"]),
            ("inri_seen_cache_entries", "push seen-cache entries", stats["seen"]),
            ("inri_devices", "devices homed here", service.store.device_count()),
            ("inri_mailbox_messages", "stored, unacknowledged messages", service.store.mailbox_size()),
            ("inri_websockets_open", "open device streams", api.ws_open),
            ("inri_peers_banned", "neighbours cut for their score and refused for now", stats["banned"]),
            ("inri_pushes_awaiting_receipt", "forwarded pushes waiting for an answer", stats["awaiting_receipt"]),
            ("inri_custody_allowed", "pushes custody may hold before pushes get 429 (backpressure)",
             service.custody_allowed()),
            ("inri_custody_drain_per_s", "pushes settled per second (smoothed): what the paths drain",
             service.drain_rate),
        )
        for name, help_, value in gauges:
            yield GaugeMetricFamily(name, help_, value=value)
        for name, (help_, source, key) in _PLAIN.items():
            yield CounterMetricFamily(name, help_, value=sources[source].get(key, 0))
        for source, table in (("engine", _ENGINE_LABELLED), ("service", _SERVICE_LABELLED)):
            counters = sources[source]
            for prefix, name, label in table:
                family = CounterMetricFamily(name, f"by {label}", labels=[label])
                for key in sorted(counters):
                    if key.startswith(prefix):
                        family.add_metric([key[len(prefix):]], counters[key])
                yield family
        # Engine counters no table names (e.g. the deadline sweep's custody_expired): one labelled series.
        other = CounterMetricFamily("inri_engine_events", "other protocol engine counters", labels=["event"])
        for key in sorted(service.engine.counters):
            if key not in _ENGINE_PLAIN_KEYS and not key.startswith(_ENGINE_PREFIXES):
                other.add_metric([key], service.engine.counters[key])
        yield other
        endpoint = getattr(service.network, "endpoint", None)  # the QUIC endpoint (a LinkManager's)
        if endpoint is not None:
            quic = CounterMetricFamily("inri_quic_datagrams", "UDP datagrams of the QUIC endpoint (frames and "
                                       "acknowledgements), by direction", labels=["direction"])
            quic.add_metric(["in"], endpoint.stats.get("datagrams_in", 0))
            quic.add_metric(["out"], endpoint.stats.get("datagrams_out", 0))
            yield quic
            yield CounterMetricFamily("inri_quic_send_calls", "system calls that sent the datagrams out (one "
                                      "sendmsg sends several with UDP GSO)", value=endpoint.stats.get("send_calls", 0))
            refs = CounterMetricFamily("inri_link_registration_refs", "push frames sent with their registration "
                                       "by reference on inri/2 links (kind=define: the registration went along, "
                                       "filling a slot)", labels=["kind"])
            defined = endpoint.stats.get("regref_defined", 0)
            refs.add_metric(["reference"], endpoint.stats.get("regref_sent", 0) - defined)
            refs.add_metric(["define"], defined)
            yield refs
            yield CounterMetricFamily("inri_link_registration_ref_bytes_saved", "bytes of push frames not sent "
                                      "thanks to registration references",
                                      value=endpoint.stats.get("regref_bytes_saved", 0))
            yield CounterMetricFamily("inri_links_replaced", "links replaced by a new one the same neighbour "
                                      "dialled (it restarted: links.py)",
                                      value=getattr(service.network, "stats", {}).get("links_replaced", 0))
        limited = CounterMetricFamily("inri_rate_limited", "requests refused by a rate limit (per client, device, "
                                      "token)", labels=["key"])
        for key, limiter in (("client", api.rate), ("device", api.device_rate), ("token", api.token_rate),
                             ("vapid_key", api.vapid_rate), ("webpush_endpoint", api.wp_endpoint_rate)):
            limited.add_metric([key], limiter.hits)
        yield limited
        yield api.http_codes.metric("inri_http_responses")
        yield from api.front.metrics("inri_http")  # the HTTP front: connections, deadlines, shedding, restarts
        yield CounterMetricFamily("inri_webpush_accepted", "Web Push pushes answered 201 at this relay",
                                  value=api.wp_counts.get("accepted", 0))
        refused = CounterMetricFamily("inri_webpush_refused", "Web Push pushes refused at this relay, by HTTP "
                                      "status (404/410 include the home relay's answers)", labels=["status"])
        for key in sorted(api.wp_counts):
            if key.startswith("refused_"):
                refused.add_metric([key[len("refused_"):]], api.wp_counts[key])
        yield refused
        yield GaugeMetricFamily("inri_webpush_endpoints", "live Web Push endpoints of devices homed here",
                                value=service.store.endpoint_count())
        yield GaugeMetricFamily("inri_webpush_negative_cache", "endpoints answered 404/410 from the cache",
                                value=len(api.wp_gone))
        yield from _wake_metrics(service.wake.stats())
        yield from _reachability_metrics(service.reachability, service.clock())
        yield from _mozpush_metrics(api)
        buckets: list[tuple[str, float]] = []
        cum = 0
        for bound, n in zip(PUSH_LATENCY_BUCKETS, service.push_latency, strict=False):
            cum += n
            buckets.append((str(bound), cum))
        buckets.append(("+Inf", cum + service.push_latency[-1]))
        yield HistogramMetricFamily("inri_push_accept_seconds", "time to verify, commit and send a push a home "
                                    "app injected", buckets=buckets, sum_value=service.push_latency_sum)


def _reachability_metrics(reach: Reachability, now: float) -> Iterator[Metric]:
    """Whether the mesh can reach this relay (inri/node/reachability.py)."""
    yield GaugeMetricFamily("inri_unreachable_from_bootstrap", "1 while the last announcement was refused because "
                            "the bootstrap could not reach the relay's public address over QUIC (open UDP)",
                            value=int(reach.outcome is AnnounceOutcome.UNREACHABLE))
    yield GaugeMetricFamily("inri_isolated_seconds", "seconds since the relay last had a neighbour (0 while linked)",
                            value=reach.isolated_for(now))
    failed = CounterMetricFamily("inri_announce_failures", "announcements no bootstrap listed, by outcome",
                                 labels=["outcome"])
    for outcome in sorted(reach.failures):
        failed.add_metric([outcome], reach.failures[outcome])
    yield failed


def _wake_metrics(wake: dict[str, int]) -> Iterator[Metric]:
    """Wake hooks (inri/node/wake.py, docs/gateway.md)."""
    yield GaugeMetricFamily("inri_wake_hooks", "devices (and user agents) homed here with a wake hook",
                            value=wake["hooks"])
    requests = CounterMetricFamily("inri_wake_requests", "wake-up requests to gateways, by outcome (sent, gone: "
                                   "the hook was dropped, retry, refused)", labels=["outcome"])
    for outcome in ("sent", "gone", "retry", "refused"):
        requests.add_metric([outcome], wake.get("requests_" + outcome, 0))
    yield requests
    suppressed = CounterMetricFamily("inri_wake_suppressed", "wake-ups not sent, by reason (coalesced: mail "
                                     "within a window; rate_limited: deferred)", labels=["reason"])
    for reason, key in (("coalesced", "coalesced"), ("rate_limited", "rate_limited"),
                        ("stream_open", "skipped_stream_open"), ("nothing_waiting", "skipped_nothing_waiting")):
        suppressed.add_metric([reason], wake.get(key, 0))
    yield suppressed
    yield CounterMetricFamily("inri_wake_given_up", "wake-ups given up after [wake] retry_attempts failures",
                              value=wake.get("given_up", 0))


def relay_registry(service: RelayService, api: RelayApi) -> CollectorRegistry:
    """A registry of its own per relay (never the process-global one: tests run several relays)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RelayCollector(service, api))
    build_info(registry, "relay")
    return registry


def parse_metrics(text: str) -> dict[str, float]:
    """'name{label="v",...}' -> value for every sample of a scrape (parsed by prometheus_client)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            values[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return values


def _mozpush_metrics(api: RelayApi) -> Iterator[Metric]:
    """Mozilla Push (docs/browsers.md): connections, agents, channels, acks and nacks by code, closes by code."""
    mp = api.mozpush
    status = mp.status()
    yield GaugeMetricFamily("inri_mozpush_connections_open", "open Mozilla Push connections", value=mp.open)
    yield GaugeMetricFamily("inri_mozpush_agents", "user agents homed here", value=status["agents"])
    yield GaugeMetricFamily("inri_mozpush_channels", "user agents' channels (INRI registrations) homed here",
                            value=status["channels"])
    counts = {**api.agents.counts, **mp.counts}
    for name, help_, prefix in (("inri_mozpush_acks", "acks by code (100 delivered, 101 decryption error, "
                                 "102 not delivered)", "acks_"),
                                ("inri_mozpush_nacks", "nacks by code (301-303: the service worker failed)", "nacks_"),
                                ("inri_mozpush_closed", "connections closed by the relay, by close code", "closed_")):
        family = CounterMetricFamily(name, help_, labels=["code"])
        for key in sorted(k for k in counts if k.startswith(prefix)):
            family.add_metric([key[len(prefix):]], counts[key])
        yield family
    for key, help_ in (("connections", "Mozilla Push connections accepted"),
                       ("notifications_sent", "notification messages written"),
                       ("channels_registered", "channels registered"),
                       ("channels_unregistered", "channels unregistered"),
                       ("registrations_refreshed", "channel registrations re-signed before they expired"),
                       ("agents_expired", "user agents dropped after agent_idle_max_s unseen"),
                       ("write_timeouts", "connections ended because a write stalled"),
                       ("refused_rate", "connections refused for the client address's rate limit")):
        yield CounterMetricFamily(f"inri_mozpush_{key}", help_, value=counts.get(key, 0))
