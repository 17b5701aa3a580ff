"""Where the messages of `messages_per_delivered_push` go, push by push (issue 17).

Reads a simulator trace (`inri-sim run SCENARIO --trace-dir DIR`, summary or full level, Parquet or
JSON lines) and sums, for each push, the rows `messages_per_delivered_push` counts (`push_forwarded`,
`push_fallback`, `receipt_forwarded`, `route_error`, each `coalesce(count, 1)`: docs/metrics.md). Then
prints, by class of push, how many there are and what share of the messages they cost:

- `first attempt`: delivered, and its custodian never re-sent it (no `push_retry`);
- `re-sent`: delivered after at least one re-send;
- `excluded, never delivered`: excluded from `delivery_ratio` (its home was down or cut off when it was
  injected: `push_excluded`) and never delivered: searched for until the deadline;
- `late`: delivered, after the run's deadline (`deadline_s` in meta.json);
- `lost`: counted and never delivered.

Delivered means on time, as in the summary: the messages over the pushes delivered on time are
`messages_per_delivered_push`; the median per push shows what a typical push costs beside it.

Then the same messages by the state of the push's home (docs/metrics.md, "The home's state": the relay
of its route's latest `reg_originated` row before the injection; down from a `relay_down` row to the
next `relay_up` row, in trace order), with the messages each class spent while the home was down:

- `home up throughout`: up at injection and never down before the first delivery (or the trace's end);
- `home failed while it waited`: up at injection, then down before the first delivery;
- `home down at injection`;
- `no home in the trace`: its route has no earlier `reg_originated` row.

The first two are the pushes of `messages_per_delivered_push_live_home` (their messages over those of
them delivered on time), the middle two those of `messages_per_push_home_down` (their messages written
while the home was down, over their number): this split recounts both from the trace by row position,
independently of the simulator's collector, so the test can hold the summary to it.

Usage: python benchmarks/bench_push_costs.py [TRACE_DIR] [--scenario geo-5k-3n] [--seed S] [--json]
(no TRACE_DIR: runs the scenario first, with a summary trace in a temporary directory: 3-8 minutes for
geo-5k-3n on 2 cores)
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

_MESSAGES = frozenset({"push_forwarded", "push_fallback", "receipt_forwarded", "route_error"})
_RELAY_ROWS = frozenset({"relay_down", "relay_up"})  # no msg: the relay itself failed or came back
_KINDS = _MESSAGES | _RELAY_ROWS | {"push_injected", "push_delivered", "push_excluded", "push_retry", "reg_originated"}
_CLASSES = ("first attempt", "re-sent", "late", "excluded, never delivered", "lost")
_HOME_CLASSES = ("home up throughout", "home failed while it waited", "home down at injection", "no home in the trace")

Row = tuple[str, str, int | None, float, str, str | None]  # kind, msg ("" for relay rows), count, t, relay, route


def _rows(root: Path) -> Iterator[Row]:
    """The rows this bench reads, of every trace file under root, in trace order."""
    files = sorted(root.rglob("*.parquet")) + sorted(root.rglob("*.jsonl"))
    if not files:
        raise SystemExit(f"bench_push_costs: no *.parquet or *.jsonl trace under {root}")
    for f in files:
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq

            cols = ("kind", "msg", "count", "t", "relay", "route")
            table = pq.read_table(f, columns=list(cols))
            for kind, msg, count, t, relay, route in zip(*(table.column(c).to_pylist() for c in cols), strict=True):
                if kind in _KINDS and (msg or kind in _RELAY_ROWS):
                    yield kind, msg or "", count, t, relay, route
        else:
            with f.open() as fh:
                for line in fh:
                    e = json.loads(line)
                    if e.get("kind") in _KINDS and (e.get("msg") or e["kind"] in _RELAY_ROWS):
                        yield e["kind"], e.get("msg") or "", e.get("count"), e["t"], e["relay"], e.get("route")


class _Downtime:
    """Each relay's relay_down / relay_up rows by position in the trace."""

    def __init__(self) -> None:
        self.at: dict[str, list[int]] = {}  # relay -> positions of its rows
        self.up: dict[str, list[bool]] = {}  # relay -> the row at the same index is relay_up

    def add(self, relay: str, pos: int, up: bool) -> None:
        self.at.setdefault(relay, []).append(pos)
        self.up.setdefault(relay, []).append(up)

    def down(self, relay: str, pos: int) -> bool:
        """The relay is down at the row at `pos`: its latest row before it is relay_down."""
        i = bisect.bisect_left(self.at.get(relay, []), pos) - 1
        return i >= 0 and not self.up[relay][i]

    def fails_between(self, relay: str, start: int, end: int) -> bool:
        """A relay_down row of the relay lies strictly between the two positions."""
        at = self.at.get(relay, [])
        lo, hi = bisect.bisect_right(at, start), bisect.bisect_left(at, end)
        return not all(self.up.get(relay, [])[lo:hi])


def costs(root: Path) -> dict[str, object]:
    meta = root / "meta.json"
    deadline = float(json.loads(meta.read_text()).get("deadline_s", "inf")) if meta.exists() else float("inf")
    messages: Counter[str] = Counter()
    injected: dict[str, float] = {}
    delivered: dict[str, float] = {}
    excluded: set[str] = set()
    resent: set[str] = set()
    # By position in the trace, for the home split: each push's message rows, injection and first delivery;
    # each route's origins; each relay's downtime.
    written: dict[str, list[tuple[int, int]]] = {}
    injected_at: dict[str, tuple[int, str | None]] = {}
    delivered_at: dict[str, int] = {}
    origins: dict[str, list[tuple[int, str]]] = {}
    downtime = _Downtime()
    pos = 0
    for pos, (kind, msg, count, t, relay, route) in enumerate(_rows(root)):
        if kind in _MESSAGES:
            c = count if count is not None else 1
            messages[msg] += c
            written.setdefault(msg, []).append((pos, c))
        elif kind == "push_injected":
            injected.setdefault(msg, t)
            injected_at.setdefault(msg, (pos, route))
        elif kind == "push_delivered":
            delivered[msg] = min(t, delivered.get(msg, t))
            delivered_at.setdefault(msg, pos)
        elif kind == "push_excluded":
            excluded.add(msg)
        elif kind == "reg_originated":
            if route is not None:
                origins.setdefault(route, []).append((pos, relay))
        elif kind in _RELAY_ROWS:
            downtime.add(relay, pos, kind == "relay_up")
        else:
            resent.add(msg)
    on_time = {m for m, t in delivered.items() if m in injected and t - injected[m] <= deadline}

    def klass(m: str) -> str:
        if m in on_time:
            return "re-sent" if m in resent else "first attempt"
        if m in delivered:
            return "late"
        return "excluded, never delivered" if m in excluded else "lost"

    by: dict[str, list[int]] = {c: [] for c in _CLASSES}
    for m in injected:
        by[klass(m)].append(messages[m])
    total = sum(messages[m] for m in injected)
    per_delivered = [messages[m] for m in injected if m in on_time]
    out: dict[str, object] = {
        "pushes": len(injected), "delivered": len(per_delivered), "messages": total,
        "messages_per_delivered_push": round(total / len(per_delivered), 2) if per_delivered else None,
        "delivered_push_messages_median": statistics.median(per_delivered) if per_delivered else None,
        "messages_per_delivered_push_without_excluded": (
            round((total - sum(by["excluded, never delivered"])) / len(per_delivered), 2) if per_delivered else None),
        "classes": {c: {"pushes": len(v), "messages_share": round(sum(v) / total, 3) if total else 0.0,
                        "mean": round(statistics.fmean(v), 1) if v else None,
                        "median": statistics.median(v) if v else None} for c, v in by.items()},
        "home": _home_split(injected, messages, on_time, written, injected_at, delivered_at, origins, downtime,
                            end=pos + 1),
    }
    return out


def _home_split(injected: dict[str, float], messages: Counter[str], on_time: set[str],
                written: dict[str, list[tuple[int, int]]], injected_at: dict[str, tuple[int, str | None]],
                delivered_at: dict[str, int], origins: dict[str, list[tuple[int, str]]], downtime: _Downtime,
                end: int) -> dict[str, object]:
    """The pushes and their messages by the state of their home; the two home figures recounted."""
    total = sum(messages[m] for m in injected)
    by: dict[str, list[str]] = {c: [] for c in _HOME_CLASSES}
    while_down: Counter[str] = Counter()  # push -> its messages written while its home was down
    for m in injected:
        at, route = injected_at[m]
        homes = [relay for p, relay in origins.get(route or "", []) if p < at]
        if not homes:
            by["no home in the trace"].append(m)
            continue
        home = homes[-1]
        if downtime.down(home, at):
            klass = "home down at injection"
        elif downtime.fails_between(home, at, delivered_at.get(m, end)):
            klass = "home failed while it waited"
        else:
            by["home up throughout"].append(m)
            continue
        by[klass].append(m)
        while_down[m] = sum(c for p, c in written.get(m, []) if downtime.down(home, p))
    live = by["home up throughout"] + by["home failed while it waited"]
    live_delivered = sum(1 for m in live if m in on_time)
    exposed = by["home failed while it waited"] + by["home down at injection"]
    return {
        "messages_per_delivered_push_live_home": (
            sum(messages[m] for m in live) / live_delivered if live_delivered else None),
        "messages_per_push_home_down": sum(while_down[m] for m in exposed) / len(exposed) if exposed else None,
        "classes": {c: {"pushes": len(v), "delivered": sum(1 for m in v if m in on_time),
                        "messages_share": round(sum(messages[m] for m in v) / total, 3) if total else 0.0,
                        "mean": round(statistics.fmean(messages[m] for m in v), 1) if v else None,
                        "while_home_down_mean": (round(statistics.fmean(while_down[m] for m in v), 1)
                                                 if v and c in ("home failed while it waited", "home down at injection")
                                                 else None)}
                    for c, v in by.items()},
    }


def _f(x: object) -> str:
    return f"{x:.2f}" if isinstance(x, float) else str(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_dir", type=Path, nargs="?", help="a trace of `inri-sim run` (default: run --scenario)")
    ap.add_argument("--scenario", default="geo-5k-3n", help="run this scenario when no TRACE_DIR is given")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args()
    if args.trace_dir is None:
        with tempfile.TemporaryDirectory(prefix="inri-push-costs-") as tmp:
            cmd = [sys.executable, "-m", "simulations.cli", "run", args.scenario, "--trace-dir", tmp,
                   "--trace-level", "summary", "--progress", "off"]
            if args.seed is not None:
                cmd += ["--seed", str(args.seed)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            r = costs(Path(tmp))
    else:
        r = costs(args.trace_dir)
    if args.json:
        print(json.dumps(r))
        return
    print(f"{r['pushes']} pushes, {r['delivered']} delivered, {r['messages']} messages: "
          f"{r['messages_per_delivered_push']} per delivered push (median of a delivered push "
          f"{r['delivered_push_messages_median']}; {r['messages_per_delivered_push_without_excluded']} "
          f"without the excluded pushes never delivered)")
    print("| class | pushes | share of the messages | mean / median per push |")
    print("|---|---|---|---|")
    classes = r["classes"]
    assert isinstance(classes, dict)
    for c, v in classes.items():
        print(f"| {c} | {v['pushes']} | {v['messages_share']:.3f} | {v['mean']} / {v['median']} |")
    home = r["home"]
    assert isinstance(home, dict)
    print(f"by the home's state: {_f(home['messages_per_delivered_push_live_home'])} messages per delivered push "
          f"whose home was up at injection; {_f(home['messages_per_push_home_down'])} messages per push while its "
          "home was down")
    print("| home | pushes | delivered | share of the messages | mean per push | of which while the home was down |")
    print("|---|---|---|---|---|---|")
    for c, v in home["classes"].items():
        print(f"| {c} | {v['pushes']} | {v['delivered']} | {v['messages_share']:.3f} | {v['mean']} "
              f"| {v['while_home_down_mean'] if v['while_home_down_mean'] is not None else '-'} |")
    excluded = classes["excluded, never delivered"]
    print(json.dumps({"bench": "push_costs", "figures": [
        {"metric": "messages_per_delivered_push", "value": r["messages_per_delivered_push"], "unit": "messages"},
        {"metric": "delivered push messages, median", "value": r["delivered_push_messages_median"],
         "unit": "messages"},
        {"metric": "share of messages: pushes excluded (home down) and never delivered",
         "value": excluded["messages_share"], "unit": "share"},
        *({"metric": k, "value": round(v, 2) if isinstance(v, float) else v, "unit": "messages"}
          for k in ("messages_per_delivered_push_live_home", "messages_per_push_home_down") for v in [home[k]])]}))


if __name__ == "__main__":
    main()
