"""Replicas of different speeds: step time with the real placement against an ideal split in proportion to speed.

The swarm issue's goal: with one replica at half speed, a step takes at most ``GOAL`` x the time of an ideal split
of the same work in proportion to speed. This box has two identical cores, so two engines of different speed can
only be made by sharing cores, which measures the scheduler of the OS, not relayrl's. The simulator
(``relayrl.plan.simulate``) runs the real ``StepPolicy`` and ``swarm.ReplicaSet`` (placement by measured
throughput, straggler copies) on a simulated clock, and engines at speed s there run every call 1/s as long.

Each case runs the same recipe three times on the same cluster:

- ``speeds``: the heterogeneous pool (e.g. ``1 0.5``), placement learning the rates as a real run does;
- ``ideal``: every replica at the pool's mean speed, so the same total throughput split evenly: the time an
  ideal split in proportion to speed would take (both finish together, nothing waits on the slowest);
- ``equal share``: the heterogeneous pool's generation if each replica got the same share (what placement by
  slots alone gives), computed from the ``ideal`` run: its generation time x mean speed / slowest speed.

Both admission modes run: chunks (one call of B / replicas prompts a replica a step: nothing to place, so the
slow replica's chunk sets the step) and ``rollout.stream`` (one group a call: placement by measured throughput).

It prints the median step and its generation part (the rest, training and sync, does not depend on the rollout
pool) and the ratios to ``ideal``.

    python -m bench.swarm_speeds
    python -m bench.swarm_speeds --speeds 1 0.5 --replicas 2 --steps 30
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from relayrl.config import load_config
from relayrl.plan.records import SimResult
from relayrl.plan.scenario import find_cluster, scenario
from relayrl.plan.specs import ClusterSpec
from relayrl.plan.swarm_events import Swarm

GOAL = 1.1
CLUSTER = "h100-2x8"
WORKLOAD = ["run.prompts_per_step=64", "rollout.max_tokens=1024"]
"""The spot scenario's workload (``relayrl/plan/clusters/h100-2x8-spot.yaml``), unless overrides are given."""


def run(cfg, spec: ClusterSpec, speeds: tuple[float, ...]) -> SimResult:
    return scenario(cfg, dataclasses.replace(spec, swarm=Swarm(speeds))).run()


def generate_s(result: SimResult, skip: int = 1) -> float:
    """Median of each step's rollout time (sync mode): from its start until the policy could take the step."""
    return statistics.median(s.taken - s.start for s in result.steps[skip:])


def case(cfg, spec: ClusterSpec, speeds: tuple[float, ...]) -> dict[str, float]:
    het, ideal = run(cfg, spec, speeds), run(cfg, spec, (statistics.mean(speeds),) * len(speeds))
    het.policy.check_accounting()
    equal_gen = generate_s(ideal) * statistics.mean(speeds) / min(speeds)
    fast = sum(n for r, n in het.groups_by_replica.items() if speeds[r] == max(speeds))
    return {
        "step": het.step_s(),
        "ideal_step": ideal.step_s(),
        "gen": generate_s(het),
        "first_gen": het.steps[0].taken - het.steps[0].start,
        "ideal_gen": generate_s(ideal),
        "equal_gen": equal_gen,
        "fast_share": fast / sum(het.groups_by_replica.values()),
        "reissued": float(het.policy.reissued),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speeds", type=float, nargs="+", default=[1.0, 0.5], help="one replica's speeds, cycled")
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 8], help="rollout pool sizes to run")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cluster", default=CLUSTER)
    parser.add_argument("overrides", nargs="*", help=f"recipe overrides (grpo_arith; default {' '.join(WORKLOAD)})")
    args = parser.parse_args()
    args.overrides = args.overrides or WORKLOAD
    base = find_cluster(args.cluster)
    print(f"simulated: grpo_arith on {args.cluster} {' '.join(args.overrides)}, {args.steps} steps, sync mode")
    print(
        "| replicas | speeds | admission | step s (ideal) | generate s (ideal) | step / ideal | generate / ideal "
        "| equal share / ideal (generate) | first step's generate / ideal | fast replicas' share | copies lost "
        "| goal |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in args.replicas:
        speeds = tuple(sorted((args.speeds[i % len(args.speeds)] for i in range(n)), reverse=True))
        cluster = dataclasses.replace(base.cluster, rollout_devices=n * base.cluster.rollout_tp)
        spec = dataclasses.replace(base, cluster=cluster)
        for stream in (False, True):
            overrides = [f"run.steps={args.steps}", "run.checkpoint_every=0", f"rollout.stream={stream}"]
            m = case(load_config("grpo_arith", [*overrides, *args.overrides]), spec, speeds)
            ratio = m["step"] / m["ideal_step"]
            print(
                f"| {n} | {' '.join(f'{s:g}' for s in speeds)} | {'stream' if stream else 'chunks'} "
                f"| {m['step']:.2f} ({m['ideal_step']:.2f}) | {m['gen']:.2f} ({m['ideal_gen']:.2f}) | {ratio:.3f} "
                f"| {m['gen'] / m['ideal_gen']:.3f} | {m['equal_gen'] / m['ideal_gen']:.3f} "
                f"| {m['first_gen'] / m['ideal_gen']:.3f} | {m['fast_share']:.3f} | {m['reissued']:g} "
                f"| {'PASS' if ratio <= GOAL else 'MISS'} (<= {GOAL}x) |"
            )


if __name__ == "__main__":
    main()
