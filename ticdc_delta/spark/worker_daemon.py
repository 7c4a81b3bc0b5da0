"""Spark's Python worker daemon, with the job's heavy imports done once, before it forks workers.

Spark starts ``python -m <spark.python.daemon.module>`` once per executor and forks a worker from it for
every Python task (Kafka reads, decoding). Importing pyarrow, confluent-kafka and the codecs in each
fresh worker costs about a second per task on a small machine; importing them here, in the parent, makes
every forked worker start with them loaded. The daemon itself is pyspark's (``pyspark.daemon``), run
unchanged after the imports.
"""

import runpy

import confluent_kafka  # noqa: F401 - preloaded for the forked workers
import orjson  # noqa: F401
import pyarrow  # noqa: F401

import ticdc_delta.codec.canal_json  # noqa: F401
import ticdc_delta.codec.craft  # noqa: F401
import ticdc_delta.codec.open_protocol  # noqa: F401
import ticdc_delta.spark.decode  # noqa: F401

if __name__ == "__main__":
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
