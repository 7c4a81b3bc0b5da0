"""The job under spark-submit, as the README runs it on a cluster: ``jobs/ticdc_to_delta.py`` with the
fetched jars on ``--jars`` and Delta's settings on ``--conf``. What spark-submit sets wins over the job's
small-machine defaults (a cluster's shuffle partitions are not cut to 2); the rest of them still apply."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.config import load_config
from ticdc_delta.jars import spark_jars
from ticdc_delta.simulator import simulate
from ticdc_delta.simulator.output import KafkaSink
from ticdc_delta.spark.batch_handler import _ConfiguredSink
from ticdc_delta.spark.session import CODEGEN_CACHE_ENTRIES
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import canal_job_yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _spark_submit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """pyspark's own ``spark-submit`` (``$SPARK_HOME/bin``) on ``local[1]``, with the fetched jars and
    Delta's settings, as the README's cluster recipe gives them."""
    from pyspark.find_spark_home import _find_spark_home

    home = _find_spark_home()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env.update(SPARK_HOME=home, PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(REPO))
    jars = spark_jars()
    if not jars:
        pytest.fail("no jars in .jars/spark: `make install` fetches them")
    command = [
        str(Path(home) / "bin" / "spark-submit"), "--master", "local[1]", "--driver-memory", "768m",
        "--jars", ",".join(jars),
        "--conf", "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
        "--conf", "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "--conf", "spark.ui.enabled=false", *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=str(REPO), timeout=timeout)


def test_the_job_under_spark_submit_keeps_what_spark_submit_set(broker: Any, tmp_path: Path,
                                                               unique_name: Any) -> None:
    topic = unique_name("submit")
    result = simulate("canal-json", {"enable-tidb-extension": "true"}, seed=11, events=300, tables=2, partitions=2,
                      sink=KafkaSink(broker.bootstrap_servers, topic, 2), topic=topic)
    cfg_path = canal_job_yaml(tmp_path, "submitted", broker.bootstrap_servers, topic, "spark",
                              'spark: {conf: {spark.sql.shuffle.partitions: "5"}}\n')
    submitted = ("--conf", "spark.sql.shuffle.partitions=3", "--conf", "spark.default.parallelism=3")
    run = _spark_submit(*submitted, "jobs/ticdc_to_delta.py", "--config", str(cfg_path), "--once")
    assert run.returncode == 0, run.stderr[-3000:]
    # (spark-submit merges the Python driver's stderr into its stdout)
    said = [line.split("keeping the settings spark-submit gave: ", 1)[1] for line in run.stdout.splitlines()
            if "keeping the settings spark-submit gave: " in line]
    assert said and {"spark.default.parallelism", "spark.sql.shuffle.partitions"} <= set(said[0].split(", "))
    assert "spark.app.name" not in said[0]  # no --name: spark-submit's default (the script's name) gives way
    # the session the job started, as it logs it
    started = [line.split("Spark session ", 1)[1] for line in run.stdout.splitlines() if "Spark session '" in line]
    assert len(started) == 1, run.stdout[-3000:]
    name, rest = started[0].split(" on ", 1)
    master, shown = rest.split(": ", 1)
    assert (name, master) == ("'ticdc-delta-submitted'", "local[1]")  # the job's own name, spark-submit's master
    assert dict(item.split("=", 1) for item in shown.split(", ")) == {
        "spark.sql.shuffle.partitions": "3",  # spark-submit's, not the YAML's 5 nor the default 2
        "spark.default.parallelism": "3",
        "spark.sql.adaptive.enabled": "false",  # the job's defaults where spark-submit set nothing
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
    }
    cfg = load_config(cfg_path)
    diffs = compare_with_oracle(_ConfiguredSink(cfg), result.oracle, tz=cfg.sink.source_timezone)
    assert not [d.describe() for d in diffs if not d.ok]
    assert sum(d.actual_rows for d in diffs) > 0
