"""ticdc-delta: land a TiDB change stream (TiCDC on Kafka) in Delta Lake tables."""

__version__ = "0.1.0"
