"""The consumer rules of TiCDC, in plain Python (no Spark, no Delta): watermarks per partition, replay
drop, held rows, ordering and per-key collapse. Spark and the Delta sink sit around this package."""
