"""Monitoring: the metric schema, the metrics interface and its sinks (console, jsonl, wandb), plots of a
run, the run list and checkpoint evaluation (``relayrl runs`` / ``relayrl eval``)."""

from relayrl.monitor.metrics import ConsoleSink, JsonlSink, MetricsLogger, NoopSink, WandbSink, make_logger
from relayrl.monitor.plot import plot_run, reward_curve_ascii
from relayrl.monitor.schema import SCHEMA, Metric, lookup, schema_gaps, to_schema

__all__ = [
    "SCHEMA",
    "ConsoleSink",
    "JsonlSink",
    "Metric",
    "MetricsLogger",
    "NoopSink",
    "WandbSink",
    "lookup",
    "make_logger",
    "plot_run",
    "reward_curve_ascii",
    "schema_gaps",
    "to_schema",
]
