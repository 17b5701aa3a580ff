"""The gateway's Prometheus metrics, read from its counters at scrape time (as the relay's: inri/node/metrics.py).

Names are prefixed `inri_gateway_`; the list is in docs/gateway.md ("Metrics").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from inri.gateway.app import GatewayApp

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # seconds at the provider


class GatewayCollector(Collector):
    """Every gateway metric, from the app and its providers."""

    def __init__(self, app: GatewayApp) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        app = self.app
        wakes = CounterMetricFamily("inri_gateway_wakes", "wake-ups asked of a provider, by provider and outcome "
                                    "(sent, gone, backoff, failed)", labels=["provider", "outcome"])
        refused = CounterMetricFamily("inri_gateway_refused", "wake requests answered without asking a provider, "
                                      "by reason", labels=["reason"])
        for key in sorted(app.counters):
            if key.startswith("wakes_"):
                prov, _, outcome = key[len("wakes_"):].partition("_")
                wakes.add_metric([prov, outcome], app.counters[key])
            elif key.startswith("refused_"):
                refused.add_metric([key[len("refused_"):]], app.counters[key])
        yield wakes
        yield refused
        answers = CounterMetricFamily("inri_gateway_provider_responses", "answers of APNs/FCM (and the OAuth "
                                      "token endpoint: token_status_*), by status", labels=["provider", "status"])
        refreshes = CounterMetricFamily("inri_gateway_provider_token_refreshes", "provider credentials made anew: "
                                        "APNs JWTs, FCM access tokens", labels=["provider"])
        for name, provider in sorted(app.providers.items()):
            for key in sorted(provider.counters):
                if key.startswith(("status_", "token_status_")) or key == "unreachable":
                    answers.add_metric([name.value, key.removeprefix("status_")], provider.counters[key])
            refreshes.add_metric([name.value], provider.counters.get("token_refreshes", 0))
        yield answers
        yield refreshes
        family = HistogramMetricFamily("inri_gateway_provider_seconds", "time of one wake-up at the provider, "
                                       "retries included", labels=["provider"])
        for name in sorted(app.providers):
            cum, buckets = 0, []
            for bound, n in zip(LATENCY_BUCKETS, app.latency[name], strict=False):
                cum += n
                buckets.append((str(bound), cum))
            buckets.append(("+Inf", cum + app.latency[name][-1]))
            family.add_metric([name.value], buckets, app.latency_sum[name])
        yield family
        yield app.http_codes.metric("inri_gateway_http_responses")


def gateway_registry(app: GatewayApp) -> CollectorRegistry:
    """A registry of its own per gateway app (tests run several)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(app))
    return registry
