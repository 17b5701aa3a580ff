"""One Spark session for the analysis: local[*] by default, any cluster by master URL."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

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


def get_session(master: str | None = None, app_name: str = "inri-analyze", shuffle_partitions: int = 8) -> SparkSession:
    """Build (or reuse) the session. Local masters bind to loopback and run without the web UI."""
    master = master or os.environ.get("INRI_SPARK_MASTER", "local[*]")
    java_home = find_java_home()
    if java_home:
        os.environ["JAVA_HOME"] = java_home
    builder = SparkSession.builder.appName(app_name).master(master)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
            .config("spark.driver.memory", os.environ.get("INRI_SPARK_DRIVER_MEMORY", "4g"))
        )
    session = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
