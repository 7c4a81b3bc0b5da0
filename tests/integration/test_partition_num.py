"""A changefeed whose sink URI sets ``partition-num`` below the topic's partitions: TiCDC writes rows and
resolved ts only to the first that many, so the others never resolve anything. Without the option the job
holds every row (and says which partitions it waits for); with it — as the sink URI has it — every row
lands, the rows held so far included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ticdc_delta.config import config_from_mapping
from ticdc_delta.simulator import Simulation
from ticdc_delta.simulator.output import KafkaSink
from ticdc_delta.spark.batch_handler import _ConfiguredSink
from ticdc_delta.spark.job import run_job
from ticdc_delta.status import collect_status
from ticdc_delta.verify import compare_with_oracle
from tests.integration.conftest import job_engine

pytestmark = pytest.mark.integration


def test_partitions_beyond_partition_num_are_not_waited_for(broker: Any, spark: Any, tmp_path: Path,
                                                            unique_name: Any, progress: Any) -> None:
    topic = unique_name("pnum")
    broker.create_topic(topic, partitions=3)
    sim = Simulation("open-protocol", {}, seed=5, events=300, tables=2, partitions=2, topic=topic)
    messages = list(sim.messages())
    half = len(messages) // 2

    def produce(part: list[Any]) -> None:
        sink = KafkaSink(broker.bootstrap_servers, topic, 2)
        for m in part:
            sink.write(m.partition, m.key, m.value)
        sink.close()

    def config(options: dict[str, str]) -> Any:
        return config_from_mapping({
            "changefeed": "pnum", "checkpoint": str(tmp_path / "ckpt"),
            "sink": {"path": str(tmp_path / "lake"), "engine": job_engine()},
            "source": {"bootstrap_servers": broker.bootstrap_servers, "topic": topic, "protocol": "open-protocol",
                       "options": options},
        })

    produce(messages[:half])
    held = config({})
    run_job(held, once=True, spark=spark)
    assert not any(line["rows_applied"] for line in progress.lines)
    assert progress.lines[-1]["unresolved_partitions"] == [f"{topic}[2]"]
    assert collect_status(held)["rows_held"] > 0

    progress.lines.clear()
    produce(messages[half:])
    told = config({"partition-num": "2"})
    run_job(told, once=True, spark=spark)
    assert collect_status(told)["rows_held"] == 0 and "unresolved_partitions" not in progress.lines[-1]
    diffs = compare_with_oracle(_ConfiguredSink(told), sim.oracle(), tz=told.sink.source_timezone)
    assert not [d.describe() for d in diffs if not d.ok] and sum(d.actual_rows for d in diffs) > 0
