"""Async vs sync throughput (and learning parity) of the real system on this box, in one run.

Both runs use the same recipe with ``placement=separate``: the rollout replica and the trainer rank each
get one core (``rollout.num_threads=1 trainer.num_threads=1``), so async can overlap them while sync
runs them one after the other. From the sync run: Tg = generate + score seconds per step, Tt = train +
sync seconds per step, and the ideal speedup (Tg + Tt) / max(Tg, Tt). From both: completions/s after
the first (warm-up) step, and their ratio. Target: measured >= 0.9 x ideal.

``--parity`` adds the learning check on grpo_tiny-sized work: sync and async (k=1) each train for
``--parity-steps`` steps; the threshold is 90% of the sync run's best 3-step mean reward, and async
should reach it within 1.25x the steps sync needed.

    .venv/bin/python bench/async_vs_sync.py [--recipe grpo_arith] [--steps 6] [--parity] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import statistics

CORES = ["placement=separate", "rollout.num_cpus=1", "trainer.num_cpus=1", "rollout.num_threads=1",
         "trainer.num_threads=1", "logging.wandb=disabled", "run.save_final=false",
         "run.output_dir=/tmp/relayrl-bench"]


def run(recipe: str, steps: int, overrides: list[str]) -> list[dict]:
    import ray

    from relayrl.config import load_config
    from relayrl.controller import train

    cfg = load_config(recipe, [f"run.steps={steps}", *CORES, *overrides])
    result = train(cfg)
    ray.shutdown()
    return [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]


def throughput(rows: list[dict]) -> float:
    rows = rows[1:]   # warm-up step excluded
    return sum(r["rollout/completions"] for r in rows) / sum(r["timing/step"] for r in rows)


def steps_to(rewards: list[float], threshold: float, window: int = 3) -> int | None:
    """First step (1-based) at which the trailing ``window``-step mean reward reaches ``threshold``."""
    for i in range(window, len(rewards) + 1):
        if statistics.mean(rewards[i - window:i]) >= threshold:
            return i
    return None


def best_mean(rewards: list[float], window: int = 3) -> float:
    """The best ``window``-step mean reward of a run (the parity threshold is a fraction of it); a run shorter
    than ``window`` steps: its mean."""
    window = min(window, len(rewards))
    return max(statistics.mean(rewards[i - window:i]) for i in range(window, len(rewards) + 1))


def speed(recipe: str, steps: int, overrides: list[str]) -> None:
    sync = run(recipe, steps, ["mode=sync", *overrides])
    asyn = run(recipe, steps, ["mode=async", "buffer.max_staleness=1", *overrides])
    tg = statistics.mean(r["timing/generate"] + r["timing/reward"] for r in sync[1:])
    tt = statistics.mean(r["timing/train"] + r["timing/sync"] for r in sync[1:])
    ideal = (tg + tt) / max(tg, tt)
    measured = throughput(asyn) / throughput(sync)
    print(f"\n{recipe}, {steps} steps each (first excluded), rollout and trainer on one core each")
    print(f"  sync : Tg={tg:.2f}s  Tt={tt:.2f}s  step={statistics.mean(r['timing/step'] for r in sync[1:]):.2f}s"
          f"  {throughput(sync):.2f} completions/s")
    print(f"  async: step={statistics.mean(r['timing/step'] for r in asyn[1:]):.2f}s  {throughput(asyn):.2f}"
          f" completions/s  staleness max {max(r['staleness/max'] for r in asyn):.0f}  "
          f"idle rollout {statistics.mean(r['idle/rollout'] for r in asyn[1:]):.2f} "
          f"trainer {statistics.mean(r['idle/trainer'] for r in asyn[1:]):.2f}")
    print(f"  ideal speedup (Tg+Tt)/max(Tg,Tt) = {ideal:.2f}x; measured async/sync = {measured:.2f}x "
          f"= {measured / ideal:.2f} of ideal -> {'PASS' if measured >= 0.9 * ideal else 'MISS'} (target >= 0.9)")


def parity(steps: int, overrides: list[str]) -> None:
    sync = [r["reward/mean"] for r in run("grpo_tiny", steps, ["mode=sync", *overrides])]
    asyn = [r["reward/mean"] for r in run("grpo_tiny", steps, ["mode=async", "buffer.max_staleness=1",
                                                               *overrides])]
    threshold = 0.9 * best_mean(sync)
    n_sync, n_async = steps_to(sync, threshold), steps_to(asyn, threshold)
    print(f"\ngrpo_tiny learning, {steps} steps each: threshold {threshold:.3f} (90% of sync's best 3-step mean)")
    print("  sync  rewards: " + " ".join(f"{x:.2f}" for x in sync))
    print("  async rewards: " + " ".join(f"{x:.2f}" for x in asyn))
    ok = n_sync is not None and n_async is not None and n_async <= 1.25 * n_sync
    print(f"  steps to threshold: sync {n_sync}, async {n_async} -> {'PASS' if ok else 'MISS'} (target <= 1.25x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="grpo_arith")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--parity", action="store_true")
    parser.add_argument("--parity-steps", type=int, default=30)
    parser.add_argument("--skip-speed", action="store_true")
    args, overrides = parser.parse_known_args()
    if not args.skip_speed:
        speed(args.recipe, args.steps, overrides)
    if args.parity:
        parity(args.parity_steps, overrides)


if __name__ == "__main__":
    main()
