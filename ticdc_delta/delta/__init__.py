"""The Delta edge: target-table types, the table sink, and the job's durable state.

No pyspark here: :class:`~ticdc_delta.delta.sink.DeltaRsSink` writes through delta-rs on the driver; a
the ``spark`` engine's delta-spark sink (:class:`~ticdc_delta.spark.delta_sink.SparkDeltaSink`) implements
the same :class:`~ticdc_delta.delta.sink.TableSink` in the Spark package.
"""

from __future__ import annotations

from .arrow_types import TypeParams, arrow_field_for, arrow_type_for, canonical_from_delta, convert_value
from .sink import DeltaRsSink, MergeStats, TableIdent, TableSink, Txn, batch_txn, read_table
from .state_store import PipelineState, StateStore

__all__ = [
    "TypeParams",
    "arrow_type_for",
    "arrow_field_for",
    "convert_value",
    "canonical_from_delta",
    "TableSink",
    "DeltaRsSink",
    "TableIdent",
    "Txn",
    "MergeStats",
    "batch_txn",
    "read_table",
    "StateStore",
    "PipelineState",
]
