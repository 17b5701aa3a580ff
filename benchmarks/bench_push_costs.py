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

Usage: python benchmarks/bench_push_costs.py [TRACE_DIR] [--scenario geo-5k-3n] [--seed S] [--json]
(no TRACE_DIR: runs the scenario first, with a summary trace in a temporary directory: 3-8 minutes for
geo-5k-3n on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

_MESSAGES = frozenset({"push_forwarded", "push_fallback", "receipt_forwarded", "route_error"})
_KINDS = _MESSAGES | {"push_injected", "push_delivered", "push_excluded", "push_retry"}
_CLASSES = ("first attempt", "re-sent", "late", "excluded, never delivered", "lost")


def _rows(root: Path) -> Iterator[tuple[str, str, int | None, float]]:
    """(kind, msg, count, t) of the push rows of every trace file under root."""
    files = sorted(root.rglob("*.parquet")) + sorted(root.rglob("*.jsonl"))
    if not files:
        raise SystemExit(f"bench_push_costs: no *.parquet or *.jsonl trace under {root}")
    for f in files:
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq

            cols = ("kind", "msg", "count", "t")
            table = pq.read_table(f, columns=list(cols))
            for kind, msg, count, t in zip(*(table.column(c).to_pylist() for c in cols), strict=True):
                if kind in _KINDS and msg:
                    yield kind, msg, count, t
        else:
            with f.open() as fh:
                for line in fh:
                    e = json.loads(line)
                    if e.get("kind") in _KINDS and e.get("msg"):
                        yield e["kind"], e["msg"], e.get("count"), e["t"]


def costs(root: Path) -> dict[str, object]:
    meta = root / "meta.json"
    deadline = float(json.loads(meta.read_text()).get("deadline_s", "inf")) if meta.exists() else float("inf")
    messages: Counter[str] = Counter()
    injected: dict[str, float] = {}
    delivered: dict[str, float] = {}
    excluded: set[str] = set()
    resent: set[str] = set()
    for kind, msg, count, t in _rows(root):
        if kind in _MESSAGES:
            messages[msg] += count if count is not None else 1
        elif kind == "push_injected":
            injected.setdefault(msg, t)
        elif kind == "push_delivered":
            delivered[msg] = min(t, delivered.get(msg, t))
        elif kind == "push_excluded":
            excluded.add(msg)
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
    }
    return out


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
    excluded = classes["excluded, never delivered"]
    print(json.dumps({"bench": "push_costs", "figures": [
        {"metric": "messages_per_delivered_push", "value": r["messages_per_delivered_push"], "unit": "messages"},
        {"metric": "delivered push messages, median", "value": r["delivered_push_messages_median"],
         "unit": "messages"},
        {"metric": "share of messages: pushes excluded (home down) and never delivered",
         "value": excluded["messages_share"], "unit": "share"}]}))


if __name__ == "__main__":
    main()
