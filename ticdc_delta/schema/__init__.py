"""Schema layer: MySQL column types and TiDB DDL statements, parsed into typed values (no Delta, no Spark)."""
