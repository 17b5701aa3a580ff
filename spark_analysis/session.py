"""One Spark session for the analysis: local[*] by default, any cluster by master URL."""

from __future__ import annotations

import glob
import os
import shutil
import time
from pathlib import Path
from urllib.parse import urlparse

from pyspark.sql import SparkSession


def find_java_home() -> str | None:
    """JAVA_HOME if set, else a Java 17 install (PySpark 4 needs 17 or newer), else the `java` on PATH."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    for pattern in ("/usr/lib/jvm/java-17-openjdk-*", "/usr/lib/jvm/*17*", "/usr/lib/jvm/*"):
        for candidate in sorted(glob.glob(pattern)):
            if Path(candidate, "bin", "java").exists():
                return candidate
    java = shutil.which("java")
    return str(Path(java).resolve().parent.parent) if java else None


LOCAL_PARTITIONS = 8  # local[*]: what the figures in docs/analysis.md were measured with
PARTITIONS_PER_CORE = 2  # a cluster: two shuffle partitions per executor core
EXECUTOR_WAIT_S = 30.0


def get_session(master: str | None = None, app_name: str = "inri-analyze",
                shuffle_partitions: int | None = None) -> SparkSession:
    """Build (or reuse) the session. Local masters bind to loopback and run without the web UI.

    Shuffle partitions: `shuffle_partitions` when given; else 8 on a local master, and on a cluster two
    per executor core (Spark's own default of 200 made a small trace three times slower on a two-core
    cluster than locally: every shuffle stage ran 200 near-empty tasks).
    """
    master = master or os.environ.get("INRI_SPARK_MASTER", "local[*]")
    java_home = find_java_home()
    if java_home:
        os.environ["JAVA_HOME"] = java_home
    builder = SparkSession.builder.appName(app_name).master(master)
    local = master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.memory", os.environ.get("INRI_SPARK_DRIVER_MEMORY", "4g"))
        )
    elif urlparse(master).hostname in ("127.0.0.1", "localhost"):
        # A cluster on this host's loopback (inri-analyze cluster up): the executors reach the driver there.
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    session = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    partitions = shuffle_partitions or (LOCAL_PARTITIONS if local else PARTITIONS_PER_CORE * cluster_cores(session))
    session.conf.set("spark.sql.shuffle.partitions", str(partitions))
    return session


def cluster_cores(session: SparkSession, wait_s: float = EXECUTOR_WAIT_S) -> int:
    """The executors' cores (Spark's default parallelism once an executor has registered; it waits up to
    wait_s for the first one, as a job would)."""
    sc = session.sparkContext
    deadline = time.monotonic() + wait_s
    # getExecutorMemoryStatus lists the driver too: more than one entry means an executor is up. PySpark's
    # StatusTracker has no executor list, so the JVM SparkContext is asked.
    jvm_sc = sc._jsc.sc()  # noqa: SLF001
    while jvm_sc.getExecutorMemoryStatus().size() <= 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    return max(1, sc.defaultParallelism)
