"""Shared test setup: hypothesis profiles (about 200 examples in CI, full counts under make bench), and
the rule that a test starting a process is marked `integration`."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import HealthCheck, settings

# CI is derandomized: the same 200 examples per property on every run, so a red CI is reproducible and
# never a roll of the dice; `make bench` (profile "full") explores with fresh random examples.
settings.register_profile(
    "ci",
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "full",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))



@pytest.fixture(autouse=True)
def _a_process_needs_the_integration_marker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail a test that starts a process without `@pytest.mark.integration` (the marker's promise:
    `-m "not integration"` runs nothing but in-process code). Every way of starting one in Python
    (subprocess.run, Popen, trio.run_process, PySpark's gateway) goes through subprocess.Popen."""
    if request.node.get_closest_marker("integration"):
        return
    nodeid = request.node.nodeid

    def refuse(self: subprocess.Popen[bytes], args: object, *rest: object, **kw: object) -> None:
        raise AssertionError(f"{nodeid} starts a process ({args!r:.100}) but is not marked @pytest.mark.integration")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
