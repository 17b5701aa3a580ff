"""Plots (matplotlib, Agg) and report.html from an Analysis. Only small per-push / per-registration
columns are brought to the driver, and only after Spark has reduced them."""

from __future__ import annotations

import html
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from pyspark.sql import DataFrame

from spark_analysis.metrics import Analysis

PLOTS = {
    "convergence_cdf.png": "Registration convergence (time until 90% of live relays hold a route)",
    "latency_cdf.png": "Push delivery latency (injection to storage at home)",
    "hops_histogram.png": "Hops per delivered push",
    "loss_by_reason.png": "Undelivered pushes by reason",
    "overhead_per_registration.png": "Gossip messages per registration / (relays - 1)",
}
MAX_PLOT_POINTS = 200_000  # a CDF needs no more points than a screen has pixels, times a margin


def _values(df: DataFrame, col: str) -> list[float]:
    rows = df.select(col).where(f"{col} IS NOT NULL").orderBy(col).limit(MAX_PLOT_POINTS).collect()
    return [float(r[0]) for r in rows]


def _cdf(ax: Axes, values: list[float], xlabel: str) -> None:
    if values:
        n = len(values)
        ax.step(values, [(i + 1) / n for i in range(n)], where="post")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction")
    ax.grid(True, alpha=0.3)


def _save(fig: Figure, ax: Axes, out: Path, name: str) -> str:
    ax.set_title(PLOTS[name], fontsize=9)
    fig.savefig(out / name, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return name


def write_plots(analysis: Analysis, out: Path) -> list[str]:
    """Draw every plot of PLOTS into out/; returns the file names."""
    t = analysis.tables
    delivered = t["pushes"].where("on_time")
    made = []

    fig, ax = plt.subplots(figsize=(6, 4))
    _cdf(ax, _values(t["registrations"], "convergence_s"), "seconds")
    made.append(_save(fig, ax, out, "convergence_cdf.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    _cdf(ax, _values(delivered, "latency_s"), "seconds")
    made.append(_save(fig, ax, out, "latency_cdf.png"))

    hops = [r for r in delivered.groupBy("hops").count().orderBy("hops").collect() if r["hops"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([r["hops"] for r in hops], [r["count"] for r in hops])
    ax.set_xlabel("hops")
    ax.set_ylabel("pushes")
    made.append(_save(fig, ax, out, "hops_histogram.png"))

    by_reason = analysis.summary.get("loss_by_reason")
    loss: dict[str, int] = by_reason if isinstance(by_reason, dict) else {}
    fig, ax = plt.subplots(figsize=(6, 4))
    if loss:
        ax.barh(list(loss), list(loss.values()))
    else:
        ax.text(0.5, 0.5, "no undelivered pushes", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("pushes")
    made.append(_save(fig, ax, out, "loss_by_reason.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    vals = _values(t["overhead_per_registration"], "overhead")
    if vals:
        ax.hist(vals, bins=min(50, max(5, len(vals) // 5)))
    ax.set_xlabel("messages per registration / (relays - 1)")
    ax.set_ylabel("registrations")
    made.append(_save(fig, ax, out, "overhead_per_registration.png"))
    return made


KEY_FIGURES = ("relays", "registrations", "pushes", "delivered", "delivery_ratio", "delivery_ratio_all",
               "route_coverage", "convergence_p50_s", "convergence_p90_s", "stretch_median", "stretch_p95",
               "hops_p50", "overhead_ratio", "gossip_messages", "fallback_pushes", "messages_per_delivered_push",
               "pushes_excluded", "malformed_lines")


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {n}" for k, n in v.items()) or "none"
    return "n/a" if v is None else str(v)


def write_html(analysis: Analysis, out: Path, plots: list[str], source: str) -> Path:
    """report.html: the key figures, then every plot."""
    s = analysis.summary
    rows = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(s.get(k)))}</td></tr>"
                     for k in (*KEY_FIGURES, "loss_by_reason"))
    imgs = "\n".join(
        f'<figure><img src="{p}" alt="{html.escape(PLOTS[p])}">'
        f"<figcaption>{html.escape(PLOTS[p])}</figcaption></figure>"
        for p in plots
    )
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>INRI trace analysis</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:4px 10px;text-align:left}}figure{{display:inline-block;margin:1em}}
img{{max-width:500px}}</style></head>
<body><h1>INRI trace analysis</h1><p>Trace: <code>{html.escape(source)}</code></p>
<h2>Key figures</h2><table>{rows}</table>
<h2>Plots</h2>{imgs}
<h2>Full summary</h2><pre>{html.escape(json.dumps(s, indent=2, sort_keys=True))}</pre>
</body></html>
"""
    path = out / "report.html"
    path.write_text(doc)
    return path
