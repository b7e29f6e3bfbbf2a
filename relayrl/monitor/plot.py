"""Charts of a finished (or running) run from its ``metrics.jsonl``: PNGs in ``<run_dir>/plots/``.

Uses matplotlib's object API with the Agg canvas (``Figure`` + ``FigureCanvasAgg``): no display is
needed and no global pyplot state is touched. ``reward_curve_ascii`` gives the console a one-line
picture of the reward at the end of a run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from relayrl.monitor.metrics import REWARD_KEY, is_kl_key

SPARK_CHARS = "▁▂▃▄▅▆▇█"
_NOT_PER_FUNCTION = {REWARD_KEY, "reward/std", "reward/pass_rate", "reward/zero_std_groups"}


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
    pairs = [(r["step"], r[key]) for r in records
             if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _save_chart(path: Path, title: str, ylabel: str, lines: list[tuple[str, list[int], list[float]]],
                band: tuple[list[int], list[float], list[float]] | None = None) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if band is not None:
        ax.fill_between(band[0], band[1], band[2], alpha=0.2, label="±1 std")
    for label, steps, values in lines:
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # steps are whole numbers
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_run(run_dir: str | Path) -> list[Path]:
    """Write ``reward.png`` (total mean ±std, per-function means) and ``kl.png`` (every KL metric).

    A chart whose metrics never appear is skipped. Returns the paths written.
    """
    records = read_metrics(run_dir)
    out = Path(run_dir) / "plots"
    out.mkdir(exist_ok=True)
    keys = list(dict.fromkeys(k for r in records for k in r))
    written = []
    steps, means = _series(records, REWARD_KEY)
    if steps:
        lines = [("reward (weighted total)", steps, means)]
        lines += [(k.split("/", 1)[1], *_series(records, k)) for k in keys
                  if k.startswith("reward/") and k not in _NOT_PER_FUNCTION]
        std_steps, stds = _series(records, "reward/std")
        band = None
        if std_steps == steps:
            band = (steps, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)])
        written.append(_save_chart(out / "reward.png", "Reward", "reward", lines, band))
    kl_lines = [(k, *_series(records, k)) for k in keys if is_kl_key(k)]
    kl_lines = [line for line in kl_lines if line[1]]
    if kl_lines:
        written.append(_save_chart(out / "kl.png", "KL", "kl", kl_lines))
    return written


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
    return [sum(values[a:b]) / (b - a) for a, b in zip(edges, edges[1:])]
