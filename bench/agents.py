"""Does the shipped model learn to use a tool, on this box, in time? ``agent_calc`` run as a user runs it.

Three runs of SmolLM2-135M-Instruct on the same multiplication problems (``data.task=multiply``), side by side:

* **alone**: single-turn, no tool, no warm start (``env.name=null``, reward ``arith_correct``): what the model
  does in its head. Two steps: its pass rate before any learning.
* **tool, no warm start**: the calculator offered in the chat template, no supervised warm start: how often the
  model calls a tool it has never seen. Two steps.
* **agent_calc**: the recipe as shipped (a one-step warm start on demonstrations, then GRPO), timed from launch
  to exit. Its tool-call rate (``env/tool_call_rate``) and task reward, first-5 -> last-5 mean, with their curves.

The issue's goal: both the tool-call rate and the reward rise, within 20 minutes.

    python -m bench.agents                     # all three
    python -m bench.agents run.steps=30        # overrides for the agent_calc run
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import run_relayrl
from relayrl.monitor.plot import reward_curve_ascii

RECIPE = "agent_calc"
GOAL_MINUTES = 20.0
ALONE = ["env.name=null", "sft.steps=0", "rewards=[{fn: arith_correct}]", "run.steps=2"]
NO_WARM_START = ["sft.steps=0", "run.steps=2"]


def _rows(run_dir: Path | None) -> list[dict]:
    assert run_dir is not None
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _mean(rows: list[dict], key: str, part: slice = slice(None)) -> float:
    return statistics.mean(r.get(key, 0.0) for r in rows[part])


def main() -> None:
    overrides = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="relayrl-agents-") as tmp:
        alone = _rows(run_relayrl(RECIPE, 2, ALONE, Path(tmp) / "alone").run_dir)
        cold = _rows(run_relayrl(RECIPE, 2, NO_WARM_START, Path(tmp) / "cold").run_dir)
        steps = next((int(o.split("=")[1]) for o in overrides if o.startswith("run.steps=")), 20)
        side = run_relayrl(RECIPE, steps, overrides, Path(tmp) / "agent")
        rows = _rows(side.run_dir)
    rate, reward = [r["env/tool_call_rate"] for r in rows], [r["reward/mean"] for r in rows]
    first, last = slice(0, 5), slice(-5, None)
    print("| run | steps | reward first-5 -> last-5 | tool-call rate first-5 -> last-5 | launch -> exit |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| alone (no tool, no warm start) | {len(alone)} | {_mean(alone, 'reward/mean'):.3f} | - | - |")
    print(
        f"| tool, no warm start | {len(cold)} | {_mean(cold, 'reward/mean'):.3f} | "
        f"{_mean(cold, 'env/tool_call_rate'):.3f} | - |"
    )
    met = (
        _mean(rows, "reward/mean", last) > _mean(rows, "reward/mean", first)
        and _mean(rows, "env/tool_call_rate", last) > _mean(rows, "env/tool_call_rate", first)
        and side.wall / 60 <= GOAL_MINUTES
    )
    print(
        f"| `{RECIPE}` | {len(rows)} | {_mean(rows, 'reward/mean', first):.3f} -> "
        f"{_mean(rows, 'reward/mean', last):.3f} | {_mean(rows, 'env/tool_call_rate', first):.3f} -> "
        f"{_mean(rows, 'env/tool_call_rate', last):.3f} | {side.wall / 60:.1f} min |"
    )
    print(f"\ngoal (both rise, within {GOAL_MINUTES:.0f} min): {'met' if met else 'not met'}")
    print(f"reward          {_curve(reward)}")
    print(f"tool-call rate  {_curve(rate)}")


def _curve(values: list[float]) -> str:
    """A sparkline without ``reward_curve_ascii``'s own label."""
    return reward_curve_ascii(values).removeprefix("reward ")


if __name__ == "__main__":
    main()
