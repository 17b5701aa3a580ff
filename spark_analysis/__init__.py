"""PySpark analysis of INRI traces (docs/trace-schema.md, docs/metrics.md)."""
