"""How well ``relayrl plan`` predicts: profile one layout, predict others, run them, print side by side.

On this box a device is a core. The profile run is, by default, relayrl's CPU default: ``shared`` N:N
(``placement=separate mode=sync``, one rollout replica and one trainer rank each on all N cores, taking
turns). From its medians the planner predicts each target layout (default: separate 1:1 in async with
k=1 and in sync, one thread each), which is then run for real; the profile layout runs again after them
and the profile averages both runs (the box's load drifts). A target equal to the profile layout is
measured by the profile runs. Step times are medians after the warm-up step. Target: |predicted -
measured| / measured < 0.25. Last, it says which measured layout the planner ranks first and which
measured fastest, and whether they agree (what ``relayrl plan``'s recommendation rests on). The simulator
(``relayrl.plan.calibrate``) is fed the same profile: its column has a 15 % target.

By default the profile also takes the CPU probes (``relayrl.plan.measure.probes``: one thread a side, and
N one-thread trainer ranks, both at half the batch), run after the first profile run, so that thread
scaling, the per-call generation cost and the ranks' costs are fitted rather than assumed;
``--no-probe`` profiles the shared runs alone (g = 0.8 and e = 0.9 assumed).

    .venv/bin/python -m bench.plan_accuracy [--recipe grpo_arith] [--steps 16] [--no-probe] \\
        [--profile-layout shared:2:2:sync:0] \\
        [--layouts separate:1:1:async:1 separate:1:1:sync:0 shared:2:2:sync:0] [overrides ...]
"""

from __future__ import annotations

import argparse
import os
import statistics

from relayrl.plan.measure import TINY_WORK, Check, check_layouts
from relayrl.plan.model import Layout
from relayrl.plan.report import profile_lines

CORES = os.cpu_count() or 1
SIM_TARGET = 0.15  # the simulator's target (issue 42): within 15 % of the measured step
SHARED = f"shared:{CORES}:{CORES}:sync:0"


def parse_layout(text: str) -> Layout:
    """``placement:rollout:trainer:mode:k[:stream]``, e.g. ``separate:1:1:async:1``, ``shared:2:2:sync:0`` or
    ``separate:1:1:async:1:stream``."""
    try:
        placement, r, t, mode, k, *stream = text.split(":")
        if stream not in ([], ["stream"]):
            raise ValueError(text)
        return Layout(placement, int(r), int(t), mode, int(k), bool(stream))
    except ValueError:
        raise SystemExit(
            f"--layouts {text!r}: write placement:rollout:trainer:mode:k[:stream], e.g. separate:1:1:async:1"
        ) from None


def name(layout: Layout) -> str:
    return f"{layout.placement} {layout.split()} {layout.schedule}"


def verdict(checks: list[Check]) -> list[str]:
    """The planner's first among the measured layouts (``relayrl plan`` ranks by the simulator fed the profile)
    against the measured fastest (a layout measured twice, the profile's, counts with the mean of its runs)."""
    by_layout: dict[Layout, list[Check]] = {}
    for c in checks:
        by_layout.setdefault(c.layout, []).append(c)
    simulated = {lay: cs[0].simulated_s for lay, cs in by_layout.items()}
    measured = {lay: statistics.fmean(c.measured_s for c in cs) for lay, cs in by_layout.items()}
    first, fastest = min(simulated, key=simulated.get), min(measured, key=measured.get)
    return [
        f"  planner ranks first: {name(first)} (simulated {simulated[first]:.3f} s, measured {measured[first]:.3f} s)",
        f"  measured fastest:    {name(fastest)} ({measured[fastest]:.3f} s)",
        f"  agree: {'yes' if first == fastest else 'NO'}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="grpo_tiny")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--profile-layout", default=SHARED)
    parser.add_argument("--layouts", nargs="+", default=["separate:1:1:async:1", "separate:1:1:sync:0", SHARED])
    parser.add_argument("--output-dir", default="/tmp/relayrl-bench")
    parser.add_argument("--no-bracket", action="store_true", help="profile once, before the targets")
    parser.add_argument("--no-probe", action="store_true", help="profile the shared runs alone (no CPU probes)")
    args, extra = parser.parse_known_args()
    extra = [*(TINY_WORK if args.recipe == "grpo_tiny" else []), *extra]
    profiled = 1 if args.no_bracket else 2
    profile, checks = check_layouts(
        args.recipe,
        parse_layout(args.profile_layout),
        [parse_layout(x) for x in args.layouts],
        args.steps,
        extra,
        args.output_dir,
        bracket=not args.no_bracket,
        probe=not args.no_probe,
    )
    print("\n" + "\n".join(profile_lines(profile)))
    print(f"\n{args.recipe}, {args.steps} steps per run, medians after the warm-up step")
    print(f"  {'layout':<34} {'predicted s':>11} {'simulated s':>11} {'measured s':>10} {'error':>7} {'sim err':>7}")
    for i, c in enumerate(checks):
        tag = f" (profiled, {('before', 'after')[i]})" if i < profiled else ("  PASS" if c.error < 0.25 else "  MISS")
        tag += "" if i < profiled else (" / sim PASS" if c.sim_error < SIM_TARGET else " / sim MISS")
        print(
            f"  {name(c.layout):<34} {c.predicted_s:>11.3f} {c.simulated_s:>11.3f} {c.measured_s:>10.3f} "
            f"{c.error:>7.1%} {c.sim_error:>7.1%}{tag}"
        )
    print("\n".join(["", *verdict(checks)]))


if __name__ == "__main__":
    main()
