"""The metrics of docs/metrics.md as Spark DataFrame jobs.

Everything large stays in Spark; the driver only receives per-metric scalars, the small per-push /
per-registration tables for plots, and the topology (small) for shortest paths. Quantiles are exact
nearest-rank (row_number over the sorted values), never percentile_approx, so a simulator run and its
analysis agree to the last digit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F

from spark_analysis.livegraph import LIVE_KINDS, live_distances
from spark_analysis.load import Trace

PUSH_MESSAGE_KINDS = ("push_forwarded", "push_fallback", "receipt_forwarded", "route_error")
# Exclusions the topology decides: counted only when the home was down or cut off before delivery.
TOPOLOGY_EXCLUSIONS = ("home_down", "partitioned")


def nearest_rank(df: DataFrame, col: str, q: float, n: int | None = None) -> float | None:
    """x[ceil(q*n)] of the values of `col` sorted ascending (x[1] when q*n < 1); None when empty."""
    n = df.count() if n is None else n
    if n == 0:
        return None
    rank = min(n, max(1, math.ceil(q * n - 1e-12)))
    w = Window.orderBy(F.col(col).asc())
    row = df.select(col).withColumn("_rn", F.row_number().over(w)).filter(F.col("_rn") == rank).first()
    return None if row is None else row[0]


def one_row(aggregate: DataFrame) -> Row:
    """The row of a global aggregate (one without groupBy, which Spark answers with exactly one row)."""
    row = aggregate.first()
    if row is None:
        raise RuntimeError("a global aggregate returned no row")
    return row


@dataclass
class Analysis:
    """The summary plus the small tables the report draws."""

    summary: dict[str, object]
    tables: dict[str, DataFrame] = field(default_factory=dict)
    # small facts the report marks: deadline_s, push_ttl (the TTL pushes start with), windows (meta.json)
    marks: dict[str, object] = field(default_factory=dict)


def _down_counts(keys: DataFrame, transitions: DataFrame, time_col: str) -> DataFrame:
    """Per key row (msg, origin, <time_col>): how many relays other than origin are down at that time."""
    j = keys.join(transitions, transitions.tt <= keys[time_col]).filter(F.col("trelay") != F.col("origin"))
    w = Window.partitionBy("msg", "trelay").orderBy(F.col("tt").desc(), F.col("tseq").desc())
    latest = j.withColumn("_rn", F.row_number().over(w)).filter("_rn = 1")
    return latest.groupBy("msg").agg(F.sum(F.when(~F.col("up"), 1).otherwise(0)).alias("down"))


def analyse(
    spark: SparkSession,
    trace: Trace,
    progress: Callable[[str], None] = lambda _: None,
) -> Analysis:
    """Compute every key of docs/metrics.md from a loaded trace."""
    ev = trace.events.cache()
    meta = trace.meta
    deadline = float(meta.get("deadline_s", 30.0))
    cover_after = float(meta.get("coverage_after_s", 10.0))
    progress("counting relays and events")
    n_relays = int(meta["relays"]) if "relays" in meta else ev.select("relay").distinct().count()

    progress("registrations")
    w_first = Window.partitionBy("msg").orderBy(F.col("t").asc(), F.col("seq").asc())
    regs = (
        ev.filter(F.col("kind") == "reg_originated")
        .withColumn("_rn", F.row_number().over(w_first)).filter("_rn = 1")
        .select("msg", F.col("t").alias("t0"), F.col("relay").alias("origin"))
        .cache()
    )
    n_regs = regs.count()
    # gossip_control: the tree scheme's announcements, grafts and graft answers (docs/trace-schema.md);
    # reg_reforwarded: rule G3b's second copies
    gossip = one_row(ev.filter(F.col("kind").isin("reg_originated", "route_set", "gossip_control",
                                                   "reg_reforwarded")).agg(
        F.sum(F.coalesce(F.col("count"), F.lit(0))).alias("m"),
        F.sum(F.coalesce(F.col("count"), F.lit(0)) * F.coalesce(F.col("bytes"), F.lit(0))).alias("b"),
    ))
    gossip_messages = int(gossip["m"] or 0)
    gossip_bytes = int(gossip["b"] or 0)
    # Bytes of one full frame per registration: its reg_originated rows' (smallest), else its route_set
    # rows' (largest; a stem origin writes none), summed over the registrations (gossip_bytes_ratio).
    kind = F.col("kind")
    frames = ev.filter(kind.isin("reg_originated", "route_set")).groupBy("msg").agg(
        F.min(F.when(kind == "reg_originated", F.col("bytes"))).alias("ob"),
        F.max(F.when(kind == "route_set", F.col("bytes"))).alias("rb"),
    )
    frame_bytes = int(one_row(regs.join(frames, "msg", "left").agg(
        F.sum(F.coalesce(F.col("ob"), F.col("rb"), F.lit(0))).alias("fb")))["fb"] or 0)

    progress("pushes and deliveries")
    pushes = (
        ev.filter(F.col("kind") == "push_injected")
        .withColumn("_rn", F.row_number().over(w_first)).filter("_rn = 1")
        .select("msg", F.col("t").alias("t_inj"), F.col("relay").alias("r_inj"))
    )
    excluded = (
        ev.filter(F.col("kind") == "push_excluded")
        .withColumn("_rn", F.row_number().over(w_first)).filter("_rn = 1")
        .select("msg", F.col("t").alias("t_excl"), F.col("reason").alias("excl_reason"))
    )
    delivered = (
        ev.filter(F.col("kind") == "push_delivered")
        .withColumn("_rn", F.row_number().over(w_first)).filter("_rn = 1")
        .select("msg", F.col("t").alias("t_del"), F.col("relay").alias("r_del"), F.col("hops"))
    )
    w_last = Window.partitionBy("msg").orderBy(F.col("t").desc(), F.col("seq").desc())
    dropped = (
        ev.filter(F.col("kind") == "push_dropped")
        .withColumn("_rn", F.row_number().over(w_last)).filter("_rn = 1")
        .select("msg", F.coalesce(F.col("reason"), F.lit("unknown")).alias("drop_reason"))
    )
    fallback = ev.filter(F.col("kind") == "push_fallback").select("msg").distinct().withColumn("fb", F.lit(True))
    retried = ev.filter(F.col("kind") == "push_retry").select("msg").distinct().withColumn("rt", F.lit(True))
    cost = ev.filter(F.col("kind").isin("push_forwarded", "push_fallback")).groupBy("msg").agg(
        F.sum(F.when(F.col("kind") == "push_forwarded", F.coalesce(F.col("count"), F.lit(1))).otherwise(0))
        .alias("route_msgs"),
        F.sum(F.when(F.col("kind") == "push_fallback", F.coalesce(F.col("count"), F.lit(1))).otherwise(0))
        .alias("fallback_msgs"))
    per_push = (
        pushes.join(excluded, "msg", "left").join(delivered, "msg", "left").join(dropped, "msg", "left")
        .join(fallback, "msg", "left").join(retried, "msg", "left").join(cost, "msg", "left")
        .withColumn("route_msgs", F.coalesce(F.col("route_msgs"), F.lit(0)))
        .withColumn("fallback_msgs", F.coalesce(F.col("fallback_msgs"), F.lit(0)))
        .withColumn("fallback", F.coalesce(F.col("fb"), F.lit(False))).drop("fb")
        .withColumn("recovered", F.col("fallback") | F.coalesce(F.col("rt"), F.lit(False))).drop("rt")
        .withColumn("latency_s", F.col("t_del") - F.col("t_inj"))
        .withColumn("on_time", F.col("t_del").isNotNull() & (F.col("latency_s") <= F.lit(deadline)))
        .withColumn("excluded_old_rule", F.col("t_excl").isNotNull())
        # the home was down or cut off before delivery (docs/metrics.md); other reasons always exclude
        .withColumn("excluded", F.col("t_excl").isNotNull() & (
            ~F.coalesce(F.col("excl_reason"), F.lit("unknown")).isin(*TOPOLOGY_EXCLUSIONS)
            | ~F.col("on_time") | (F.col("t_excl") <= F.col("t_del"))))
        .cache()
    )
    counts = one_row(per_push.agg(
        F.count("*").alias("pushes"),
        F.sum(F.col("excluded").cast("int")).alias("excluded"),
        F.sum(F.col("excluded_old_rule").cast("int")).alias("excluded_old"),
        F.sum(F.col("on_time").cast("int")).alias("delivered_all"),
        F.sum((F.col("on_time") & ~F.col("excluded")).cast("int")).alias("delivered"),
        F.sum((F.col("on_time") & ~F.col("excluded_old_rule")).cast("int")).alias("delivered_old"),
        F.sum(F.col("fallback").cast("int")).alias("fallback_pushes"),
        F.sum((F.col("recovered") & ~F.col("excluded")).cast("int")).alias("recovered"),
    ))
    n_pushes = int(counts["pushes"])
    n_excl = int(counts["excluded"] or 0)
    n_excl_old = int(counts["excluded_old"] or 0)
    n_deliv_all = int(counts["delivered_all"] or 0)
    n_deliv = int(counts["delivered"] or 0)
    n_deliv_old = int(counts["delivered_old"] or 0)
    counted = n_pushes - n_excl
    counted_old = n_pushes - n_excl_old
    good = per_push.filter(F.col("on_time") & ~F.col("excluded")).cache()
    hops_p50 = nearest_rank(good.select("hops"), "hops", 0.5, n_deliv)
    hops_p95 = nearest_rank(good.select("hops"), "hops", 0.95, n_deliv)
    hops_max = one_row(good.agg(F.max("hops").alias("m")))["m"]
    lat = {q: nearest_rank(good.select("latency_s"), "latency_s", q, n_deliv) for q in (0.5, 0.95, 0.99)}

    progress("push message costs")
    pm = ev.filter(F.col("kind").isin(*PUSH_MESSAGE_KINDS)).groupBy("kind").agg(
        F.sum(F.coalesce(F.col("count"), F.lit(1))).alias("c")).collect()
    pm_by_kind = {r["kind"]: int(r["c"]) for r in pm}
    push_messages = sum(pm_by_kind.values())

    progress("push message costs by the home's state (live at injection, down while waiting)")
    home_costs = _home_costs(ev, per_push)

    progress("devices with several homes")
    multi_home = _multi_home(ev, per_push)

    progress("stretch (shortest paths over the topology)")
    stretch_df = _stretch(spark, trace, good)
    n_stretch = stretch_df.count() if stretch_df is not None else 0
    stretch_median = nearest_rank(stretch_df, "stretch", 0.5, n_stretch) if stretch_df is not None else None
    stretch_p95 = nearest_rank(stretch_df, "stretch", 0.95, n_stretch) if stretch_df is not None else None

    progress("path stretch and overlay penalty (the live graph at each injection)")
    live_df = _live(spark, trace, ev, good)
    path_stretch: dict[float, float | None] = {0.5: None, 0.95: None}
    penalty: dict[float, float | None] = {0.5: None, 0.95: None}
    if live_df is not None:
        ps = live_df.filter(~F.col("recovered")).select("path_stretch").cache()
        n_ps = ps.count()
        path_stretch = {q: nearest_rank(ps, "path_stretch", q, n_ps) for q in path_stretch}
        pen = live_df.filter(F.col("overlay_penalty").isNotNull()).select("overlay_penalty").cache()
        n_pen = pen.count()
        penalty = {q: nearest_rank(pen, "overlay_penalty", q, n_pen) for q in penalty}

    progress("route coverage and convergence")
    transitions = (
        ev.filter(F.col("kind").isin("relay_down", "relay_up"))
        .select(F.col("relay").alias("trelay"), F.col("t").alias("tt"), F.col("seq").alias("tseq"),
                (F.col("kind") == "relay_up").alias("up"))
        .cache()
    )
    reg_times = regs.withColumn("t_cov", F.col("t0") + F.lit(cover_after))
    down_cov = _down_counts(reg_times, transitions, "t_cov").withColumnRenamed("down", "down_cov")
    down0 = _down_counts(reg_times, transitions, "t0").withColumnRenamed("down", "down0")
    reg_live = (
        reg_times.join(down_cov, "msg", "left").join(down0, "msg", "left")
        .withColumn("live_cov", F.lit(n_relays - 1) - F.coalesce(F.col("down_cov"), F.lit(0)))
        .withColumn("live0", F.lit(n_relays - 1) - F.coalesce(F.col("down0"), F.lit(0)))
        # an origin that is itself down does not count against the others (docs/metrics.md)
    )
    route_set = ev.filter(F.col("kind") == "route_set").select("msg", "relay", "t", "seq")
    rs = route_set.join(reg_times.select("msg", "origin", "t0", "t_cov"), "msg")
    rs = rs.filter(F.col("relay") != F.col("origin"))
    got = rs.filter(F.col("t") <= F.col("t_cov")).select("msg", "relay", "t_cov", "origin").distinct()
    # live at t_cov: latest transition of that relay at or before t_cov is not a down
    gt = got.join(transitions, (transitions.trelay == got.relay) & (transitions.tt <= got.t_cov), "left")
    wl = Window.partitionBy("msg", "relay").orderBy(F.col("tt").desc_nulls_last(), F.col("tseq").desc_nulls_last())
    got_live = (
        gt.withColumn("_rn", F.row_number().over(wl)).filter("_rn = 1")
        .filter(F.col("up").isNull() | F.col("up"))
        .groupBy("msg").agg(F.count("*").alias("got"))
    )
    reach_df = reg_live.join(got_live, "msg", "left").withColumn("got", F.coalesce(F.col("got"), F.lit(0))).cache()
    cov = reach_df.agg(F.sum("got").alias("num"), F.sum("live_cov").alias("den")).first()
    route_coverage = (int(cov["num"]) / int(cov["den"])) if cov and cov["den"] else None
    # per registration: the share of relays live at t0 + coverage_after that hold a route by then
    reach = reach_df.filter(F.col("live_cov") > 0).select(
        "msg", "t0", (F.col("got") / F.col("live_cov")).alias("reach")).cache()
    n_reach = reach.count()
    reach_p50 = nearest_rank(reach, "reach", 0.5, n_reach)
    reach_p10 = nearest_rank(reach, "reach", 0.1, n_reach)

    need = reg_live.withColumn("need", F.ceil(F.lit(0.9) * F.col("live0") - F.lit(1e-12)).cast("long"))
    wr = Window.partitionBy("msg").orderBy(F.col("t").asc(), F.col("seq").asc())
    ranked = rs.select("msg", "t", "seq").withColumn("_rn", F.row_number().over(wr))
    reached = ranked.join(need.select("msg", "need", "t0"), "msg").filter(F.col("_rn") == F.col("need")).select(
        "msg", (F.col("t") - F.col("t0")).alias("convergence_s"))
    conv = (
        need.join(reached, "msg", "left")
        .withColumn("convergence_s", F.when(F.col("need") <= 0, F.lit(0.0)).otherwise(F.col("convergence_s")))
        .cache()
    )
    converged = conv.filter(F.col("convergence_s").isNotNull()).select("msg", "convergence_s").cache()
    n_conv = converged.count()
    unconverged = n_regs - n_conv
    conv_p50 = nearest_rank(converged, "convergence_s", 0.5, n_conv)
    conv_p90 = nearest_rank(converged, "convergence_s", 0.9, n_conv)

    progress("losses")
    lost = per_push.filter(~F.col("excluded") & ~F.col("on_time")).withColumn(
        "loss_reason",
        F.when(F.col("drop_reason").isNotNull(), F.col("drop_reason"))
        .when(F.col("t_del").isNotNull(), F.lit("late")).otherwise(F.lit("unknown")),
    )
    loss_rows = lost.groupBy("loss_reason").count().orderBy("loss_reason").collect()
    loss_by_reason = {r["loss_reason"]: int(r["count"]) for r in loss_rows}
    late_row = lost.agg(F.sum(F.when(F.col("t_del").isNotNull(), 1).otherwise(0)).alias("late"),
                        F.count(F.lit(1)).alias("lost")).first()
    n_late = int(late_row["late"] or 0) if late_row else 0
    n_never = (int(late_row["lost"] or 0) if late_row else 0) - n_late

    per_reg_overhead = (
        ev.filter(F.col("kind").isin("reg_originated", "route_set"))
        .groupBy("msg").agg(F.sum(F.coalesce(F.col("count"), F.lit(0))).alias("messages"))
        .withColumn("overhead", F.col("messages") / F.lit(max(1, n_relays - 1)))
    )
    summary: dict[str, object] = {
        "relays": n_relays,
        "registrations": n_regs,
        "pushes": n_pushes,
        "pushes_counted": counted,
        "pushes_excluded": n_excl,
        "excluded_old_rule": n_excl_old,
        "delivered": n_deliv,
        "delivered_all": n_deliv_all,
        "delivery_ratio": n_deliv / counted if counted else 1.0,
        "delivery_ratio_old_rule": n_deliv_old / counted_old if counted_old else 1.0,
        "delivery_ratio_all": n_deliv_all / n_pushes if n_pushes else 1.0,
        "gossip_messages": gossip_messages,
        "gossip_bytes": gossip_bytes,
        "overhead_ratio": gossip_messages / n_regs / (n_relays - 1) if n_regs and n_relays > 1 else None,
        "gossip_bytes_ratio": gossip_bytes / ((n_relays - 1) * frame_bytes) if frame_bytes and n_relays > 1 else None,
        "latency_p50_s": lat[0.5],
        "latency_p95_s": lat[0.95],
        "latency_p99_s": lat[0.99],
        "stretch_median": stretch_median,
        "stretch_p95": stretch_p95,
        "path_stretch_median": path_stretch[0.5],
        "path_stretch_p95": path_stretch[0.95],
        "overlay_penalty_median": penalty[0.5],
        "overlay_penalty_p95": penalty[0.95],
        "recovery_share": int(counts["recovered"] or 0) / counted if counted else None,
        "hops_p50": hops_p50,
        "hops_p95": hops_p95,
        "hops_max": hops_max,
        "fallback_pushes": int(counts["fallback_pushes"] or 0),
        "fallback_messages": pm_by_kind.get("push_fallback", 0),
        "messages_per_delivered_push": push_messages / n_deliv_all if n_deliv_all else None,
        **home_costs,
        **multi_home,
        "route_coverage": route_coverage,
        "reach_p50": reach_p50,
        "reach_p10": reach_p10,
        "convergence_p50_s": conv_p50,
        "convergence_p90_s": conv_p90,
        "unconverged_registrations": unconverged,
        "loss_by_reason": loss_by_reason,
        "pushes_never_delivered": n_never,
        "pushes_late": n_late,
        "malformed_lines": trace.malformed,
        "events_read": ev.count(),
        "stretch_basis": "latency" if trace.topology else ("hops" if stretch_df is not None else None),
    }
    # Run properties only the simulator knows (events, wall time, seed, scenario ...) come from its
    # meta.json summary, so summary.json carries every key the simulator's summary has; they are listed
    # in "from_simulator" and never override a key computed here.
    copied = sorted(k for k in (meta.get("summary") or {}) if k not in summary)
    for key in copied:
        summary[key] = meta["summary"][key]
    summary["from_simulator"] = copied
    tables = {
        "pushes": per_push.drop("_rn"),
        "registrations": conv.select("msg", "origin", "t0", "live0", "need", "convergence_s"),
        "loss_by_reason": lost.groupBy("loss_reason").count(),
        "overhead_per_registration": per_reg_overhead,
        "reach": reach,
    }
    if stretch_df is not None:
        tables["stretch"] = stretch_df
    if live_df is not None:
        tables["path_stretch"] = live_df
    ttl = one_row(ev.filter(F.col("kind") == "push_injected").agg(F.max("ttl").alias("ttl")))["ttl"]
    marks = {"deadline_s": deadline, "push_ttl": ttl, "windows": meta.get("windows") or []}
    return Analysis(summary, tables, marks)


def _home_costs(ev: DataFrame, per_push: DataFrame) -> dict[str, object]:
    """messages_per_delivered_push_live_home, messages_per_push_home_down and pushes_never_delivered_home_up
    (docs/metrics.md). Rows are taken in trace order (`seq`): a push's home is the relay of its route's
    latest reg_originated row before its first push_injected row; a relay is down from a relay_down row
    to its next relay_up row."""
    kind = F.col("kind")
    first = Window.partitionBy("msg").orderBy(F.col("seq").asc())
    injected = (ev.filter(kind == "push_injected").withColumn("_rn", F.row_number().over(first)).filter("_rn = 1")
                .select("msg", "route", F.col("seq").alias("s_inj")))
    origins = ev.filter((kind == "reg_originated") & F.col("route").isNotNull()).select(
        "route", F.col("relay").alias("home"), F.col("seq").alias("s_origin"))
    latest_origin = Window.partitionBy("msg").orderBy(F.col("s_origin").desc())
    homes = (injected.join(origins, "route").filter(F.col("s_origin") < F.col("s_inj"))
             .withColumn("_rn", F.row_number().over(latest_origin)).filter("_rn = 1").select("msg", "home", "s_inj"))
    changes = ev.filter(kind.isin("relay_down", "relay_up")).select(
        F.col("relay").alias("home"), F.col("seq").alias("s_tr"), (kind == "relay_up").alias("up"))
    latest_change = Window.partitionBy("msg").orderBy(F.col("s_tr").desc())
    at_injection = (homes.join(changes, "home").filter(F.col("s_tr") < F.col("s_inj"))
                    .withColumn("_rn", F.row_number().over(latest_change)).filter("_rn = 1")
                    .select("msg", (~F.col("up")).alias("down_at_inj")))
    first_delivered = ev.filter(kind == "push_delivered").groupBy("msg").agg(F.min("seq").alias("s_del"))
    # exposed: the home went down after the injection and before the first delivery (or the end)
    waiting = (F.col("s_tr") > F.col("s_inj")) & (F.col("s_del").isNull() | (F.col("s_tr") < F.col("s_del")))
    went_down = (homes.join(first_delivered, "msg", "left").join(changes.filter(~F.col("up")), "home")
                 .filter(waiting).select("msg").distinct().withColumn("went_down", F.lit(True)))
    state = (homes.join(at_injection, "msg", "left").join(went_down, "msg", "left")
             .withColumn("live", ~F.coalesce(F.col("down_at_inj"), F.lit(False)))
             .withColumn("exposed", ~F.col("live") | F.coalesce(F.col("went_down"), F.lit(False)))
             .select("msg", "home", "live", "exposed").cache())
    messages = ev.filter(kind.isin(*PUSH_MESSAGE_KINDS)).select(
        "msg", "seq", F.coalesce(F.col("count"), F.lit(1)).alias("c"))
    live_messages = int(one_row(messages.join(F.broadcast(state.filter("live")), "msg").agg(
        F.sum("c").alias("m")))["m"] or 0)
    # messages of exposed pushes written while their home was down: the home's latest change before the row
    latest_before_row = Window.partitionBy("seq").orderBy(F.col("s_tr").desc())
    down_messages = int(one_row(
        messages.join(F.broadcast(state.filter("exposed").select("msg", "home")), "msg")
        .join(changes, "home").filter(F.col("s_tr") < F.col("seq"))
        .withColumn("_rn", F.row_number().over(latest_before_row)).filter("_rn = 1").filter(~F.col("up"))
        .agg(F.sum("c").alias("m")))["m"] or 0)
    # a spammer's push (excluded for a reason the topology does not decide) is not a lost push
    honest = F.col("excl_reason").isNull() | F.col("excl_reason").isin(*TOPOLOGY_EXCLUSIONS)
    counts = one_row(state.join(per_push.select("msg", "on_time", "t_del", "excl_reason"), "msg").agg(
        F.sum((F.col("live") & F.col("on_time")).cast("int")).alias("live_delivered"),
        F.sum(F.col("exposed").cast("int")).alias("exposed"),
        F.sum((~F.col("exposed") & F.col("t_del").isNull() & honest).cast("int")).alias("never"),
    ))
    live_delivered = int(counts["live_delivered"] or 0)
    exposed = int(counts["exposed"] or 0)
    return {
        "messages_per_delivered_push_live_home": live_messages / live_delivered if live_delivered else None,
        "messages_per_push_home_down": down_messages / exposed if exposed else None,
        "pushes_never_delivered_home_up": int(counts["never"] or 0),
    }


def _multi_home(ev: DataFrame, per_push: DataFrame) -> dict[str, object]:
    """Pushes to devices registered at several homes (issue 42, item 3: routes with reg_originated rows at
    two relays or more) and to the others, as the simulator's Collector.multi_home_summary counts them:
    counted pushes, delivered on time, the ratio, never delivered, searched for (push_fallback). No keys
    when no route has two homes."""
    homes = (ev.filter((F.col("kind") == "reg_originated") & F.col("route").isNotNull())
             .groupBy("route").agg(F.countDistinct("relay").alias("homes")))
    if homes.filter(F.col("homes") > 1).limit(1).count() == 0:
        return {}
    w_first = Window.partitionBy("msg").orderBy(F.col("t").asc(), F.col("seq").asc())
    routes = (ev.filter(F.col("kind") == "push_injected")
              .withColumn("_rn", F.row_number().over(w_first)).filter("_rn = 1").select("msg", "route"))
    counted = (per_push.filter(~F.col("excluded")).join(routes, "msg", "left").join(homes, "route", "left")
               .withColumn("multi", F.coalesce(F.col("homes"), F.lit(0)) > 1))
    rows = {r["multi"]: r for r in counted.groupBy("multi").agg(
        F.count("*").alias("pushes"),
        F.sum(F.col("on_time").cast("int")).alias("delivered"),
        F.sum(F.col("t_del").isNull().cast("int")).alias("never"),
        F.sum(F.col("fallback").cast("int")).alias("fallback"),
    ).collect()}
    out: dict[str, object] = {}
    for prefix, multi in (("multi_home", True), ("single_home", False)):
        r = rows.get(multi)
        n = int(r["pushes"]) if r else 0
        delivered = int(r["delivered"] or 0) if r else 0
        out[f"{prefix}_pushes"] = n
        out[f"{prefix}_delivered"] = delivered
        out[f"{prefix}_delivery_ratio"] = delivered / n if n else None
        out[f"{prefix}_never_delivered"] = int(r["never"] or 0) if r else 0
        out[f"{prefix}_fallback_pushes"] = int(r["fallback"] or 0) if r else 0
    return out


def _live(spark: SparkSession, trace: Trace, ev: DataFrame, good: DataFrame) -> DataFrame | None:
    """Per delivered counted push injected away from its home: its latency over the live graph's shortest
    path at injection (path_stretch; only first-attempt route-mode deliveries count in the summary) and
    that path over the direct underlay latency (overlay_penalty, geographic topologies). Needs links.csv."""
    if not trace.links:
        return None
    links = {(str(u), str(v)): lat for u, v, lat in trace.links}
    proc = {str(k): p for k, p in (trace.processing or {}).items()}
    rows = (ev.filter(F.col("kind").isin(*LIVE_KINDS)).select("seq", "kind", "relay", "peer", "msg", "route")
            .orderBy("seq").collect())
    dist = live_distances(((r["kind"], r["relay"], r["peer"], r["msg"], r["route"]) for r in rows), links, proc)
    finite = [(p, d) for p, d in dist.items() if math.isfinite(d) and d > 0]
    if not finite:
        return None
    underlay = trace.meta.get("underlay") or {}
    pos = trace.positions

    def direct(u: str, v: str) -> float | None:
        if pos is None or "geo_base_s" not in underlay:
            return None
        (x1, y1), (x2, y2) = pos[int(u)], pos[int(v)]
        return float(underlay["geo_base_s"]) + math.hypot(x1 - x2, y1 - y2) * float(underlay["geo_per_unit_s"]) \
            + proc.get(v, 0.0)

    d_df = spark.createDataFrame(finite, "msg string, live_shortest double")
    pairs = {(r["r_inj"], r["r_del"]) for r in good.join(d_df, "msg").select("r_inj", "r_del").distinct().collect()}
    dd = [(u, v, direct(u, v)) for u, v in sorted(pairs)]
    dd_df = spark.createDataFrame(dd, "r_inj string, r_del string, direct double")
    return (good.join(d_df, "msg").join(dd_df, ["r_inj", "r_del"], "left")
            .select("msg", "t_inj", "recovered", "latency_s", "live_shortest", "direct",
                    (F.col("latency_s") / F.col("live_shortest")).alias("path_stretch"),
                    (F.col("live_shortest") / F.col("direct")).alias("overlay_penalty")))


def _stretch(spark: SparkSession, trace: Trace, good: DataFrame) -> DataFrame | None:
    """Stretch of delivered counted pushes: delivery time over the directed latency-shortest path
    (simulator traces, topology.csv + relays.csv); daemon traces without a topology use the links seen
    in peer_up rows and hop counts (hops taken over fewest hops)."""
    pairs = [(r["r_inj"], r["r_del"]) for r in
             good.filter(F.col("r_inj") != F.col("r_del")).select("r_inj", "r_del").distinct().collect()]
    if not pairs:
        return None
    import numpy as np
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    if trace.topology:
        n = 1 + max(max(u, v) for u, v, _ in trace.topology)
        proc = trace.processing or {}
        src = np.array([u for u, _, _ in trace.topology])
        dst = np.array([v for _, v, _ in trace.topology])
        w = np.array([lat + proc.get(v, 0.0) for _, v, lat in trace.topology])
        names = {str(i): i for i in range(n)}
        basis = "latency"
    else:
        links = trace.events.filter(F.col("kind") == "peer_up").select("relay", "peer").distinct().collect()
        relays = sorted({r["relay"] for r in links} | {r["peer"] for r in links if r["peer"]})
        names = {name: i for i, name in enumerate(relays)}
        n = len(relays)
        edges = {(names[r["relay"]], names[r["peer"]]) for r in links if r["peer"]}
        edges |= {(v, u) for u, v in edges}
        src = np.array([u for u, _ in edges])
        dst = np.array([v for _, v in edges])
        w = np.ones(len(edges))
        basis = "hops"
    if n == 0 or len(src) == 0:
        return None
    graph = csr_matrix((w, (src, dst)), shape=(n, n))
    dist_rows = []
    by_src: dict[str, list[str]] = {}
    for a, b in pairs:
        by_src.setdefault(a, []).append(b)
    sources = sorted(s for s in by_src if s in names)
    for start in range(0, len(sources), 256):
        chunk = sources[start:start + 256]
        d = dijkstra(graph, directed=True, indices=[names[s] for s in chunk])
        for i, s in enumerate(chunk):
            for b in by_src[s]:
                if b in names and np.isfinite(d[i, names[b]]) and d[i, names[b]] > 0:
                    dist_rows.append((s, b, float(d[i, names[b]])))
    if not dist_rows:
        return None
    dist = spark.createDataFrame(dist_rows, "r_inj string, r_del string, shortest double")
    measured = F.col("latency_s") if basis == "latency" else F.col("hops").cast("double")
    return good.join(dist, ["r_inj", "r_del"]).select("msg", (measured / F.col("shortest")).alias("stretch"))
