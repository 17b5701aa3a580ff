"""The bootstrap node: announce, peer lists, record sync, health and metrics over HTTP (inri/common/front).

Announce rules, in the order they are checked (each refusal has a stable code, docs/operations.md):
size (413 too_large) -> rate (429 rate_limited) -> decoding (400 malformed) -> signature (403
bad_signature) -> freshness (400 stale_record) -> sequence (409 replayed_seq) -> addresses (403
address_not_allowed) -> per-prefix cap (409 prefix_full) -> capacity (503 full) -> QUIC handshake
back to the address proving the node key (422 unreachable). Only then is the record stored and
listed; a refused announcement changes nothing.

Records from peer bootstraps go through the same checks (they are signed by the relays, not by the
peer bootstrap) including the probe, so one bad bootstrap cannot list what it could not prove.
"""

from __future__ import annotations

import ipaddress
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import structlog
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bootstrap_nodes.config import BootstrapConfig
from bootstrap_nodes.ranking import Candidate, prefix_of, rank
from bootstrap_nodes.store import RecordStore
from inri.common.addr import rate_key
from inri.common.b64url import b64d, b64e
from inri.common.buildinfo import build_info
from inri.common.front import FrontStats
from inri.common.http import (
    Problem,
    Receive,
    Request,
    Route,
    Router,
    Scope,
    Send,
    StatusCounts,
    metrics_answer,
    respond,
    respond_problem,
    serve_lifespan,
)
from inri.core.budget import KeyedBuckets
from inri.protocol.codec import DecodeError
from inri.protocol.peer_record import MAX_RECORD_BYTES, PeerRecord, decode_record, verify_record

log = structlog.get_logger("inri.bootstrap")

Prober = Callable[[str, str], Awaitable[bool]]  # (addr, node_id) -> key proven at addr
MAX_PROBES = 16  # concurrent QUIC probes: bounds what an announce flood can make us send
RECORDS_PAGE = 1000  # records per /v1/records answer; a peer pages through the rest with `next`
SWEEP_S = 10.0
# A record with capacity 0 withdraws its node id (`inri relay rotate-key`): it is kept, never listed,
# until it expires, so an older copy synced from a peer cannot list the retired identity again.
WITHDRAWN = 0


Refused = Problem  # an announcement or request refused with an HTTP status and a stable code


def _client(scope: Scope) -> str:
    return str((scope.get("client") or ("unknown", 0))[0])


def _host(addr: str) -> str:
    host = addr.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") else host


class Bootstrap:
    """The bootstrap node's state and rules (the ASGI app and background loops wrap it)."""

    def __init__(self, cfg: BootstrapConfig, prober: Prober, *, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        data = Path(cfg.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.store = RecordStore(data / "records.sqlite3")
        self.prober = prober
        self.clock = clock
        self.rng = random.Random()
        self.rate = KeyedBuckets(cfg.rate_per_s, cfg.rate_burst)  # per client address (IPv4, IPv6 /64)
        self.probe_limit = trio.CapacityLimiter(MAX_PROBES)
        self.counters: dict[str, int] = {}
        self.store.expire(clock())

    def count(self, name: str) -> None:
        """Add one to the event counter `name` (exported by /metrics)."""
        self.counters[name] = self.counters.get(name, 0) + 1

    def close(self) -> None:
        self.store.close()

    # -- records ----------------------------------------------------------------------------------

    def _address_allowed(self, addr: str) -> bool:
        try:
            ip = ipaddress.ip_address(_host(addr))
        except ValueError:
            return False  # IP literals only: a bootstrap never resolves names relays hand it
        # Python counts ::1 as reserved (it lies in ::/8): loopback is private, not reserved, here.
        if ip.is_unspecified or ip.is_multicast or (ip.is_reserved and not ip.is_loopback):
            return False
        if ip.is_loopback or ip.is_private or ip.is_link_local:
            return self.cfg.allow_private
        return True

    async def admit(self, raw: bytes, *, source: str, max_age_s: float | None = None) -> PeerRecord:
        """Check a record fully (module docstring order) and store it; Refused otherwise."""
        try:
            rec = decode_record(raw)
        except DecodeError as exc:
            code = "too_large" if exc.code == "too_large" else "malformed"
            raise Refused(413 if code == "too_large" else 400, code, exc.detail) from None
        if not verify_record(rec):
            raise Refused(403, "bad_signature", "record signature does not verify for its node key")
        now = self.clock()
        skew = self.cfg.max_skew_s
        oldest = now - (max_age_s if max_age_s is not None else skew)
        if rec.timestamp < oldest or rec.timestamp > now + skew:
            raise Refused(400, "stale_record", f"record timestamp {rec.timestamp} is outside the accepted window")
        old = self.store.get(rec.node_id)
        if old is not None and rec.seq <= old.record.seq:
            raise Refused(409, "replayed_seq", f"seq {rec.seq} is not newer than the stored {old.record.seq}")
        if rec.capacity == WITHDRAWN:  # key rotation: the old identity is dropped at once (never listed again)
            self.store.put(rec, None, rec.timestamp + self.cfg.record_ttl_s, now, source)
            return rec
        bad = [a for a in rec.addrs if not self._address_allowed(a)]
        if bad:
            raise Refused(403, "address_not_allowed", f"address {bad[0]} is not a public IP literal "
                          "(loopback/private need allow_private)")
        prefix = prefix_of(_host(rec.addrs[0]))
        if self.store.count_prefix(prefix, rec.node_id) >= self.cfg.per_prefix_max:
            raise Refused(409, "prefix_full", f"{prefix} already has {self.cfg.per_prefix_max} relays listed")
        if old is None and len(self.store.entries) >= self.cfg.max_records:
            raise Refused(503, "full", "this bootstrap holds its maximum number of records", retry_after=60)
        if old is not None and old.record.capacity != WITHDRAWN and not set(rec.addrs) & set(old.record.addrs):
            # The node moved, or a second process holds its key (a copied data directory): only a key
            # that no longer answers at its listed address may be listed elsewhere.
            async with self.probe_limit:
                still = [a for a in old.record.addrs if await self.prober(a, rec.node_id)]
            if still:
                raise Refused(409, "duplicate_identity", f"node {rec.node_id} is listed at {still[0]} and still "
                              "answers there with this key: two relays share one identity (a copied data "
                              "directory?); stop one of them")
        async with self.probe_limit:
            proven = [a for a in rec.addrs if await self.prober(a, rec.node_id)]
        if len(proven) != len(rec.addrs):
            missing = next(a for a in rec.addrs if a not in proven)
            raise Refused(422, "unreachable", f"no QUIC handshake with this node key at {missing}")
        current = self.store.get(rec.node_id)
        if current is not None and rec.seq <= current.record.seq:  # a newer one arrived while we probed
            raise Refused(409, "replayed_seq", "a newer record arrived meanwhile")
        self.store.put(rec, prefix, rec.timestamp + self.cfg.record_ttl_s, now, source)
        return rec

    def peers(self, asker: str | None, asker_geo: str | None, source_host: str, count: int) -> list[dict[str, Any]]:
        now = self.clock()
        entries = [e for e in self.store.entries.values() if e.expires_at > now and e.record.capacity != WITHDRAWN]
        mine = self.store.get(asker) if asker else None
        asker_prefix = mine.prefix if mine is not None else prefix_of(source_host)
        if asker_geo is None and mine is not None:
            asker_geo = mine.record.geo
        cands = [Candidate(e.record.node_id, e.record.addrs[0], e.prefix, e.record.geo) for e in entries]
        by_id = {e.record.node_id: e for e in entries}
        chosen = rank(cands, asker=asker, asker_prefix=asker_prefix, asker_geo=asker_geo,
                      count=min(count, self.cfg.max_peers_answer), rng=self.rng)
        return [{"node_id": c.node_id, "addr": c.addr, "geo": c.geo, "capacity": by_id[c.node_id].record.capacity,
                 "record": b64e(by_id[c.node_id].raw)} for c in chosen]

    # -- background -------------------------------------------------------------------------------

    async def sweep_loop(self) -> None:
        while True:
            await trio.sleep(SWEEP_S)
            n = self.store.expire(self.clock())
            if n:
                log.info("records expired", count=n)

    async def sync_loop(self) -> None:
        """Pull records from peer bootstraps (each re-checked and probed like an announcement)."""
        cursors: dict[str, float] = {}
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                for url in self.cfg.peers:
                    try:
                        await self._sync_from(client, url, cursors)
                    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
                        self.count("sync_failed")
                        log.debug("sync failed", peer=url, error=str(exc))
                await trio.sleep(self.cfg.sync_interval_s)

    async def _sync_from(self, client: httpx.AsyncClient, url: str, cursors: dict[str, float]) -> None:
        """Pull every record the peer changed since our cursor, page by page (RECORDS_PAGE each).

        The cursor moves to the peer's `now` only after the last page: jumping there after the first
        page would skip for good whatever did not fit in it. A peer can make us read at most enough
        pages to hold `max_records` records per interval, and every page must move its cursor forward.
        """
        since, after = cursors.get(url, 0.0), ""
        for _ in range(self.cfg.max_records // RECORDS_PAGE + 2):
            r = await client.get(url.rstrip("/") + "/v1/records", params={"since": since, "after": after})
            r.raise_for_status()
            data = r.json()
            for text in data["records"][:RECORDS_PAGE]:
                try:
                    raw = b64d(text, "record", max_size=MAX_RECORD_BYTES)
                    await self.admit(raw, source=url, max_age_s=self.cfg.record_ttl_s)
                    self.count("sync_admitted")
                except (Refused, ValueError) as exc:
                    if not (isinstance(exc, Refused) and exc.code == "replayed_seq"):
                        self.count("sync_refused")
            nxt = data.get("next")
            if nxt is None:
                cursors[url] = float(data["now"]) - 1.0  # a little overlap: clocks of peers differ
                return
            cursor = (float(nxt["since"]), str(nxt["after"]))
            if cursor <= (since, after):
                raise ValueError(f"{url}: records cursor does not advance")
            since, after = cursor
            cursors[url] = since - 1.0  # what we have read so far stays read if a later page fails
        self.count("sync_pages_exhausted")


TITLES = {
    "too_large": "Request body too large", "rate_limited": "Too many requests", "malformed": "Malformed request",
    "bad_signature": "Record signature does not verify", "stale_record": "Record timestamp out of window",
    "replayed_seq": "Record sequence number not newer", "address_not_allowed": "Address not allowed",
    "prefix_full": "Network prefix full", "full": "Bootstrap full", "unreachable": "Relay not reachable",
    "not_found": "Not found", "method_not_allowed": "Method not allowed", "internal": "Internal error",
}
UNLIMITED_PATHS = frozenset({"/healthz", "/metrics"})


class BootstrapCollector(Collector):
    """The bootstrap's metrics, read from its counters at scrape time."""

    def __init__(self, app: BootstrapApp) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        boot = self.app.boot
        yield GaugeMetricFamily("inri_bootstrap_records", "relay records held", value=len(boot.store.entries))
        events = CounterMetricFamily("inri_bootstrap_events", "announcements, syncs, peer lists and refusals "
                                     "by event", labels=["event"])
        for key in sorted(boot.counters):
            events.add_metric([key], boot.counters[key])
        yield events
        yield CounterMetricFamily("inri_bootstrap_rate_limited", "requests refused by the per-address rate limit",
                                  value=boot.rate.hits)
        yield self.app.http_codes.metric("inri_bootstrap_http_responses")
        yield from self.app.front.metrics("inri_bootstrap_http")


class BootstrapApp:
    """ASGI app over a Bootstrap (routing, limits and problem+json from inri.common.http)."""

    def __init__(self, boot: Bootstrap) -> None:
        self.boot = boot
        self.http_codes = StatusCounts()
        self.front = FrontStats()  # the HTTP front serving this app counts here (inri_bootstrap_http_* metrics)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BootstrapCollector(self))
        build_info(self.registry, "bootstrap")
        self.router = Router([
            Route("GET", "/healthz", self.health),
            Route("GET", "/metrics", self.metrics),
            Route("POST", "/v1/announce", self.announce, boot.cfg.max_body_bytes),
            Route("GET", "/v1/peers", self.peers),
            Route("GET", "/v1/records", self.records),
        ])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            route, params = self.router.match(scope["method"], scope["path"])
            if scope["path"] not in UNLIMITED_PATHS:
                wait = self.boot.rate.take(rate_key(str((scope.get("client") or ("unknown", 0))[0])))
                if wait:
                    raise Problem(429, "rate_limited", "too many requests from this address",
                                  retry_after=max(1, math.ceil(wait)))
            status, payload = await route.handler(Request(scope, receive, route.max_body), **params)
        except Problem as p:
            self.boot.count("refused_" + p.code)
            if scope["path"] == "/v1/announce":
                self.boot.count("announce_failed")
                log.info("announce refused", code=p.code, detail=p.detail, client=_client(scope))
            await respond_problem(send, self.http_codes, p, scope["path"], TITLES)
            return
        except Exception:  # answer 500, keep serving
            log.exception("request failed", path=scope.get("path"))
            await respond_problem(send, self.http_codes, Problem(500, "internal", "internal error"), scope["path"],
                                  TITLES)
            return
        await respond(send, self.http_codes, status, payload)

    async def health(self, req: Request) -> tuple[int, Any]:
        return 200, {"status": "ok", "records": len(self.boot.store.entries)}

    async def metrics(self, req: Request) -> tuple[int, Any]:
        return 200, metrics_answer(self.registry)

    async def announce(self, req: Request) -> tuple[int, Any]:
        boot = self.boot
        raw = await req.body(malformed="malformed")
        rec = await boot.admit(raw, source="announce")
        expires = rec.timestamp + boot.cfg.record_ttl_s
        if rec.capacity == WITHDRAWN:
            boot.count("withdrawn")
            log.info("identity withdrawn", node_id=rec.node_id)
            return 200, {"listed": False, "withdrawn": True, "node_id": rec.node_id}
        boot.count("announce_accepted")
        log.info("announce accepted", node_id=rec.node_id, addrs=list(rec.addrs))
        return 200, {"listed": True, "node_id": rec.node_id, "expires_at": expires}

    async def peers(self, req: Request) -> tuple[int, Any]:
        query = req.query()
        try:
            count = int(query.get("count", "8"))
        except ValueError:
            raise Problem(400, "malformed", "count must be an integer") from None
        if not 1 <= count <= 64:
            raise Problem(400, "malformed", "count must be 1..64")
        host = str((req.scope.get("client") or ("", 0))[0])
        peers = self.boot.peers(query.get("node_id") or None, query.get("geo") or None, host, count)
        self.boot.count("peer_lists")
        return 200, {"peers": peers}

    async def records(self, req: Request) -> tuple[int, Any]:
        query = req.query()
        try:
            since = float(query.get("since", "0"))
        except ValueError:
            raise Problem(400, "malformed", "since must be a number") from None
        after = query.get("after", "")
        now = self.boot.clock()
        page = self.boot.store.since(since, after, RECORDS_PAGE + 1, now)
        answer: dict[str, Any] = {"records": [b64e(e.raw) for e in page[:RECORDS_PAGE]], "now": now, "next": None}
        if len(page) > RECORDS_PAGE:  # more to come: the cursor of the last record sent
            last = page[RECORDS_PAGE - 1]
            answer["next"] = {"since": last.updated_at, "after": last.record.node_id}
        return 200, answer
