"""A Gantt picture of a simulated run: one row per lane (trainer, reward pool, each rollout replica), one bar
per span, coloured by what the lane did (``Span.what``), up to ``until`` seconds."""

from __future__ import annotations

from pathlib import Path

from relayrl.plan.simulate import SimResult

COLORS = {
    "train": "#d62728",
    "sync": "#9467bd",
    "switch": "#8c564b",
    "checkpoint": "#7f7f7f",
    "score": "#bcbd22",
    "busy": "#1f77b4",
    "queued": "#c7d7ee",
    "paused": "#ff7f0e",
    "restart": "#000000",
}
LABELS = {"busy": "generate", "queued": "queued (submitted, no room)", "paused": "paused (sync / training)"}
MAX_REPLICAS = 16
"""Rollout rows drawn (the first ones); a large cluster's replicas look alike."""


def lanes(result: SimResult) -> list[str]:
    """Rows top to bottom: the trainer, the reward pool, then rollout replicas in order (at most
    ``MAX_REPLICAS``)."""
    replicas = sorted(
        {s.lane for s in result.spans if s.lane.startswith("rollout/")}, key=lambda x: int(x.split("/")[1])
    )
    return ["trainer", "reward", *replicas[:MAX_REPLICAS]]


def gantt(result: SimResult, path: Path, until: float | None = None) -> Path:
    """Write the picture to ``path`` (PNG). Rollout rows show busy/paused/queued/restart spans; the per-call
    ``generate`` spans overlap when calls share an engine, so the merged ``busy`` spans stand for them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    until = until if until is not None else result.wall_s
    rows = lanes(result)
    index = {lane: i for i, lane in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.35 * len(rows)))
    seen: set[str] = set()
    for s in result.spans:
        if s.lane not in index or s.what == "generate" or s.start >= until:
            continue
        ax.broken_barh(
            [(s.start, min(s.end, until) - s.start)], (index[s.lane] - 0.4, 0.8), color=COLORS.get(s.what, "#2ca02c")
        )
        seen.add(s.what)
    for step in result.steps:
        if step.end <= until:
            ax.axvline(step.end, color="#444444", lw=0.6, ls=":")
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlim(0, until)
    ax.set_xlabel("simulated seconds (dotted: a step ends)")
    handles = [Patch(color=COLORS.get(w, "#2ca02c"), label=LABELS.get(w, w)) for w in sorted(seen)]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), fontsize=8, ncol=max(1, len(seen)))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
