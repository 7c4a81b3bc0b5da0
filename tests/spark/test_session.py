"""Which jars the Spark session gets (no JVM needed: the settings are computed before it starts), and
what its settings do."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.jars import SPARK_PACKAGES
from ticdc_delta.spark.session import (CODEGEN_CACHE_ENTRIES, JIT_OPTIONS, PARALLEL_GC, _default_java_options,
                                       _launcher_settings, jar_confs, overridden)


def _collector_chosen_elsewhere(settings: dict[str, str], environ: dict[str, str]) -> bool:
    """Whether the job's default Java options leave the collector out (the JVM's options choose one, or
    the launcher's settings file sets the default options)."""
    return PARALLEL_GC not in (_default_java_options(settings, environ) or "").split()


def test_fetched_jars_go_on_spark_jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "spark"
    folder.mkdir()
    for name in ("spark-sql-kafka-0-10_2.13-4.0.4.jar", "delta-spark_2.13-4.0.1.jar"):
        (folder / name).write_bytes(b"")
    monkeypatch.setenv("TICDC_DELTA_JARS", str(tmp_path))
    confs = jar_confs({"spark.jars": "/opt/extra.jar"})
    assert list(confs) == ["spark.jars"]
    jars = confs["spark.jars"].split(",")
    assert jars[0] == "/opt/extra.jar"  # the user's come first
    assert sorted(Path(j).name for j in jars[1:]) == ["delta-spark_2.13-4.0.1.jar", "spark-sql-kafka-0-10_2.13-4.0.4.jar"]


def test_what_spark_submit_set_otherwise_is_named_once_and_only_then() -> None:
    ours = {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g", "spark.ui.enabled": "false",
            "spark.jars": "/repo/.jars/spark/a.jar,/repo/.jars/spark/b.jar"}
    # spark-submit writes the same jars as file: URLs, in its own order: not a difference
    same_jars = {"spark.jars": "file:///repo/.jars/spark/b.jar,file:/repo/.jars/spark/a.jar",
                 "spark.sql.shuffle.partitions": "400", "spark.ui.enabled": "false", "spark.app.name": "x"}
    assert overridden(ours, same_jars) == ["spark.sql.shuffle.partitions"]
    other_jars = {"spark.jars": "file:///repo/.jars/spark/a.jar", "spark.driver.memory": "4g"}
    assert overridden(ours, other_jars) == ["spark.driver.memory", "spark.jars"]
    assert overridden(ours, {}) == []
    # a path with a space, which spark-submit percent-encodes in its URL
    spaced = {"spark.jars": "/my repo/.jars/a.jar"}
    assert overridden(spaced, {"spark.jars": "file:/my%20repo/.jars/a.jar"}) == []


def test_without_the_folder_spark_resolves_the_same_coordinates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICDC_DELTA_JARS", str(tmp_path / "missing"))
    confs = jar_confs({"spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.4.1"})
    assert confs == {
        "spark.jars.packages": ",".join(["org.apache.hadoop:hadoop-aws:3.4.1", *SPARK_PACKAGES])
    }
    assert "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.4" in SPARK_PACKAGES
    assert "io.delta:delta-spark_2.13:4.0.1" in SPARK_PACKAGES


def test_packages_match_the_pom() -> None:
    pom = (Path(__file__).resolve().parents[2] / "jvm" / "spark" / "pom.xml").read_text()
    for coordinate in SPARK_PACKAGES:
        group, artifact, version = coordinate.split(":")
        assert f"<artifactId>{artifact}</artifactId>" in pom
    spark_version = re.search(r"<spark.version>([^<]+)</spark.version>", pom).group(1)  # type: ignore[union-attr]
    delta_version = re.search(r"<delta.version>([^<]+)</delta.version>", pom).group(1)  # type: ignore[union-attr]
    assert f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version}" in SPARK_PACKAGES
    assert {f"io.delta:delta-spark_2.13:{delta_version}", f"io.delta:delta-storage:{delta_version}"} <= set(SPARK_PACKAGES)
    # the same versions as the pinned Python packages
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"pyspark=={spark_version}"' in pyproject and f'"delta-spark=={delta_version}"' in pyproject
    assert (spark_version, delta_version) == ("4.0.4", "4.0.1")


def test_a_batch_worth_of_generated_code_is_compiled_once(spark: Any) -> None:
    """One micro-batch of one table runs ~130 distinct generated-code plans: more than Spark's default
    cache of 100, so every batch compiled them all again (``CODEGEN_CACHE_ENTRIES``)."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    # 150 whole-stage plans, each its own source (the literal is compiled into it)
    plans = functools.reduce(DataFrame.unionAll, [spark.range(1).select((F.col("id") + i).alias("v"))
                                                  for i in range(150)])
    assert sorted(r["v"] for r in plans.collect()) == list(range(150))
    compiled = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_SOURCE_CODE_SIZE()
    before = compiled.getCount()
    plans.collect()  # the same plans again: all from the cache
    assert compiled.getCount() == before
    assert spark.conf.get("spark.sql.codegen.cache.maxEntries") == str(CODEGEN_CACHE_ENTRIES)


def test_a_local_driver_collects_with_the_parallel_collector_unless_told_otherwise(spark: Any, tmp_path: Path) -> None:
    """The shared session's JVM (local master, its own ``-D`` options) runs the parallel collector; a
    collector chosen in the driver's Java options or the JVM's environment is left alone (two collectors
    stop the JVM from starting)."""
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    assert sorted(bean.getName() for bean in beans) == ["PS MarkSweep", "PS Scavenge"]

    none = {"SPARK_CONF_DIR": str(tmp_path)}  # no spark-defaults.conf there
    not_a_collector = "-Dderby.system.home=/x -XX:+UseGCOverheadLimit"
    assert not _collector_chosen_elsewhere({"spark.driver.extraJavaOptions": not_a_collector}, none)
    assert _collector_chosen_elsewhere({"spark.driver.extraJavaOptions": "-Xss4m -XX:+UseG1GC"}, none)
    assert _collector_chosen_elsewhere({}, {**none, "JAVA_TOOL_OPTIONS": "-XX:+UseZGC"})
    assert _collector_chosen_elsewhere({}, {**none, "JDK_JAVA_OPTIONS": "-XX:+UseShenandoahGC -Dx=1"})
    assert not _collector_chosen_elsewhere({}, {**none, "JAVA_TOOL_OPTIONS": "-Dfile.encoding=UTF-8"})
    args = "--driver-java-options -XX:+UseSerialGC pyspark-shell"
    assert _collector_chosen_elsewhere({}, {**none, "PYSPARK_SUBMIT_ARGS": args})


def test_a_local_drivers_jit_inlines_less_unless_told_otherwise(spark: Any, tmp_path: Path) -> None:
    """The shared session's JVM (local master) runs with :data:`JIT_OPTIONS`; a flag of them the JVM's
    options set already is left to them, the collector chosen or not, and the launcher's own default options
    replace all of the job's."""
    vm = spark._jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        spark._jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    assert [f"-XX:{name}={vm.getVMOption(name).getValue()}" for name in ("MaxInlineLevel", "InlineSmallCode")] == list(
        JIT_OPTIONS)

    none = {"SPARK_CONF_DIR": str(tmp_path)}  # no spark-defaults.conf there
    assert _default_java_options({}, none) == " ".join((PARALLEL_GC, *JIT_OPTIONS))
    extra = {"spark.driver.extraJavaOptions": "-XX:+UseG1GC -XX:MaxInlineLevel=15"}
    assert _default_java_options(extra, none) == "-XX:InlineSmallCode=1000"
    assert _default_java_options({}, {**none, "JAVA_TOOL_OPTIONS": "-XX:InlineSmallCode=2500"}) == (
        f"{PARALLEL_GC} -XX:MaxInlineLevel=9")
    # a longer flag of the same beginning is another flag
    assert _default_java_options({}, {**none, "JDK_JAVA_OPTIONS": "-XX:MaxInlineLevelX=3"}) == " ".join(
        (PARALLEL_GC, *JIT_OPTIONS))
    everything = "--driver-java-options '-XX:+UseSerialGC -XX:MaxInlineLevel=15 -XX:InlineSmallCode=2500' pyspark-shell"
    assert _default_java_options({}, {**none, "PYSPARK_SUBMIT_ARGS": everything}) is None
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.defaultJavaOptions=-Xss4m\n")
    assert _default_java_options({}, none) is None


def test_the_launchers_settings_file_is_read_as_spark_reads_it(tmp_path: Path) -> None:
    """A local session's JVM is started by Spark's launcher, which adds ``spark-defaults.conf`` (or the
    ``--properties-file`` of ``PYSPARK_SUBMIT_ARGS``) to the job's settings: a collector chosen there, or
    default Java options of the user's, are not contradicted by the job's own (checked by hand: with
    ``-XX:+UseG1GC`` in a ``SPARK_CONF_DIR``'s file, the job's JVM did not start before this)."""
    defaults = tmp_path / "spark-defaults.conf"
    env = {"SPARK_CONF_DIR": str(tmp_path)}
    assert _launcher_settings(env) == {}
    assert not _collector_chosen_elsewhere({}, env)

    defaults.write_text("# a comment\n! another\n\nspark.driver.memory 2g\n"
                        "spark.driver.extraJavaOptions   -Dx=1 \\\n    -XX:+UseG1GC\n")
    assert _launcher_settings(env) == {"spark.driver.memory": "2g", "spark.driver.extraJavaOptions": "-Dx=1 -XX:+UseG1GC"}
    assert _collector_chosen_elsewhere({}, env)
    # the job's own extraJavaOptions replace the file's (``--conf`` wins over it): then only they count
    assert not _collector_chosen_elsewhere({"spark.driver.extraJavaOptions": "-Dy=2"}, env)
    # under spark-submit the JVM runs already, and its settings are read from it
    assert not _collector_chosen_elsewhere({}, {**env, "PYSPARK_GATEWAY_PORT": "41000"})

    # the file's default Java options are the user's: the job's never replace them
    defaults.write_text("spark.driver.defaultJavaOptions=-Xss4m\n")
    assert _collector_chosen_elsewhere({}, env)

    # --properties-file replaces spark-defaults.conf, unless --load-spark-defaults
    defaults.write_text("spark.driver.memory: 3g\n")
    job = tmp_path / "a job.conf"
    job.write_text("spark.driver.extraJavaOptions=-XX:+UseZGC\n")
    args = f"--properties-file {shlex.quote(str(job))} pyspark-shell"
    assert _launcher_settings({**env, "PYSPARK_SUBMIT_ARGS": args}) == {"spark.driver.extraJavaOptions": "-XX:+UseZGC"}
    args = f"--load-spark-defaults {shlex.quote('--properties-file=' + str(job))} pyspark-shell"
    assert _launcher_settings({**env, "PYSPARK_SUBMIT_ARGS": args}) == {
        "spark.driver.memory": "3g", "spark.driver.extraJavaOptions": "-XX:+UseZGC"}

    # without SPARK_CONF_DIR: the conf folder of Spark's home
    (tmp_path / "home" / "conf").mkdir(parents=True)
    (tmp_path / "home" / "conf" / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -XX:+UseSerialGC\n")
    assert _collector_chosen_elsewhere({}, {"SPARK_HOME": str(tmp_path / "home")})


def test_a_big_python_function_leaves_no_file_behind_on_the_driver(spark: Any) -> None:
    """A micro-batch's function over 1 MiB (many Avro schemas, a catch-up batch's resolved marks) was a
    pyspark broadcast: one file per batch in the driver's temporary directory, never deleted."""
    import os

    payload = os.urandom(2 * 1024 * 1024)

    def passthrough(batches: Any, carried: bytes = payload) -> Any:
        yield from batches

    frame = spark.range(4)
    temp_dir = spark.sparkContext._temp_dir  # noqa: SLF001 - where pyspark writes its broadcasts
    before = set(os.listdir(temp_dir))
    for _ in range(3):
        assert frame.mapInArrow(passthrough, frame.schema).count() == 4
    assert set(os.listdir(temp_dir)) == before
