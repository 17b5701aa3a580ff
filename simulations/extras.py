"""The `sim` extra: what only the simulator needs (pyarrow for Parquet traces, numpy for the metrics,
tqdm for the progress bar). A relay install does not carry it, so the simulator says what is missing
in one line instead of failing on an import deep inside a run."""

from __future__ import annotations

import importlib
from types import ModuleType

INSTALL_HINT = "pip install 'inri[sim]'"


class MissingExtra(ImportError):
    """A module of the `sim` extra is not installed."""

    def __init__(self, module: str, purpose: str) -> None:
        super().__init__(f"{module} is not installed ({purpose} needs it): {INSTALL_HINT}", name=module)


def require(module: str, purpose: str) -> ModuleType:
    """Import a module of the extra, or raise MissingExtra naming it and what needs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(module.partition(".")[0], purpose) from exc
