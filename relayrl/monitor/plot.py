"""Charts of a finished (or running) run from its ``metrics.jsonl``: PNGs in ``<run_dir>/plots/``.

``reward.png`` (total ±std and each reward function), ``kl.png`` (policy/kl, approx_kl, behaviour_kl),
``staleness.png`` (groups trained at each version lag, stacked), ``throughput.png`` (tokens/s end to
end and per busy engine, completions/s), ``timing.png`` (where a step's seconds go) and, when the run
evaluated during training (``eval.every``), ``eval.png`` (held-out accuracy greedy and sampled, pass@k,
mean reward; step 0 is the initial model).

Uses matplotlib's object API with the Agg canvas (``Figure`` + ``FigureCanvasAgg``): no display is
needed and no global pyplot state is touched. ``reward_curve_ascii`` gives the console a one-line
picture of the reward at the end of a run.
"""

from __future__ import annotations

import json
import math
from itertools import pairwise
from pathlib import Path
from typing import Any

from relayrl.monitor.metrics import is_kl_key
from relayrl.monitor.schema import (
    EVAL_TIME_S,
    PERF_COMPLETIONS_PER_S,
    PERF_TOKENS_PER_S,
    PERF_TOKENS_PER_S_PER_REPLICA,
    REWARD_FN,
    REWARD_MEAN,
    REWARD_STD,
    ROLLOUT_TOKENS_PER_S,
    STALENESS_LAG,
    TIMING_GENERATE,
    TIMING_REWARD,
    TIMING_STEP,
    TIMING_SYNC,
    TIMING_TRAIN,
    TIMING_WAIT,
    lookup,
)

SPARK_CHARS = "▁▂▃▄▅▆▇█"
EVAL_PREFIX = "eval/"
EVAL_SKIP = (EVAL_TIME_S,)
"""Drawn on eval.png: every ``eval/*`` metric but the evaluation's seconds."""
TIMING_KEYS = (TIMING_STEP, TIMING_GENERATE, TIMING_REWARD, TIMING_TRAIN, TIMING_SYNC, TIMING_WAIT)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of ``<run_dir>/metrics.jsonl``; a missing or empty file is a one-line error."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a run directory written by `relayrl train`")
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not records:
        raise ValueError(f"{path} has no steps yet; plot after the first step is logged")
    return records


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) where ``key`` has a finite number."""
    pairs = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _axes(title: str, ylabel: str) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig: Any, ax: Any, path: Path, loc: str = "best") -> Path:
    handles, labels = ax.get_legend_handles_labels()
    for other in fig.axes[1:]:  # twin axes: one legend for all lines
        h, lab = other.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    ax.legend(handles, labels, loc=loc, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def _save_chart(
    path: Path,
    title: str,
    ylabel: str,
    lines: list[tuple[str, list[int], list[float]]],
    band: tuple[list[int], list[float], list[float]] | None = None,
) -> Path:
    fig, ax = _axes(title, ylabel)
    if band is not None:
        ax.fill_between(band[0], band[1], band[2], alpha=0.2, label="±1 std")
    for label, steps, values in lines:
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
    return _save(fig, ax, path)


def _save_stacked_legend(path: Path, title: str, ylabel: str, lines: list[tuple[str, list[int], list[float]]]) -> Path:
    """Non-negative lines from 0, with headroom above them for a 3-column legend (timing: 6 lines)."""
    fig, ax = _axes(title, ylabel)
    for label, steps, values in lines:
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
    ax.set_ylim(bottom=0, top=max(v for _, _, values in lines for v in values) * 1.35 or 1.0)
    ax.legend(loc="upper center", fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path)
    return path


def _family(key: str) -> str:
    """The schema name documenting ``key``: ``reward/<fn>`` for ``reward/correct``, "" when undocumented."""
    return getattr(lookup(key), "name", "")


def _lines(records: list[dict[str, Any]], keys: list[str]) -> list[tuple[str, list[int], list[float]]]:
    """(key, steps, values) for each key that has at least one finite value."""
    return [line for line in ((k, *_series(records, k)) for k in keys) if line[1]]


def plot_run(run_dir: str | Path) -> list[Path]:
    """Write reward, kl, staleness, throughput, timing and eval PNGs into ``<run_dir>/plots``.

    A chart whose metrics never appear is skipped. Returns the paths written.
    """
    records = read_metrics(run_dir)
    out = Path(run_dir) / "plots"
    out.mkdir(exist_ok=True)
    keys = list(dict.fromkeys(k for r in records for k in r))
    charts = [
        _reward_chart(records, keys, out / "reward.png"),
        _line_chart(records, [k for k in keys if is_kl_key(k)], out / "kl.png", "KL", "nats/token"),
        _staleness_chart(records, keys, out / "staleness.png"),
        _throughput_chart(records, out / "throughput.png"),
        _timing_chart(records, out / "timing.png"),
        _line_chart(
            records,
            [k for k in keys if k.startswith(EVAL_PREFIX) and k not in EVAL_SKIP],
            out / "eval.png",
            "Held-out evaluation (step 0: initial model)",
            "fraction / reward",
        ),
    ]
    return [path for path in charts if path is not None]


def _line_chart(records: list[dict[str, Any]], keys: list[str], path: Path, title: str, ylabel: str) -> Path | None:
    lines = _lines(records, keys)
    return _save_chart(path, title, ylabel, lines) if lines else None


def _timing_chart(records: list[dict[str, Any]], path: Path) -> Path | None:
    lines = _lines(records, list(TIMING_KEYS))
    return _save_stacked_legend(path, "Seconds per step", "s", lines) if lines else None


def _reward_chart(records: list[dict[str, Any]], keys: list[str], path: Path) -> Path | None:
    """Total mean with a ±std band, and one line per reward function (``reward/<fn>`` in the schema)."""
    steps, means = _series(records, REWARD_MEAN)
    if not steps:
        return None
    per_fn = [k for k in keys if _family(k) == REWARD_FN]
    lines = [("reward (weighted total)", steps, means)]
    lines += [(k.split("/", 1)[1], fn_steps, values) for k, fn_steps, values in _lines(records, per_fn)]
    std_steps, stds = _series(records, REWARD_STD)
    band = None
    if std_steps == steps:
        band = (steps, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)])
    return _save_chart(path, "Reward", "reward", lines, band)


def _staleness_chart(records: list[dict[str, Any]], keys: list[str], path: Path) -> Path | None:
    """Stacked bars: groups trained at each step by version lag d (``staleness/<d>``), d = 0 at the bottom."""
    lags = sorted((int(k.split("/")[1]), k) for k in keys if _family(k) == STALENESS_LAG)
    if not lags:
        return None
    fig, ax = _axes("Staleness: groups trained per version lag", "groups")
    steps = [r["step"] for r in records]
    bottom = [0.0] * len(steps)
    for d, key in lags:
        counts = [float(r.get(key) or 0.0) for r in records]
        ax.bar(steps, counts, bottom=bottom, label=f"{d} version{'s' if d != 1 else ''} old")
        bottom = [b + c for b, c in zip(bottom, counts)]
    return _save(fig, ax, path)


def _throughput_chart(records: list[dict[str, Any]], path: Path) -> Path | None:
    """Tokens/s (end to end, per replica, per busy engine) on the left axis, completions/s on the right."""
    lines = _lines(records, [PERF_TOKENS_PER_S, PERF_TOKENS_PER_S_PER_REPLICA, ROLLOUT_TOKENS_PER_S])
    if not lines:
        return None
    fig, ax = _axes("Throughput", "tokens/s")
    for label, steps, values in lines:
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
    completions = _lines(records, [PERF_COMPLETIONS_PER_S])
    if completions:
        right = ax.twinx()
        right.set_ylabel("completions/s")
        _, steps, values = completions[0]
        right.plot(steps, values, "k--", label=f"{PERF_COMPLETIONS_PER_S} (right axis)")
        right.set_ylim(bottom=0, top=max(values) * 1.6 or 1.0)
    ax.set_ylim(bottom=0, top=max(v for _, _, values in lines for v in values) * 1.6 or 1.0)  # room for the legend
    return _save(fig, ax, path, loc="upper center")


def reward_curve_ascii(values: list[float], width: int = 60) -> str:
    """A one-line sparkline, e.g. ``reward 0.125 ▁▂▂▃▅▆▇█ 0.875 (20 steps)``.

    Each character is one step, or the mean of consecutive steps when there are more than ``width``;
    height is scaled between the min and max shown. Non-finite values are dropped.
    """
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "reward (no finite values)"
    buckets = _downsample(finite, width)
    low, high = min(buckets), max(buckets)
    span = high - low
    top = len(SPARK_CHARS) - 1
    chars = "".join(SPARK_CHARS[round((v - low) / span * top) if span > 0 else top // 2] for v in buckets)
    return f"reward {finite[0]:.3f} {chars} {finite[-1]:.3f} (min {low:.3f}, max {high:.3f}, {len(finite)} steps)"


def _downsample(values: list[float], width: int) -> list[float]:
    """Means of ``width`` near-equal consecutive chunks (the values themselves if there are few)."""
    if len(values) <= width:
        return values
    edges = [round(i * len(values) / width) for i in range(width + 1)]
    return [sum(values[a:b]) / (b - a) for a, b in pairwise(edges)]
