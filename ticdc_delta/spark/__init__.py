"""Spark edge of ticdc-delta: the Kafka source, the session helper and the foreachBatch wiring.

Everything that imports pyspark lives under this package. Import the modules directly
(``ticdc_delta.spark.kafka_source``, ``ticdc_delta.spark.session``); this ``__init__`` imports nothing so
that loading one module does not drag in the others.
"""

__all__: list[str] = []
