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
    # (the session's settings as the job sees them, printed by a probe run in the same way)
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\n"
        "from ticdc_delta.config import load_config\n"
        "from ticdc_delta.spark.job import spark_for\n"
        "spark = spark_for(load_config(sys.argv[1]))\n"
        "for key in ('spark.sql.shuffle.partitions', 'spark.default.parallelism', 'spark.sql.adaptive.enabled',\n"
        "            'spark.sql.codegen.cache.maxEntries', 'spark.master', 'spark.app.name'):\n"
        "    print('SETTING', key, spark.sparkContext.getConf().get(key))\n"
        "spark.stop()\n"
    )
    submitted = ("--conf", "spark.sql.shuffle.partitions=3", "--conf", "spark.default.parallelism=3")
    seen = _spark_submit(*submitted, "--name", "orders-cdc", str(probe), str(cfg_path), timeout=300)
    assert seen.returncode == 0, seen.stderr[-3000:]
    settings = dict(line.split()[1:3] for line in seen.stdout.splitlines() if line.startswith("SETTING "))
    assert settings == {
        "spark.sql.shuffle.partitions": "3",  # spark-submit's, not the YAML's 5 nor the default 2
        "spark.default.parallelism": "3",
        "spark.sql.adaptive.enabled": "false",  # the job's defaults where spark-submit set nothing
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
        "spark.master": "local[1]",
        "spark.app.name": "orders-cdc",  # spark-submit's --name, not the job's own
    }

    run = _spark_submit(*submitted, "jobs/ticdc_to_delta.py", "--config", str(cfg_path), "--once")
    assert run.returncode == 0, run.stderr[-3000:]
    # (spark-submit merges the Python driver's stderr into its stdout)
    said = [line.split("keeping the settings spark-submit gave: ", 1)[1] for line in run.stdout.splitlines()
            if "keeping the settings spark-submit gave: " in line]
    assert said and {"spark.default.parallelism", "spark.sql.shuffle.partitions"} <= set(said[0].split(", "))
    assert "spark.app.name" not in said[0]  # no --name: spark-submit's default (the script's name) gives way
    cfg = load_config(cfg_path)
    diffs = compare_with_oracle(_ConfiguredSink(cfg), result.oracle, tz=cfg.sink.source_timezone)
    assert not [d.describe() for d in diffs if not d.ok]
    assert sum(d.actual_rows for d in diffs) > 0
