"""The stem phase's acceptance (issue 19): `inri-sim privacy` at 1,000 relays, stem off and on in one
run, and the stem's price on baseline-1k. Prints the side-by-side table, then the figures as JSON
(last line) with the issue's ceilings: with the stem on, 5% colluders pin the home exactly for at
most 10% of registrations and link two route ids of a device with probability at most 0.2, one
relay names the home at most 2x chance, stretch median at most 1.3 and delivery unchanged."""

from __future__ import annotations

import json
from dataclasses import replace

from simulations.privacy import measure, table
from simulations.scenario import load
from simulations.sim import Simulator


def main() -> None:
    results = {m: measure(1000, 100, 0.05, 1, stem=m == "on") for m in ("off", "on")}
    print(table(results))
    on = results["on"]
    base = load("baseline-1k")
    price = {m: Simulator(replace(base, engine=replace(base.engine, stem=m == "on"))).run().summary
             for m in ("off", "on")}
    for m, s in price.items():
        print(f"baseline-1k stem {m}: stretch median {s['stretch_median']:.3f} p95 {s['stretch_p95']:.3f}, "
              f"convergence p50 {s['convergence_p50_s']:.3f} s, delivery {s['delivery_ratio']}")
    figures = [
        {"metric": "colluders_home_exact (stem on)", "value": on["colluders_home_exact"], "unit": "share",
         "ceiling": 0.10, "note": f"stem off {results['off']['colluders_home_exact']}"},
        {"metric": "colluders_epoch_link (stem on)", "value": on["colluders_epoch_link"], "unit": "P",
         "ceiling": 0.2, "note": f"stem off {results['off']['colluders_epoch_link']}"},
        {"metric": "single relay names the home / chance (stem on)",
         "value": round(on["single_relay_home_guess"] / on["single_relay_chance_home"], 2), "unit": "x",
         "ceiling": 2.0, "note": (f"first spy {on['single_relay_first_spy'] / on['single_relay_chance_home']:.2f}x "
                                  f"(about 1x in any stem design), the flood "
                                  f"{on['single_relay_flood_guess'] / on['single_relay_chance_home']:.2f}x; "
                                  f"floor of any stem {on['single_relay_floor'] / on['single_relay_chance_home']:.2f}x "
                                  f"over {on['single_observers']} relays")},
        {"metric": "baseline-1k stretch_median (stem on)", "value": price["on"]["stretch_median"], "unit": "x",
         "ceiling": 1.3, "note": f"stem off {price['off']['stretch_median']:.3f}"},
        {"metric": "baseline-1k delivery_ratio (stem on)", "value": price["on"]["delivery_ratio"], "unit": "share",
         "note": f"stem off {price['off']['delivery_ratio']}"},
    ]
    print(json.dumps({"bench": "privacy", "figures": figures}))


if __name__ == "__main__":
    main()
