"""The progress bar of a run: tqdm over virtual time on stderr, when asked (tqdm is optional)."""

from __future__ import annotations

import sys
from typing import Any

from simulations.extras import MissingExtra, require


class Progress:
    """A tqdm bar over virtual time; without tqdm, one line says why there is none and the run goes on."""

    def __init__(self, total: float, enabled: bool) -> None:
        self._bar: Any = None
        self._last = 0.0
        if not enabled:
            return
        try:
            tqdm = require("tqdm", "the progress bar").tqdm
        except MissingExtra as exc:
            print(f"inri-sim: no progress bar: {exc}", file=sys.stderr)
            return
        self._bar = tqdm(total=round(total, 1), unit="sim-s", file=sys.stderr, mininterval=1.0,
                         bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} sim-s [{elapsed}<{remaining}] {postfix}")

    def update(self, t: float, events: int) -> None:
        """The run has reached virtual time t after `events` events."""
        if self._bar is not None and t > self._last:
            self._bar.update(round(t - self._last, 3))
            self._bar.set_postfix_str(f"{events:,} events", refresh=False)
            self._last = t

    def close(self) -> None:
        """The run is over."""
        if self._bar is not None:
            self._bar.close()
