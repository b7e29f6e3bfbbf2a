"""Monitoring: the metrics interface and its sinks (console, jsonl, wandb), and plots of a run."""

from relayrl.monitor.metrics import (ConsoleSink, JsonlSink, MetricsLogger, NoopSink, WandbSink,
                                     make_logger)
from relayrl.monitor.plot import plot_run, reward_curve_ascii

__all__ = ["ConsoleSink", "JsonlSink", "MetricsLogger", "NoopSink", "WandbSink", "make_logger", "plot_run",
           "reward_curve_ascii"]
