"""Where the JVM artifacts live: Spark's Kafka source and Delta Lake for the session, Kafka for the broker.

The Makefile fetches them with Maven (``jvm/spark/pom.xml``, ``jvm/broker/pom.xml``) into ``.jars/spark``
and ``.jars/broker`` next to ``.venv``; ``TICDC_DELTA_JARS`` points elsewhere. Two folders because the
broker's kafka-clients (4.x) must not meet Spark's (3.9). Without the folder a Spark session can still
fetch :data:`SPARK_PACKAGES` with Spark's own resolver (``spark.jars.packages``). Nothing here imports
pyspark.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from ticdc_delta.errors import ConfigError

__all__ = [
    "SPARK_PACKAGES",
    "HADOOP_AWS_PACKAGE",
    "jars_root",
    "spark_jars",
    "broker_classpath",
    "java_executable",
    "chooses_gc",
    "sets_jvm_flag",
]

#: The Maven coordinates of :func:`spark_jars`, for ``spark.jars.packages`` / ``spark-submit --packages``
#: (they match jvm/spark/pom.xml; Maven resolves spark-token-provider-kafka 4.0.0 there, see the pom).
SPARK_PACKAGES: tuple[str, ...] = (
    "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.4",
    "io.delta:delta-spark_2.13:4.0.1",
    "io.delta:delta-storage:4.0.1",
    "com.mysql:mysql-connector-j:9.1.0",
)

#: What an ``s3://`` / ``s3a://`` checkpoint needs on top: the Hadoop S3A filesystem of pyspark's Hadoop.
HADOOP_AWS_PACKAGE = "org.apache.hadoop:hadoop-aws:3.4.1"


def jars_root() -> Path:
    """``$TICDC_DELTA_JARS``, else ``.jars`` in the directory that holds the ``ticdc_delta`` package."""
    env = os.environ.get("TICDC_DELTA_JARS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / ".jars"


def spark_jars() -> list[str]:
    """The jar files for ``spark.jars`` (sorted), or ``[]`` when ``make`` has not fetched them here."""
    folder = jars_root() / "spark"
    if not folder.is_dir():
        return []
    return sorted(str(p) for p in folder.glob("*.jar"))


def broker_classpath() -> str:
    """The Java class path of the local Kafka broker (``.jars/broker/*``).

    Raises:
        ConfigError: the broker jars are missing (``make install`` fetches them).
    """
    folder = jars_root() / "broker"
    if not any(folder.glob("kafka_2.13-*.jar")):
        raise ConfigError(
            f"the local Kafka broker needs its jars in {folder}, found none: run `make install` "
            "(Maven fetches jvm/broker/pom.xml), or point TICDC_DELTA_JARS at a folder holding broker/"
        )
    return str(folder / "*")


def java_executable() -> str:
    """``$JAVA_HOME/bin/java``, else ``java`` on the PATH.

    Raises:
        ConfigError: no Java found (Java 17 is a prerequisite).
    """
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ConfigError("no java executable: install Java 17 or set JAVA_HOME")
    return found


_GC_FLAG = re.compile(r"-XX:\+Use\w*GC\b")
"""A JVM option that chooses a garbage collector (two of them stop the JVM from starting)."""


def chooses_gc(*options: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether any of ``options`` (JVM options as one string each), or the ``JAVA_TOOL_OPTIONS`` /
    ``JDK_JAVA_OPTIONS`` of ``environ`` (which every JVM reads), choose a garbage collector: then a JVM
    started with options of ours must not choose one too."""
    return any(_GC_FLAG.search(option) for option in _with_environment(options, environ))


def sets_jvm_flag(name: str, *options: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether any of ``options`` (JVM options as one string each), or the ``JAVA_TOOL_OPTIONS`` /
    ``JDK_JAVA_OPTIONS`` of ``environ``, set HotSpot flag ``name`` (``-XX:name=...``, ``-XX:+name``,
    ``-XX:-name``): then a JVM started with options of ours leaves it as given (the JVM reads the
    environment's options before its command line's, and the last setting of a flag wins)."""
    flag = re.compile(rf"-XX:[+-]?{re.escape(name)}(?![\w])")
    return any(flag.search(option) for option in _with_environment(options, environ))


def _with_environment(options: tuple[str, ...], environ: Mapping[str, str]) -> list[str]:
    """``options`` and the ``JAVA_TOOL_OPTIONS`` / ``JDK_JAVA_OPTIONS`` of ``environ``: every option a JVM
    started with ``options`` reads."""
    return [*options, environ.get("JAVA_TOOL_OPTIONS", ""), environ.get("JDK_JAVA_OPTIONS", "")]
