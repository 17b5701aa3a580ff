"""The relay side of bootstrap nodes: announce this relay, refresh the announcement, fetch peers.

A relay configured with several bootstrap URLs uses any that answers: announcements go to the
first that accepts (in shuffled order, so load spreads), peer lists merge the answers of two.
Peer entries are signed records; the client re-verifies each signature, so a bootstrap can omit
relays but cannot invent or alter one.

One HTTP client (connection pool, TLS context) serves every request of a relay's lifetime: building
one per request cost an isolated relay 7% of its CPU in one profile. A relay that keeps asking for
peers without finding any backs off (`Backoff`) instead of polling every 2 s.
"""

from __future__ import annotations

import random
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

from inri.common.b64url import b64d
from inri.common.identity import NodeIdentity
from inri.protocol.codec import DecodeError
from inri.protocol.messages import PeerInfo
from inri.protocol.peer_record import PeerRecord, decode_record, encode_record, make_peer_record, verify_record

# `code` of a BootstrapError when no bootstrap answered at all (a bootstrap's own refusal of an address
# it could not reach is its problem code "unreachable").
NO_ANSWER = "no_answer"


class BootstrapError(Exception):
    """No bootstrap accepted the request; `code` is the last problem code (or NO_ANSWER)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def load_seed_list(path: str | Path | None = None) -> list[str]:
    """Bootstrap URLs from a seed-list TOML file (default: bootstrap_nodes/default.toml)."""
    if path is None:
        text = resources.files("bootstrap_nodes").joinpath("default.toml").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    data = tomllib.loads(text)
    urls = []
    for entry in data.get("bootstrap", []):
        url = entry.get("url") if isinstance(entry, dict) else None
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"seed list entry without a valid url: {entry!r}")
        urls.append(url)
    return urls


def make_record(
    identity: NodeIdentity, addrs: list[str], geo: str | None, capacity: int, seq: int, now: int
) -> PeerRecord:
    """This relay's signed announcement."""
    return make_peer_record(identity.signing_key, addrs, geo or "", capacity, now, seq)


def _problem(r: httpx.Response) -> tuple[str, str]:
    try:
        body = r.json()
        return str(body.get("code", r.status_code)), str(body.get("detail", ""))
    except (ValueError, RecursionError, AttributeError):
        return str(r.status_code), r.text[:200]


@dataclass
class Backoff:
    """Retry delays that double from `first_s` up to `max_s`, each drawn from [cap/2, cap].

    The random half ("equal jitter") keeps relays that started together (a data-centre reboot) from
    asking their bootstrap in lockstep; the floor of cap/2 keeps the delays growing. `reset()` when
    the thing waited for made progress.
    """

    first_s: float
    max_s: float
    rng: random.Random = field(default_factory=random.Random)
    _cap: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start again from first_s."""
        self._cap = min(self.first_s, self.max_s)

    def next(self) -> float:
        """The next delay in seconds."""
        cap = self._cap
        self._cap = min(cap * 2.0, self.max_s)
        return self.rng.uniform(cap / 2.0, cap)


class BootstrapClient:
    """Talks to a list of bootstrap nodes over one HTTP client; `aclose()` when done."""

    def __init__(self, urls: list[str], *, timeout_s: float = 3.0, local_address: str | None = None,
                 announce_timeout_s: float = 15.0) -> None:
        if not urls:
            raise ValueError("no bootstrap URLs configured")
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = timeout_s
        # An announcement waits for the bootstrap's QUIC probes of its addresses: longer than they may take,
        # so the bootstrap's verdict ("unreachable") arrives, not a timeout (inri.node.reachability).
        self.announce_timeout_s = announce_timeout_s
        # Addresses a bootstrap listed under this relay's own node id that are not this relay's: another
        # process holds the same key (a copied data directory). fetch_peers fills it; the relay logs it.
        self.impostors: set[str] = set()
        self.local_address = local_address  # bind the source address (tests with many 127.0.0.x relays)
        self._http: httpx.AsyncClient | None = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:  # made on first use, then kept: its pool keeps connections to bootstraps open
            transport = httpx.AsyncHTTPTransport(local_address=self.local_address) if self.local_address else None
            self._http = httpx.AsyncClient(timeout=self.timeout_s, transport=transport)
        return self._http

    async def aclose(self) -> None:
        """Close the HTTP client (a later request makes a new one)."""
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()

    async def __aenter__(self) -> BootstrapClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def announce(self, record: PeerRecord) -> str:
        """Announce to the first bootstrap that accepts; returns its URL. BootstrapError if none did."""
        body = encode_record(record)
        last = (NO_ANSWER, "no bootstrap answered")
        urls = self.urls[:]
        random.shuffle(urls)
        client = self._client()
        for url in urls:
            try:
                r = await client.post(url + "/v1/announce", content=body, timeout=self.announce_timeout_s,
                                      headers={"content-type": "application/msgpack"})
            except httpx.HTTPError as exc:
                last = (NO_ANSWER, f"{url}: {type(exc).__name__}")
                continue
            if r.status_code == 200:
                return url
            last = _problem(r)
            if last[0] in ("bad_signature", "malformed", "too_large", "replayed_seq", "duplicate_identity"):
                break  # every bootstrap would refuse this record the same way
        raise BootstrapError(*last)

    async def fetch_peers(self, node_id: str, geo: str | None, count: int,
                          own_addrs: tuple[str, ...] = ()) -> list[PeerInfo]:
        """Peers from up to two bootstraps, signatures re-checked, merged without duplicates or ourselves.

        A record of our own node id at addresses other than `own_addrs` goes to `impostors`."""
        urls = self.urls[:]
        random.shuffle(urls)
        found: dict[str, PeerInfo] = {}
        answered = 0
        last = (NO_ANSWER, "no bootstrap answered")
        client = self._client()
        for url in urls:
            if answered >= 2:
                break
            params: dict[str, Any] = {"node_id": node_id, "count": count}
            if geo:
                params["geo"] = geo
            try:
                r = await client.get(url + "/v1/peers", params=params)
            except httpx.HTTPError as exc:
                last = (NO_ANSWER, f"{url}: {type(exc).__name__}")
                continue
            if r.status_code != 200:
                last = _problem(r)
                continue
            answered += 1
            try:
                entries = r.json()["peers"]
            except (ValueError, KeyError, TypeError, RecursionError):  # deep nesting: RecursionError
                continue
            for entry in entries if isinstance(entries, list) else []:
                rec = verified_entry(entry)
                if rec is not None and rec.node_id != node_id:
                    found.setdefault(rec.node_id, PeerInfo(rec.node_id, rec.addrs[0]))
                elif rec is not None and own_addrs and not set(rec.addrs) & set(own_addrs):
                    self.impostors.update(rec.addrs)
        if not answered:
            raise BootstrapError(*last)
        return list(found.values())


def verified_entry(entry: Any) -> PeerRecord | None:
    try:
        rec = decode_record(b64d(entry["record"], "record"))
    except (KeyError, TypeError, ValueError, DecodeError):
        return None
    return rec if verify_record(rec) else None
