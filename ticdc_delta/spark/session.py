"""A local-mode SparkSession sized for small machines, with Spark's Kafka source and Delta Lake on it.

The JVM artifacts are the jars ``make`` fetched with Maven into ``.jars/spark`` (``spark.jars``); on a
machine without that folder the session asks Spark's own resolver for the same coordinates
(``spark.jars.packages``, :data:`ticdc_delta.jars.SPARK_PACKAGES`). Delta's SQL extension and catalog are
set either way.

Python workers (the executors' decode and foreachBatch helpers) are separate processes started by the
JVM. They must import ``ticdc_delta`` and run the same interpreter as the
driver (pyarrow, confluent-kafka), so the session puts the directory holding the ``ticdc_delta`` package
on ``PYTHONPATH`` for every Python process Spark starts, and points ``PYSPARK_PYTHON`` at
``sys.executable`` unless the user chose another interpreter. That lets tests and the demo run from a repo
checkout without installing the package.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..jars import chooses_gc, sets_jvm_flag
from ..locations import file_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["cache_in_session", "get_or_create_spark", "jar_confs", "own_session", "overridden", "submitted_confs",
           "under_spark_submit", "CACHE_IN_SESSION_CONFS", "CODEGEN_CACHE_ENTRIES", "DEFAULT_CONFS", "DELTA_CONFS",
           "JIT_OPTIONS", "LOCAL_CONFS", "PARALLEL_GC", "package_root"]

log = logging.getLogger(__name__)

CODEGEN_CACHE_ENTRIES = 500
"""Generated-code classes Spark keeps per JVM (``spark.sql.codegen.cache.maxEntries``, a static setting:
fixed when the session starts; Spark's default 100 is fewer than one micro-batch of one table uses).

Each entry holds its generated source and compiled class on the driver's heap: 53 KiB on average for the
job's plans (measured: the heap freed by emptying the cache after 10 batches, 224 entries), more for wide
tables. A long-running job fills any size (a few plans of each batch differ only in a literal), so 500
(~26 MiB at that average, against ~100 MiB for 2,000) bounds it in the default 1 GiB driver heap while
holding a few busy tables' plans. Once one table's plans are cached, 500 compiled no more than 2,000
did."""

CACHE_IN_SESSION_CONFS: dict[str, str] = {
    "spark.sql.sources.bucketing.autoBucketedScan.enabled": "false",
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
}
"""Settings under which caching a DataFrame (``persist``, and Delta's re-cache after each commit) uses the
session it is given instead of a copy of it.

Spark's cache manager plans a cached query with automatic bucketed scans off and, unless
``canChangeCachedPlanOutputPartitioning``, with adaptive execution's final-stage shuffle optimizations off:
when the session has them on (Spark's defaults), it clones the session for every ``persist`` and every
re-cache to turn them off in the copy. A micro-batch persists several frames and commits to several
tables, and those copies were never freed (Spark 4.0.1 kept every session; later versions still let
Delta's snapshots keep the sessions that read them): the driver's heap grew with the number of batches
(measured here on 4.0.1, with the engine's merge threads then making new sessions for every batch too:
~5 more live sessions and ~1.5 MiB more live heap after each batch). With these two settings the cache manager has
nothing to turn off. Neither changes the job's plans: it reads no bucketed tables (Kafka, Delta), and the
second only lets adaptive execution (off in :data:`DEFAULT_CONFS`) keep its final-stage optimizations in
a cached plan. The engine sets them on every session it uses (:func:`cache_in_session`)."""

UDF_INLINE_BYTES = "1g"
"""Python functions up to this size go inside Spark's tasks rather than as broadcasts of their own."""

#: Settings for a 2-core, few-GiB machine: few shuffle partitions, no UI, Arrow on, modest memory.
DEFAULT_CONFS: dict[str, str] = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "1g",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.faulthandler.enabled": "true",
    # the unit of work per micro-batch is small; AQE only adds planning time there
    "spark.sql.adaptive.enabled": "false",
    # secrets in option values (the Kafka source's sasl.jaas.config) never show in plans, logs or the UI
    "spark.redaction.regex": r"(?i)secret|password|token|access[.]?key|jaas",
    "spark.sql.redaction.string.regex": r'(?i)(password|secret|token)\s*=\s*("[^"]*"|[^\s;,)]+)',
    # Python workers are forked from a daemon that has pyarrow, confluent-kafka and the codecs loaded
    "spark.python.daemon.module": "ticdc_delta.spark.worker_daemon",
    # Spark keeps the classes it generates for a plan in an LRU cache of 100 entries by default; one
    # micro-batch of one table runs ~130 distinct ones (decode, rules, collapse, Delta's log replay, MERGE,
    # staging), so every batch evicted what the next one needed and compiled all of it again: measured
    # here ~500 compilations per 5 batches (~1.4 s of Janino and then the JIT's C2 work per batch) against
    # ~35 per batch once the cache holds them. Entries cost ~50 KiB of heap each: CODEGEN_CACHE_ENTRIES.
    "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
    # the frames a micro-batch persists (decoded rows, the columnar path's typed changes and their collapse)
    # are built once, read once or twice and dropped at the batch's end: Spark's encoding of every cached
    # column batch was CPU for memory held seconds (MEMORY_AND_DISK: what does not fit spills). Measured
    # alternately, fresh processes, 1M changes in 250k batches: a fresh JVM 18.1k/18.4k changes/s against
    # 17.6k/17.5k compressed, warm 28.5k/28.6k against 26.8k/27.4k (see docs/performance.md)
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    # pyspark ships a Python function whose pickle is over this size (1 MiB by default) as a broadcast,
    # written to a file in the driver's temporary directory that nothing deletes until the JVM exits: a
    # micro-batch whose function carries many Avro schemas or a catch-up batch's resolved marks left one
    # such file per batch (measured: 5 runs of a 2 MiB function, 5 files of 2 MiB). Under this bound the
    # function travels inside the task, whose broadcast Spark cleans up itself.
    "spark.broadcast.UDFCompressionThreshold": UDF_INLINE_BYTES,
    **CACHE_IN_SESSION_CONFS,
}

#: Delta Lake's SQL extension and catalog (``delta-spark`` jars, see :func:`jar_confs`).
DELTA_CONFS: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

PARALLEL_GC = "-XX:+UseParallelGC"
"""The driver's collector on a local master: the parallel (throughput) collector. Java 17's default G1
ran ~100 concurrent cycles in a 1M-change run (Arrow buffers and Kafka fetches are humongous objects to
it), its concurrent threads taking CPU from the two task threads: ~6 % fewer changes/s (measured, see
docs/performance.md)."""

JIT_OPTIONS: tuple[str, ...] = ("-XX:MaxInlineLevel=9", "-XX:InlineSmallCode=1000")
"""HotSpot's C2 compiler options for the driver's JVM on a local master: inline less deep (9 calls, Java
17's default is 15) and into smaller compiled methods (1,000 bytes, against 2,500). The JIT compiles Spark's,
Delta's and the Kafka client's code for the first minutes of a job, its compiler thread taking about one of
two cores meanwhile; a C2 compilation's cost grows with what it inlines, and Spark's deep call chains
gain little from the deepest inlining. Measured on a fresh JVM (1M changes, alternately in fresh
processes): ~6 % more changes/s, the warm rate unchanged (docs/performance.md)."""

#: Only for ``local[...]`` masters: keep the driver on loopback (no host name lookups, nothing exposed),
#: read Delta logs in few partitions and collect the JVM's garbage for throughput (a cluster keeps its own
#: settings).
LOCAL_CONFS: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # Delta reads a table's log into this many partitions before every MERGE/write (default 50): on one
    # machine 2 halves the fixed cost of a MERGE (measured ~4.5 s -> ~2.5 s on 2 cores)
    "spark.databricks.delta.snapshotPartitions": "2",
    # the driver's JVM, which runs the tasks too: the parallel collector and JIT_OPTIONS (see
    # _default_java_options, which leaves out what the JVM's options already choose)
    "spark.driver.defaultJavaOptions": " ".join((PARALLEL_GC, *JIT_OPTIONS)),
}


def _default_java_options(settings: Mapping[str, str], environ: Mapping[str, str]) -> str | None:
    """``spark.driver.defaultJavaOptions`` for a local master's JVM (``None``: none of the job's): the
    parallel collector (:data:`PARALLEL_GC`) unless the JVM's options choose a collector and each of
    :data:`JIT_OPTIONS` whose flag they do not set (:func:`_given_java_options`); none at all when the
    launcher's settings file sets ``spark.driver.defaultJavaOptions`` (the user's)."""
    given = _given_java_options(settings, environ)
    if given is None:
        return None
    options = [] if chooses_gc(*given, environ=environ) else [PARALLEL_GC]
    options += [o for o in JIT_OPTIONS if not sets_jvm_flag(o[4:].partition("=")[0], *given, environ=environ)]
    return " ".join(options) or None


def _given_java_options(settings: Mapping[str, str], environ: Mapping[str, str]) -> tuple[str, str] | None:
    """The driver JVM's options given besides the job's :data:`LOCAL_CONFS`: ``spark.driver.extraJavaOptions``
    (of ``settings`` or of the launcher's settings file, :func:`_launcher_settings`) and ``PYSPARK_SUBMIT_ARGS``
    (``--driver-java-options``, ``--conf``); ``None`` when the launcher's settings file sets
    ``spark.driver.defaultJavaOptions`` (then the default options are the user's)."""
    launcher = {} if under_spark_submit(environ) else _launcher_settings(environ)
    if "spark.driver.defaultJavaOptions" in launcher:
        return None
    return ({**launcher, **settings}.get("spark.driver.extraJavaOptions", ""), environ.get("PYSPARK_SUBMIT_ARGS", ""))


def _read_properties(path: Path) -> dict[str, str]:
    """A Java properties file as Spark's launcher reads it (``key value`` or ``key=value`` lines, ``#``/``!``
    comments, a line ending in an odd number of backslashes continued on the next); ``{}`` when it is not
    there."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return {}
    out: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending = line[:-1]
            continue
        pending = ""
        found = re.match(r"((?:[^\\\s=:]|\\.)+)\s*[=:]?\s*(.*)", line)
        if found:
            out[found[1].replace("\\", "")] = found[2].strip()
    return out


def _launcher_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings file Spark's launcher reads when this process starts a JVM itself (no spark-submit):
    ``--properties-file`` of ``PYSPARK_SUBMIT_ARGS`` (with ``spark-defaults.conf`` under it if
    ``--load-spark-defaults``), else ``spark-defaults.conf`` in ``SPARK_CONF_DIR`` or in Spark's home's
    ``conf``. What it sets joins the JVM's options before the job's own, so the job must not contradict it."""
    args = shlex.split(environ.get("PYSPARK_SUBMIT_ARGS", ""))
    given = None
    for i, arg in enumerate(args):
        if arg == "--properties-file" and i + 1 < len(args):
            given = args[i + 1]
        elif arg.startswith("--properties-file="):
            given = arg.partition("=")[2]
    settings = {}
    if given is None or "--load-spark-defaults" in args:
        conf_dir = environ.get("SPARK_CONF_DIR")
        if not conf_dir:
            from pyspark.find_spark_home import _find_spark_home

            try:
                conf_dir = os.path.join(environ.get("SPARK_HOME") or _find_spark_home(), "conf")
            except SystemExit:  # no Spark home: the launcher cannot start either, and says so itself
                conf_dir = None
        if conf_dir:
            settings.update(_read_properties(Path(conf_dir, "spark-defaults.conf")))
    if given is not None:
        settings.update(_read_properties(Path(given)))
    return settings


def package_root() -> str:
    """The directory that contains the ``ticdc_delta`` package (the repo root in a checkout)."""
    return str(Path(__file__).resolve().parents[2])


def _python_path() -> str:
    """``PYTHONPATH`` for Spark's Python workers: the package root first, then what was set already."""
    parts = [package_root()]
    parts += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts)


def jar_confs(user: Mapping[str, str] | None = None) -> dict[str, str]:
    """``spark.jars`` with the fetched jars (``.jars/spark``), else ``spark.jars.packages`` with their
    coordinates; jars or packages the user set are kept and come first."""
    from ticdc_delta.jars import SPARK_PACKAGES, spark_jars

    user = user or {}
    jars = spark_jars()
    if jars:
        key, ours = "spark.jars", jars
    else:
        key, ours = "spark.jars.packages", list(SPARK_PACKAGES)
    theirs = [x for x in str(user.get(key, "")).split(",") if x.strip()]
    return {key: ",".join(theirs + [x for x in ours if x not in theirs])}


def under_spark_submit(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this Python process (of environment ``environ``) was started by spark-submit (its JVM, and
    the gateway to it, are up before any session is)."""
    return "PYSPARK_GATEWAY_PORT" in environ


def submitted_confs() -> dict[str, str]:
    """The settings spark-submit gave the JVM it started (``--conf``, ``--jars``/``--packages``,
    ``spark-defaults.conf``), read from that JVM; ``{}`` when not under spark-submit."""
    if not under_spark_submit():
        return {}
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's gateway (starts no JVM)
    return dict(SparkConf().getAll())


_FILE_LISTS = ("spark.jars", "spark.files", "spark.submit.pyFiles")
"""Settings that list files, which spark-submit writes as ``file:`` URLs: compared as sets of paths."""


def _paths(value: str) -> set[str]:
    """The files of a comma-separated list, a ``file:`` URL (``file:/x``, ``file:///x``, percent-encoded as
    spark-submit writes a path with spaces) as its path."""
    out = set()
    for item in value.split(","):
        item = item.strip()
        try:
            item = file_path(item)
        except ValueError:  # another host's file: not this machine's path, compared as written
            pass
        if item:
            out.add(item)
    return out


def overridden(ours: Mapping[str, str], submitted: Mapping[str, str]) -> list[str]:
    """The keys of ``ours`` (the job's settings) that spark-submit set otherwise (``submitted``), sorted:
    what the job logs it keeps of spark-submit's. A list of files that names the same files (spark-submit
    writes ``file:`` URLs where the job has paths) is not a difference."""
    kept = []
    for key, value in ours.items():
        if key not in submitted or submitted[key] == value:
            continue
        if key in _FILE_LISTS and _paths(submitted[key]) == _paths(value):
            continue
        kept.append(key)
    return sorted(kept)


def get_or_create_spark(
    app_name: str,
    master: str | None = "local[2]",
    confs: Mapping[str, Any] | None = None,
) -> "SparkSession":
    """Return the active SparkSession, or build a local one tuned for small machines.

    ``master=None`` leaves the master to whoever launched Python (spark-submit's ``--master``).

    ``confs`` override :data:`DEFAULT_CONFS`; JVM-level settings (driver memory, jars, Delta's extension)
    only take effect when this call starts the JVM (under spark-submit, ``--jars``/``--packages`` and
    ``--conf`` give them: see the README). Under spark-submit, what it set (:func:`submitted_confs`) wins
    over both: a cluster's ``spark.sql.shuffle.partitions`` is not cut to this machine-sized default, and
    its ``--name`` to ``app_name`` (spark-submit's default name, the script's file name, is).

    Raises:
        TypeError: ``app_name`` is not a non-empty string or ``confs`` is not a mapping.
    """
    if not isinstance(app_name, str) or not app_name:
        raise TypeError("app_name must be a non-empty str")
    if confs is not None and not isinstance(confs, Mapping):
        raise TypeError(f"confs must be a mapping, got {type(confs).__name__}")

    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None:
        python_path = _python_path()
        # The JVM (started below) passes its environment on to the Python workers it starts, so setting
        # these in our own environment before it starts reaches every Python worker of a local session.
        os.environ["PYTHONPATH"] = python_path
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        settings: dict[str, str] = {**DEFAULT_CONFS, **DELTA_CONFS}
        if master is not None and master.startswith("local"):
            # a cluster's executors get the package from their own install or --py-files instead
            settings.update(LOCAL_CONFS)
            settings["spark.executorEnv.PYTHONPATH"] = python_path
        user = {k: str(v) for k, v in (confs or {}).items()}
        settings.update(user)
        if "spark.driver.defaultJavaOptions" in settings and "spark.driver.defaultJavaOptions" not in user:
            ours = _default_java_options(settings, os.environ)  # (ours: the collector and JIT_OPTIONS)
            if ours is None:
                del settings["spark.driver.defaultJavaOptions"]
            else:
                settings["spark.driver.defaultJavaOptions"] = ours
        settings.update(jar_confs(user))
        settings.setdefault("spark.app.name", app_name)  # (a spark.app.name in confs wins, as before)
        submitted = submitted_confs()
        if submitted.get("spark.app.name") == Path(sys.argv[0]).name:
            del submitted["spark.app.name"]  # spark-submit's default (the script's file name), not a --name
        kept = overridden(settings, submitted)
        if kept:
            log.info("keeping the settings spark-submit gave: %s", ", ".join(kept))
        settings = {k: v for k, v in settings.items() if k not in submitted}
        builder = SparkSession.builder
        if master is not None:
            builder = builder.master(master)
        for key, value in settings.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        log.info("Spark session %s", describe_session(spark))
    else:
        spark = active
        for key, value in (confs or {}).items():
            try:
                spark.conf.set(key, str(value))
            except Exception as exc:  # static settings cannot change on a running session
                log.warning("keeping %s of the running SparkSession: %s", key, exc)
    return spark


SESSION_SUMMARY = ("spark.sql.shuffle.partitions", "spark.default.parallelism", "spark.sql.adaptive.enabled",
                   "spark.sql.codegen.cache.maxEntries")
"""The settings :func:`describe_session` shows, besides the application's name and master."""


def describe_session(spark: "SparkSession") -> str:
    """``'<app name>' on <master>: <key>=<value>, ...`` for the settings of :data:`SESSION_SUMMARY` as the
    session has them (what the job logs when it starts one: which of the job's defaults, the YAML's
    ``spark.conf`` and spark-submit's own settings won)."""
    conf = spark.sparkContext.getConf()
    shown = ", ".join(f"{key}={conf.get(key, None) or spark.conf.get(key, None)}" for key in SESSION_SUMMARY)
    return f"{conf.get('spark.app.name')!r} on {conf.get('spark.master')}: {shown}"


def own_session(spark: "SparkSession") -> "SparkSession":
    """A new session on ``spark``'s context (``newSession()``: its own SQL settings and temporary views)
    with :data:`CACHE_IN_SESSION_CONFS` set. Make one per thread or purpose and keep it, not one per batch:
    a session can outlive its use (Delta's snapshots keep the sessions that read them)."""
    return cache_in_session(spark.newSession())


def cache_in_session(session: "SparkSession") -> "SparkSession":
    """``session``, with :data:`CACHE_IN_SESSION_CONFS` set on it (what the engine does to every session
    it uses: its own ones and each micro-batch's)."""
    for key, value in CACHE_IN_SESSION_CONFS.items():
        session.conf.set(key, value)
    return session
