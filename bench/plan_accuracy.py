"""How well ``relayrl plan`` predicts: profile one layout, predict others, run them, print side by side.

On this box a device is a core: the profile run is ``placement=separate``, one rollout replica and one
trainer rank on one thread each, ``mode=sync``. From its medians the planner predicts each target layout
(default: the same split in async with k=1, and colocated on one core), which is then run for real; the
profile layout runs again after them and the profile averages both runs (the box's load drifts).
Step times are medians after the warm-up step. Target: |predicted - measured| / measured < 0.25.

    .venv/bin/python bench/plan_accuracy.py [--recipe grpo_arith] [--steps 16] \\
        [--layouts separate:1:1:async:1 colocated:1:1:sync:0] [overrides ...]
"""

from __future__ import annotations

import argparse

from relayrl.plan.measure import TINY_WORK, check_layouts
from relayrl.plan.model import Layout
from relayrl.plan.report import profile_lines

def parse_layout(text: str) -> Layout:
    """``placement:rollout:trainer:mode:k``, e.g. ``separate:1:1:async:1``."""
    try:
        placement, r, t, mode, k = text.split(":")
        return Layout(placement, int(r), int(t), mode, int(k))
    except ValueError:
        raise SystemExit(f"--layouts {text!r}: write placement:rollout:trainer:mode:k, "
                         "e.g. separate:1:1:async:1") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="grpo_tiny")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--profile-layout", default="separate:1:1:sync:0")
    parser.add_argument("--layouts", nargs="+", default=["separate:1:1:async:1", "colocated:1:1:sync:0"])
    parser.add_argument("--output-dir", default="/tmp/relayrl-bench")
    parser.add_argument("--no-bracket", action="store_true", help="profile once, before the targets")
    args, extra = parser.parse_known_args()
    extra = [*(TINY_WORK if args.recipe == "grpo_tiny" else []), *extra]
    profile, checks = check_layouts(args.recipe, parse_layout(args.profile_layout),
                                    [parse_layout(x) for x in args.layouts], args.steps, extra, args.output_dir,
                                    bracket=not args.no_bracket)
    print("\n" + "\n".join(profile_lines(profile)))
    print(f"\n{args.recipe}, {args.steps} steps per run, medians after the warm-up step")
    print(f"  {'layout':<34} {'predicted s':>11} {'measured s':>10} {'error':>7}")
    profiled = len(checks) - len(args.layouts)
    for i, c in enumerate(checks):
        lay = c.layout
        name = f"{lay.placement} {lay.split()} {lay.mode}" + (f" k={lay.k}" if lay.mode == "async" else "")
        tag = (f" (profiled, {('before', 'after')[i]})" if i < profiled else
               ("  PASS" if c.error < 0.25 else "  MISS"))
        print(f"  {name:<34} {c.predicted_s:>11.3f} {c.measured_s:>10.3f} {c.error:>7.1%}{tag}")


if __name__ == "__main__":
    main()
