"""Metrics every INRI daemon exposes about itself: its build and its process."""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Info, ProcessCollector

from inri import __version__


def build_info(registry: CollectorRegistry, service: str) -> None:
    """Register `inri_build_info{version, python, service}` (value 1) and the process metrics
    (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`,
    `process_start_time_seconds`: prometheus_client's ProcessCollector, from /proc) with a registry."""
    info = Info("inri_build", "the running INRI's version", registry=registry)
    info.info({"version": __version__, "python": platform.python_version(), "service": service})
    ProcessCollector(registry=registry)
