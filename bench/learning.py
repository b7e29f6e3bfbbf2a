"""Do the harder recipes learn on the shipped model, on this box, in time? ``relayrl train --config-name <recipe>``
run as a user runs it (wandb off, no final model), timed from launch to exit.

For each recipe: its correctness reward (the first of its ``rewards``, the format reward left out) as the mean
of the first 5 and the last 5 steps, the rise between them, the format reward's, the warm start's seconds (the
run's ``sft`` phase, if any) and the wall time. The issue's goal: a rise of at least 0.25 within 20 minutes.

    python -m bench.learning                              # grpo_wordproblem and grpo_countdown
    python -m bench.learning grpo_countdown run.steps=20  # one recipe, with overrides
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench.common import run_relayrl
from relayrl.config import load_config

RECIPES = ("grpo_wordproblem", "grpo_countdown")
GOAL_RISE, GOAL_MINUTES = 0.25, 20.0


def measure(recipe: str, overrides: list[str], work: Path) -> dict[str, float]:
    """One run of ``recipe``: the rise of its correctness reward, first-5 -> last-5, and its times."""
    cfg = load_config(recipe, overrides)
    names = [f"reward/{spec.fn.rsplit(':', 1)[-1]}" for spec in cfg.rewards]
    correct, fmt = names[0], names[-1]  # the task's reward first, the format reward (if any) after it
    side = run_relayrl(recipe, cfg.run.steps, overrides, work / recipe)
    assert side.run_dir is not None  # run_relayrl read the run's metrics from it
    rows = _rows(side.run_dir)
    series = [r[correct] for r in rows]
    first, last = statistics.mean(series[:5]), statistics.mean(series[-5:])
    formats = [r.get(fmt, float("nan")) for r in rows]
    return {
        "steps": len(rows),
        "first": first,
        "last": last,
        "rise": last - first,
        "format_first": statistics.mean(formats[:5]),
        "format_last": statistics.mean(formats[-5:]),
        "sft_s": _sft_seconds(side.run_dir),
        "median_step_s": statistics.median(side.step_s[1:] or side.step_s),
        "wall_min": side.wall / 60,
    }


def _sft_seconds(run_dir: Path) -> float:
    """The warm start's wall seconds (``<run>/sft/sft.json``), 0 without one."""
    summary = run_dir / "sft" / "sft.json"
    return json.loads(summary.read_text())["seconds"] if summary.is_file() else 0.0


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", nargs="*", default=list(RECIPES))
    args, overrides = parser.parse_known_args()
    recipes = [r for r in args.recipes if "=" not in r]
    overrides += [r for r in args.recipes if "=" in r]
    print(
        "| recipe | steps | correctness first-5 -> last-5 (rise) | format first-5 -> last-5 | warm start | "
        "median step | launch -> exit | goal (+0.25 in 20 min) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="relayrl-learning-") as tmp:
        for recipe in recipes:
            m = measure(recipe, overrides, Path(tmp))
            met = m["rise"] >= GOAL_RISE and m["wall_min"] <= GOAL_MINUTES
            print(
                f"| `{recipe}` | {m['steps']:.0f} | {m['first']:.3f} -> {m['last']:.3f} ({m['rise']:+.3f}) | "
                f"{m['format_first']:.2f} -> {m['format_last']:.2f} | {m['sft_s']:.0f} s | "
                f"{m['median_step_s']:.1f} s | {m['wall_min']:.1f} min | {'met' if met else 'not met'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
