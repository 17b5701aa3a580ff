"""Adversarial scenarios (issue 6), each run with its adversaries and without, side by side.

Every scenario runs twice through the real CLI: as shipped, and with `--no-adversaries` (same seed,
topology, workload and homes; hostile relays behave honestly, spammers stay silent), so each figure
has its own unloaded/honest baseline from the same run of this script. rushing-1k also runs with a
5 ms forwarding jitter; receipt-forgers-1k also with `--unsigned-receipts` (the protocol before signed
receipts, issue 15); stale-sender-1k's figure is its honest cuts (issue 43, rule F5c). Set
BENCH_ADV_SCENARIOS to choose (comma-separated).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

DEFAULT = "black-holes-1k,rushing-1k,forger-1k,reg-spammer-1k,receipt-forgers-1k,push-spammer-1k,stale-sender-1k"
KEYS = ("delivery_ratio", "route_coverage", "convergence_p50_s", "stretch_median", "stretch_p95",
        "messages_per_delivered_push", "cuts_of_hostile", "cuts_of_honest", "hostile_isolated",
        "primary_via_hostile", "spam_registrations", "spam_routes_cached_max", "victim_honest_lost",
        "victim_latency_p99_s", "spam_offered", "spam_accepted", "receipts_forged", "receipts_refused",
        "settled_not_delivered", "score_penalties", "stale_settled", "wall_s")


def run(scenario: str, *extra: str) -> dict[str, Any]:
    args = [sys.executable, "-m", "simulations.cli", "run", scenario, "--trace-level", "off", "--progress", "off",
            *extra]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


def show(label: str, s: dict[str, Any]) -> None:
    print(f"{label:34s} " + " ".join(f"{k}={s[k]}" for k in KEYS if k in s), flush=True)


def main() -> None:
    figures = []
    for sc in os.environ.get("BENCH_ADV_SCENARIOS", DEFAULT).split(","):
        hostile, honest = run(sc), run(sc, "--no-adversaries")
        show(sc, hostile)
        show(sc + " --no-adversaries", honest)
        note = (f"honest run {honest['delivery_ratio']}; msgs/push {hostile['messages_per_delivered_push']:.1f} vs "
                f"{honest['messages_per_delivered_push']:.1f}; cuts hostile {hostile['cuts_of_hostile']}, "
                f"honest {hostile['cuts_of_honest']}")
        ceiling = ">= 0.99" if sc.startswith("black-holes") else "no honest push lost"
        figures.append({"metric": f"{sc} delivery_ratio", "value": hostile["delivery_ratio"], "unit": "",
                        "ceiling": ceiling, "note": note})
        if sc.startswith("receipt-forgers"):
            unsigned = run(sc, "--unsigned-receipts")
            show(sc + " --unsigned-receipts", unsigned)
            figures.append({"metric": f"{sc} delivery signed / unsigned receipts", "value": hostile["delivery_ratio"],
                            "unit": "", "ceiling": ">= 0.99, every forged receipt refused, 0 honest cuts",
                            "note": f"unsigned {unsigned['delivery_ratio']}; forged {hostile['receipts_forged']}, "
                                    f"refused {hostile['receipts_refused']}, believed (settled, never stored) "
                                    f"{hostile['settled_not_delivered']} signed vs "
                                    f"{unsigned['settled_not_delivered']} unsigned"})
        if sc.startswith("stale-sender"):
            figures.append({"metric": f"{sc} honest relays cut", "value": hostile["cuts_of_honest"], "unit": "cuts",
                            "ceiling": "0, and no score penalty (rule F5c)",
                            "note": f"penalties {hostile['score_penalties']}; stale pushes settled "
                                    f"{hostile['stale_settled']}"})
        if sc.startswith("rushing"):
            figures.append({"metric": f"{sc} primary next hop hostile", "value": hostile["primary_via_hostile"],
                            "unit": "share", "ceiling": f"honest run {honest['primary_via_hostile']:.4f}"})
            with tempfile.TemporaryDirectory() as tmp:
                text = (Path(__file__).resolve().parent.parent / "simulations" / "scenarios" / f"{sc}.toml").read_text()
                jittered = Path(tmp) / f"{sc}-jitter.toml"
                jittered.write_text(text.replace("[engine]\n", "[engine]\nforward_jitter_s = 0.005\n", 1))
                j = run(str(jittered))
            show(sc + " jitter 5 ms", j)
            figures.append({"metric": f"{sc} jitter 5 ms: delivery / primary hostile",
                            "value": j["delivery_ratio"], "unit": "",
                            "note": f"primary via hostile {j['primary_via_hostile']:.4f}, msgs/push "
                                    f"{j['messages_per_delivered_push']:.1f}, stretch p50 {j['stretch_median']:.3f}"})
        if "spam_routes_cached_max" in hostile:
            figures.append({"metric": f"{sc} spam routes cached (max per relay)",
                            "value": hostile["spam_routes_cached_max"], "unit": "routes",
                            "ceiling": f"of {hostile['spam_registrations']} sent; budget 400 + 200/s per link",
                            "note": f"convergence p50 {hostile['convergence_p50_s']:.3f} s vs "
                                    f"{honest['convergence_p50_s']:.3f} s, coverage {hostile['route_coverage']} vs "
                                    f"{honest['route_coverage']}"})
        if "victim_latency_p99_s" in hostile:
            ratio = hostile["victim_latency_p99_s"] / honest["victim_latency_p99_s"]
            figures.append({"metric": f"{sc} honest p99 via victim, spam / none", "value": round(ratio, 3),
                            "unit": "x", "ceiling": "<= 2",
                            "note": f"{hostile['victim_latency_p99_s']:.4f} s vs "
                                    f"{honest['victim_latency_p99_s']:.4f} s; "
                                    f"lost {hostile['victim_honest_lost']}; spam offered {hostile['spam_offered']:,}, "
                                    f"accepted {hostile['spam_accepted']}"})
    priv = json.loads(subprocess.run([sys.executable, "-m", "simulations.cli", "privacy", "--relays", "1000",
                                      "--devices", "100"], capture_output=True, text=True, check=True)
                      .stdout.strip().splitlines()[-1])
    print("privacy " + " ".join(f"{k}={v}" for k, v in sorted(priv.items())), flush=True)
    figures.append({"metric": "home relay named by one relay", "value": priv["single_relay_home_guess"],
                    "unit": "P", "ceiling": f"chance {priv['chance_home']}",
                    "note": f"5% colluders: {priv['colluders_home_guess']} (exact {priv['colluders_home_exact']})"})
    figures.append({"metric": "two route ids of a device linked by one relay", "value": priv["single_relay_epoch_link"],
                    "unit": "P", "ceiling": f"chance {priv['chance_epoch_link']}",
                    "note": f"5% colluders: {priv['colluders_epoch_link']}"})
    print(json.dumps({"bench": "adversarial", "figures": figures}))


if __name__ == "__main__":
    main()
