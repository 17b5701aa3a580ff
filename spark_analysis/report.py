"""Plots (matplotlib, Agg), report.html and compare.html from an Analysis. Only small per-push /
per-registration columns are brought to the driver, and only after Spark has reduced them.

Every plot of pushes draws the population of the key figures: delivered counted pushes (on time, not
excluded), so a plot and the number beside it never disagree. Each image says in its `data-points`
attribute how many values it drew, so a check can tell a plot with data from an empty frame.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_analysis.metrics import Analysis

PLOTS = {
    "latency_cdf.png": "Push delivery latency (injection to storage at home; log axis, p50/p95 and deadline marked)",
    "delivery_over_time.png": "Delivery ratio and latency by injection time (disturbed windows shaded)",
    "stretch_cdf.png": "Stretch: all deliveries (initial topology) and path stretch (first attempt, live graph)",
    "hops_histogram.png": "Hops per delivered push (push TTL marked)",
    "reach_cdf.png": "Reach: share of live relays holding a route coverage_after_s after registration",
    "coverage_over_time.png": "Reach per registration by registration time (disturbed windows shaded)",
    "convergence_cdf.png": "Registration convergence (time until 90% of live relays hold a route)",
    "push_cost.png": "Push cost: route and fallback messages per push",
    "exclusions.png": "Excluded pushes by reason (rule of this release and the old rule)",
    "loss_by_reason.png": "Undelivered pushes by reason",
    "overhead_per_registration.png": "Gossip messages per registration / (relays - 1)",
}
MAX_PLOT_POINTS = 200_000  # a CDF needs no more points than a screen has pixels, times a margin
TIME_BINS = 40
WINDOW_COLOURS = {"churn": "tab:orange", "partition": "tab:red", "loss": "tab:grey"}


@dataclass
class Plot:
    """A drawn plot: its file name and how many values it drew."""

    name: str
    points: int


def _values(df: DataFrame, col: str) -> list[float]:
    rows = df.select(col).where(F.col(col).isNotNull()).orderBy(col).limit(MAX_PLOT_POINTS).collect()
    return [float(r[0]) for r in rows]


def _no_data(ax: Axes, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def _cdf(ax: Axes, values: list[float], xlabel: str, label: str | None = None) -> int:
    if values:
        n = len(values)
        ax.step(values, [(i + 1) / n for i in range(n)], where="post", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction")
    ax.grid(True, alpha=0.3)
    return len(values)


def _shade(ax: Axes, windows: object) -> None:
    """Shade the disturbed intervals (meta.json `windows`)."""
    for w in windows if isinstance(windows, list) else []:
        kind = str(w.get("kind"))
        ax.axvspan(float(w["start_s"]), float(w["end_s"]), color=WINDOW_COLOURS.get(kind, "tab:grey"), alpha=0.12,
                   label=kind)


class _Drawer:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.made: list[Plot] = []

    def new(self) -> tuple[Figure, Axes]:
        return plt.subplots(figsize=(6, 4))

    def save(self, fig: Figure, ax: Axes, name: str, points: int) -> None:
        if points == 0 and not ax.texts:
            _no_data(ax)
        ax.set_title(PLOTS[name], fontsize=8)
        fig.savefig(self.out / name, dpi=100, bbox_inches="tight")
        plt.close(fig)
        self.made.append(Plot(name, points))


def write_plots(analysis: Analysis, out: Path) -> list[Plot]:
    """Draw every plot of PLOTS into out/; returns what was drawn."""
    t = analysis.tables
    s = analysis.summary
    marks = analysis.marks
    windows = marks.get("windows")
    good = t["pushes"].where("on_time AND NOT excluded")
    counted = t["pushes"].where("NOT excluded")
    d = _Drawer(out)

    fig, ax = d.new()
    lat = _values(good, "latency_s")
    zero = sum(1 for v in lat if v <= 0)  # pushes stored where they were injected: 0 s has no place on a log axis
    floor = min((v for v in lat if v > 0), default=1.0) / 10
    n = _cdf(ax, [max(v, floor) for v in lat], "seconds (log)", f"{zero} pushes of 0 s drawn at {floor:.2g} s"
             if zero else None)
    if lat:
        ax.set_xscale("log")
        for key, style in (("latency_p50_s", ":"), ("latency_p95_s", "--")):
            v = s.get(key)
            if isinstance(v, float) and v > 0:
                ax.axvline(v, color="tab:green", linestyle=style, label=f"{key} {v:.3g} s")
        deadline = marks.get("deadline_s")
        if isinstance(deadline, float):
            ax.axvline(deadline, color="tab:red", label=f"deadline {deadline:g} s")
        ax.legend(fontsize=7)
    d.save(fig, ax, "latency_cdf.png", n)

    fig, ax = d.new()
    span = counted.agg(F.min("t_inj").alias("a"), F.max("t_inj").alias("b")).first()
    n = 0
    if span is not None and span["a"] is not None:
        a, b = float(span["a"]), float(span["b"])
        width = max((b - a) / TIME_BINS, 1e-9)
        binned = counted.withColumn("bin", F.floor((F.col("t_inj") - F.lit(a)) / F.lit(width))).groupBy("bin").agg(
            F.count("*").alias("n"), F.sum(F.col("on_time").cast("int")).alias("ok"),
            F.percentile_approx(F.when(F.col("on_time"), F.col("latency_s")), 0.5).alias("p50"),
            F.percentile_approx(F.when(F.col("on_time"), F.col("latency_s")), 0.95).alias("p95"),
        ).orderBy("bin").collect()
        xs = [a + (r["bin"] + 0.5) * width for r in binned]
        n = len(binned)
        ax.plot(xs, [r["ok"] / r["n"] for r in binned], color="tab:blue", marker=".", label="delivery ratio")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("delivery ratio (counted pushes)")
        _shade(ax, windows)
        ax2 = ax.twinx()
        ax2.plot(xs, [r["p50"] for r in binned], color="tab:green", linestyle=":", label="latency p50 (approx.)")
        ax2.plot(xs, [r["p95"] for r in binned], color="tab:green", linestyle="--", label="latency p95 (approx.)")
        ax2.set_yscale("log")
        ax2.set_ylabel("seconds (log)")
        ax.legend(fontsize=7, loc="lower left")
        ax2.legend(fontsize=7, loc="lower right")
    ax.set_xlabel("injection time (s)")
    d.save(fig, ax, "delivery_over_time.png", n)

    fig, ax = d.new()
    n = 0
    if "stretch" in t:
        n += _cdf(ax, _values(t["stretch"], "stretch"), "stretch", "stretch (all, initial topology)")
    if "path_stretch" in t:
        n += _cdf(ax, _values(t["path_stretch"].where("NOT recovered"), "path_stretch"), "stretch",
                  "path_stretch (first attempt, live graph)")
    if n:
        ax.set_xscale("log")
        ax.legend(fontsize=7)
    d.save(fig, ax, "stretch_cdf.png", n)

    fig, ax = d.new()
    hops = [r for r in good.groupBy("hops").count().orderBy("hops").collect() if r["hops"] is not None]
    ax.bar([r["hops"] for r in hops], [r["count"] for r in hops])
    ttl = marks.get("push_ttl")
    if isinstance(ttl, int):
        ax.axvline(ttl, color="tab:red", label=f"push TTL {ttl}")
        ax.legend(fontsize=7)
    ax.set_xlabel("hops (links crossed to the home)")
    ax.set_ylabel("pushes")
    d.save(fig, ax, "hops_histogram.png", sum(r["count"] for r in hops))

    fig, ax = d.new()
    n = _cdf(ax, _values(t["reach"], "reach"), "share of live relays with a route")
    d.save(fig, ax, "reach_cdf.png", n)

    fig, ax = d.new()
    pts = t["reach"].orderBy("t0").limit(MAX_PLOT_POINTS).collect()
    if pts:
        ax.plot([r["t0"] for r in pts], [r["reach"] for r in pts], ".", label="reach")
        ax.set_ylim(0, 1.05)
        _shade(ax, windows)
        ax.legend(fontsize=7)
    ax.set_xlabel("registration time (s)")
    ax.set_ylabel("share of live relays with a route")
    d.save(fig, ax, "coverage_over_time.png", len(pts))

    fig, ax = d.new()
    n = _cdf(ax, _values(t["registrations"], "convergence_s"), "seconds")
    if n == 0:
        _no_data(ax, f"no registration reached 90% ({s.get('unconverged_registrations')} unconverged): "
                     "see the reach plots")
    d.save(fig, ax, "convergence_cdf.png", n)

    fig, ax = d.new()
    n = _cdf(ax, _values(counted, "route_msgs"), "messages per counted push", "route (push_forwarded)")
    n += _cdf(ax, _values(counted, "fallback_msgs"), "messages per counted push", "fallback (ring copies)")
    if n:
        ax.set_xscale("symlog")
        ax.legend(fontsize=7)
    d.save(fig, ax, "push_cost.png", n)

    fig, ax = d.new()
    old = {r["excl_reason"] or "unknown": r["count"]
           for r in t["pushes"].where("excluded_old_rule").groupBy("excl_reason").count().collect()}
    new = {r["excl_reason"] or "unknown": r["count"]
           for r in t["pushes"].where("excluded").groupBy("excl_reason").count().collect()}
    reasons = sorted(old)
    if reasons:
        ys = range(len(reasons))
        ax.barh([y + 0.2 for y in ys], [new.get(r, 0) for r in reasons], height=0.4, label="excluded (this release)")
        ax.barh([y - 0.2 for y in ys], [old[r] for r in reasons], height=0.4, label="old rule")
        ax.set_yticks(list(ys), reasons)
        ax.legend(fontsize=7)
    else:
        _no_data(ax, "no excluded pushes")
    ax.set_xlabel("pushes")
    d.save(fig, ax, "exclusions.png", sum(old.values()))

    by_reason = s.get("loss_by_reason")
    loss: dict[str, int] = by_reason if isinstance(by_reason, dict) else {}
    fig, ax = d.new()
    if loss:
        ax.barh(list(loss), list(loss.values()))
    else:
        _no_data(ax, "no undelivered pushes")
    ax.set_xlabel("pushes")
    d.save(fig, ax, "loss_by_reason.png", sum(loss.values()))

    fig, ax = d.new()
    vals = _values(t["overhead_per_registration"], "overhead")
    if vals:
        ax.hist(vals, bins=min(50, max(5, len(vals) // 5)))
    ax.set_xlabel("messages per registration / (relays - 1)")
    ax.set_ylabel("registrations")
    d.save(fig, ax, "overhead_per_registration.png", len(vals))
    return d.made


KEY_FIGURES = ("relays", "registrations", "pushes", "pushes_counted", "delivered", "delivery_ratio",
               "delivery_ratio_all", "latency_p50_s", "latency_p95_s", "latency_p99_s", "path_stretch_median",
               "path_stretch_p95", "recovery_share", "stretch_median", "stretch_p95", "overlay_penalty_median",
               "overlay_penalty_p95", "hops_p50", "hops_p95", "hops_max", "route_coverage", "reach_p50", "reach_p10",
               "convergence_p50_s", "convergence_p90_s", "unconverged_registrations", "overhead_ratio",
               "gossip_messages", "fallback_pushes", "messages_per_delivered_push",
               "messages_per_delivered_push_live_home", "messages_per_push_home_down", "pushes_never_delivered_home_up",
               "frames_lost", "pushes_excluded", "excluded_old_rule", "delivery_ratio_old_rule", "malformed_lines",
               "loss_by_reason")
STYLE = """body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse}
th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}figure{display:inline-block;margin:1em;vertical-align:top}
img{max-width:520px}.pair img{max-width:560px}"""


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {n}" for k, n in v.items()) or "none"
    return "n/a" if v is None else str(v)


def _img(src: str, plot: Plot) -> str:
    return (f'<img src="{html.escape(src)}" alt="{html.escape(PLOTS[plot.name])}" '
            f'data-plot="{plot.name}" data-points="{plot.points}">')


def write_html(analysis: Analysis, out: Path, plots: list[Plot], source: str) -> Path:
    """report.html: the key figures, then every plot."""
    s = analysis.summary
    rows = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(s.get(k)))}</td></tr>" for k in KEY_FIGURES)
    imgs = "\n".join(f"<figure>{_img(p.name, p)}<figcaption>{html.escape(PLOTS[p.name])}</figcaption></figure>"
                     for p in plots)
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>INRI trace analysis</title>
<style>{STYLE}</style></head>
<body><h1>INRI trace analysis</h1><p>Trace: <code>{html.escape(source)}</code></p>
<h2>Key figures</h2><p>Latency, hops and stretch are over delivered counted pushes, as in every plot of pushes
(docs/metrics.md).</p><table>{rows}</table>
<h2>Plots</h2>{imgs}
<h2>Full summary</h2><pre>{html.escape(json.dumps(s, indent=2, sort_keys=True))}</pre>
</body></html>
"""
    path = out / "report.html"
    path.write_text(doc)
    (out / "plots.json").write_text(json.dumps({p.name: p.points for p in plots}, indent=2, sort_keys=True) + "\n")
    return path


def write_compare(a: dict[str, object], b: dict[str, object], out: Path, out_b: Path, source_a: str,
                  source_b: str) -> Path:
    """compare.html in out: the key figures of two analysed runs side by side, then each plot of both."""
    rows = "\n".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(a.get(k)))}</td><td>{html.escape(_fmt(b.get(k)))}</td></tr>"
        for k in KEY_FIGURES)
    points_a = json.loads((out / "plots.json").read_text())
    points_b = json.loads((out_b / "plots.json").read_text())
    rel_b = out_b.relative_to(out).as_posix()
    pairs = "\n".join(
        f'<div class="pair"><h3>{html.escape(PLOTS[name])}</h3>'
        f"<figure>{_img(name, Plot(name, points_a[name]))}<figcaption>A</figcaption></figure>"
        f"<figure>{_img(f'{rel_b}/{name}', Plot(name, points_b.get(name, 0)))}<figcaption>B</figcaption></figure></div>"
        for name in PLOTS if name in points_a and name in points_b)
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>INRI: two runs side by side</title>
<style>{STYLE}</style></head>
<body><h1>Two runs side by side</h1>
<p>A: <code>{html.escape(source_a)}</code> (<a href="report.html">report</a>)<br>
B: <code>{html.escape(source_b)}</code> (<a href="{html.escape(rel_b)}/report.html">report</a>)</p>
<h2>Key figures</h2><table><tr><th>key</th><th>A</th><th>B</th></tr>{rows}</table>
<h2>Plots</h2>{pairs}
</body></html>
"""
    path = out / "compare.html"
    path.write_text(doc)
    return path
