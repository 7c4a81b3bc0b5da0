"""Which jars the Spark session gets (no JVM needed: the settings are computed before it starts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ticdc_delta.jars import SPARK_PACKAGES
from ticdc_delta.spark.session import jar_confs


def test_fetched_jars_go_on_spark_jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "spark"
    folder.mkdir()
    for name in ("spark-sql-kafka-0-10_2.13-4.0.1.jar", "delta-spark_2.13-4.0.0.jar"):
        (folder / name).write_bytes(b"")
    monkeypatch.setenv("TICDC_DELTA_JARS", str(tmp_path))
    confs = jar_confs({"spark.jars": "/opt/extra.jar"})
    assert list(confs) == ["spark.jars"]
    jars = confs["spark.jars"].split(",")
    assert jars[0] == "/opt/extra.jar"  # the user's come first
    assert sorted(Path(j).name for j in jars[1:]) == ["delta-spark_2.13-4.0.0.jar", "spark-sql-kafka-0-10_2.13-4.0.1.jar"]


def test_without_the_folder_spark_resolves_the_same_coordinates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICDC_DELTA_JARS", str(tmp_path / "missing"))
    confs = jar_confs({"spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.4.1"})
    assert confs == {
        "spark.jars.packages": ",".join(["org.apache.hadoop:hadoop-aws:3.4.1", *SPARK_PACKAGES])
    }
    assert "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.1" in SPARK_PACKAGES
    assert "io.delta:delta-spark_2.13:4.0.0" in SPARK_PACKAGES


def test_packages_match_the_pom() -> None:
    pom = (Path(__file__).resolve().parents[2] / "jvm" / "spark" / "pom.xml").read_text()
    for coordinate in SPARK_PACKAGES:
        group, artifact, version = coordinate.split(":")
        assert f"<artifactId>{artifact}</artifactId>" in pom
    assert "<spark.version>4.0.1</spark.version>" in pom and "<delta.version>4.0.0</delta.version>" in pom
    # the same versions as the pinned Python packages
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"pyspark==4.0.1"' in pyproject and '"delta-spark==4.0.0"' in pyproject
