"""relayrl against TRL's ``GRPOTrainer`` on the same job, one after the other, same box (issue 16).

The job is read from relayrl's recipe (default ``grpo_arith``), so both sides run it by
construction: the same prompts in the same order (relayrl's ``PromptSampler`` over the task's rows,
chat template applied by relayrl's ``chat_formatter``), the same reward functions and weights
(relayrl's built-ins already have TRL's signature ``fn(prompts, completions, answer, **_)``),
``run.prompts_per_step`` x ``algorithm.group_size`` completions per optimizer step,
``rollout.max_tokens`` new tokens, ``rollout.temperature`` / ``top_p``, ``trainer.lr``,
``algorithm.kl_coef`` (TRL's ``beta``), fp32.

TRL keeps its defaults otherwise (HF ``generate`` on CPU, gradient checkpointing on, its loss and
optimizer). The fields set here only make the job the same, never make TRL slower:
``bf16=False`` (fp32; TRL's default bf16 does not start on this CPU),
``lr_scheduler_type=constant`` (relayrl's lr is constant), ``shuffle_dataset=False`` (the
dataset *is* relayrl's prompt sequence), ``per_device_train_batch_size`` = one step's completions
(one generation, one optimizer step per step), ``logging_steps=1`` (a reward per step),
``save_strategy=no`` (relayrl runs with ``run.save_final=false``: neither side writes a model).
``--trl-set key=value`` changes a GRPOConfig field for an experiment (e.g.
gradient_checkpointing=false); it is printed with the table.

Each side runs in its own process, never both at once: relayrl through its CLI (``relayrl train``;
figures from the run's ``metrics.jsonl``), TRL through this file with ``--trl-child`` (figures from
a ``TrainerCallback``). Step times: relayrl's ``timing/step`` (wall seconds since the previous step
was logged); TRL's seconds between consecutive ``on_step_end`` calls (the first from
``on_train_begin``). "Whole process" is the subprocess's launch to exit; "launch -> first step"
ends when the first step ends. "speedup" is relayrl's advantage (>1: relayrl better). Nothing
here is asserted: benchmarks print, tests prove math.

``--variants async,bf16`` adds relayrl runs of the same job (``mode=async buffer.max_staleness=1``;
``trainer.dtype=bf16``) and a second table against the default run: completions/s, the step at which
each first reaches 90 % of the default run's best 3-step mean reward (parity: within 1.25x the default's
steps), the post-sync probe's mean |engine - trainer| logprob (``mismatch/mean_abs``, every
``weightsync.verify_every`` steps), ``policy/behaviour_kl``, launch -> first step and ``startup/engine_s``.
``spawn`` is the default job with ``rollout.forkserver=false`` (start-up). ``--no-trl`` skips the TRL side.
For ``async`` it also prints the overlap's ideal speedup, (Tg + Tt) / max(Tg, Tt) from the default run's
generate + reward (Tg) and train + sync (Tt) seconds per step, beside the measured one (target: >= 0.9 of
ideal). To measure the overlap alone, give rollout and trainer one core each: ``placement=separate
rollout.num_cpus=1 trainer.num_cpus=1 rollout.num_threads=1 trainer.num_threads=1``; the learning parity
on grpo_tiny-sized work: ``--recipe grpo_tiny --steps 30 --variants async --no-trl``.
Last, ``bench/floor.py``'s table for the default run: each phase's physical floor on this box (from the
box's GEMM and copy rates, measured then) beside the run's median, and the gap.

    .venv/bin/python -m bench.vs_trl [--steps 25] [--recipe grpo_arith] [--trl-set k=v ...] \\
        [--variants async,bf16,spawn] [--no-trl] [relayrl overrides ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import PARITY_FRACTION, PARITY_STEPS, Side, best_mean, prompt_rows, run_logged, run_relayrl, steps_to
from bench.floor import report as floor_report

# ---------------------------------------------------------------- TRL side


def run_trl(recipe: str, steps: int, overrides: list[str], trl_set: list[str], work: Path) -> Side:
    """This file with ``--trl-child`` in a subprocess; it writes its step records to JSON."""
    result = work / "trl.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.vs_trl",
        "--trl-child",
        str(result),
        "--recipe",
        recipe,
        "--steps",
        str(steps),
        *[f"--trl-set={kv}" for kv in trl_set],
        *overrides,
    ]
    load0, start = os.getloadavg()[0], time.time()
    run_logged(cmd, work / "trl.log")
    wall = time.time() - start
    rec = json.loads(result.read_text())
    ends = [rec["train_begin"]] + [s["end"] for s in rec["steps"]]
    return Side(
        step_s=[b - a for a, b in itertools.pairwise(ends)],
        completions=[rec["completions_per_step"]] * len(rec["steps"]),
        rewards=[s["reward"] for s in rec["steps"]],
        lengths=[s["length"] for s in rec["steps"]],
        first_step_at=ends[1] - start,
        wall=wall,
        load=(load0, os.getloadavg()[0]),
    )


def trl_child(out: Path, recipe: str, steps: int, overrides: list[str], trl_set: list[str]) -> None:
    """Train with TRL's GRPOTrainer on relayrl's job; write per-step records to ``out``."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from relayrl.config import load_config
    from relayrl.models import resolve_model
    from relayrl.preflight import resolve_rewards

    cfg = load_config(recipe, [f"run.steps={steps}", *overrides])
    if cfg.model.dtype != "float32":
        sys.exit(f"model.dtype={cfg.model.dtype}: this bench compares fp32 runs (TRL: bf16=False)")
    path = resolve_model(cfg.model.path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    per_step = cfg.run.prompts_per_step * cfg.algorithm.group_size
    args = GRPOConfig(**{**job_args(cfg, per_step, out.parent / "trl-run"), **parse_sets(trl_set)})
    records: dict = {"completions_per_step": per_step, "steps": [], "trl_set": trl_set}

    class Clock(TrainerCallback):
        def on_train_begin(self, *_, **__):
            records["train_begin"] = time.time()

        def on_step_end(self, *_, **__):
            records["steps"].append({"end": time.time()})

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "reward" in logs:  # one log per step; the end-of-run summary has none
                records["steps"][-1].update(reward=logs["reward"], length=logs["completions/mean_length"])

    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path, dtype="float32"),
        reward_funcs=[fn for _, fn, _ in resolve_rewards(cfg, None)],
        args=args,
        train_dataset=Dataset.from_list(prompt_rows(cfg, tokenizer, steps)),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    out.write_text(json.dumps(records))


def job_args(cfg, per_step: int, output_dir: Path) -> dict:
    """GRPOConfig fields that make TRL's job relayrl's (the module docstring says why each)."""
    return dict(
        output_dir=str(output_dir),
        max_steps=cfg.run.steps,
        bf16=False,
        learning_rate=cfg.trainer.lr,
        lr_scheduler_type="constant",
        beta=cfg.algorithm.kl_coef,
        num_generations=cfg.algorithm.group_size,
        per_device_train_batch_size=per_step,
        max_completion_length=cfg.rollout.max_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        reward_weights=[spec.weight for spec in cfg.rewards],
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
    )


def parse_sets(pairs: list[str]) -> dict:
    """``["k=v", ...]`` to GRPOConfig fields; values are read as JSON where they parse (false)."""
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


# ---------------------------------------------------------------- report

FASTER_IS_LOWER = ("steady s/", "first step", "sum of", "launch", "whole")
"""Rows that are times: relayrl's speedup on them is TRL / relayrl."""
NO_SPEEDUP = ("reward", "completion length")
"""Rows that are outcomes, not speed: ratio only."""


def summary(side: Side) -> dict[str, float]:
    """The table's figures for one side; steady = the steps after the first."""
    steady = side.step_s[1:] or side.step_s
    k = min(5, len(side.rewards))
    return {
        "steady s/step (median, steps 2..N)": statistics.median(steady),
        "steady completions/s (steps 2..N)": sum(side.completions[1:] or side.completions) / sum(steady),
        "first step s": side.step_s[0],
        "sum of step times s": sum(side.step_s),
        "launch -> first step logged s": side.first_step_at,
        "whole process s (launch -> exit)": side.wall,
        f"reward mean, first {k} steps": statistics.mean(side.rewards[:k]),
        f"reward mean, last {k} steps": statistics.mean(side.rewards[-k:]),
        "completion length mean (tokens)": statistics.mean(side.lengths),
    }


def report(relayrl: Side, trl: Side, steps: int, trl_set: list[str], overrides: list[str]) -> None:
    """Print the side-by-side table, then each side's step times and rewards."""
    a, b = summary(relayrl), summary(trl)
    print(
        f"\nrelayrl vs TRL GRPOTrainer, {steps} steps each, one after the other; "
        f"relayrl overrides: {' '.join(overrides) or '(none)'}; "
        f"TRL --trl-set: {' '.join(trl_set) or '(none)'}"
    )
    print(f"{'':38}{'relayrl':>10}{'TRL':>10}{'relayrl/TRL':>13}{'speedup':>9}")
    for key in a:
        ratio = a[key] / b[key] if b[key] else float("nan")
        speedup = (
            "" if key.startswith(NO_SPEEDUP) else f"{1 / ratio if key.startswith(FASTER_IS_LOWER) else ratio:>8.2f}x"
        )
        print(f"{key:38}{a[key]:>10.2f}{b[key]:>10.2f}{ratio:>13.2f}{speedup}")
    for name, side in (("relayrl", relayrl), ("TRL", trl)):
        print(f"{name:8} step s : " + " ".join(f"{x:.1f}" for x in side.step_s))
        print(
            f"{name:8} reward : "
            + " ".join(f"{x:.2f}" for x in side.rewards)
            + f"   (1-min load {side.load[0]:.2f} before, {side.load[1]:.2f} after)"
        )


# ---------------------------------------------------------------- relayrl variants (--variants)

VARIANTS = {
    "async": ["mode=async", "buffer.max_staleness=1"],
    "bf16": ["trainer.dtype=bf16"],
    "spawn": ["rollout.forkserver=false"],
}
"""relayrl runs beside the default (sync, fp32) one, same job: async with one step of staleness, bf16
trainer compute (fp32 master weights; the engine keeps model.dtype), and CPU engines whose processes vLLM
spawns itself instead of relayrl's forkserver (start-up)."""


def report_variants(base: Side, variants: dict[str, Side]) -> None:
    """Each variant against the default run: speed, learning parity, trainer/engine logprob agreement."""
    best = best_mean(base.rewards)
    threshold = PARITY_FRACTION * best
    base_steps = steps_to(base.rewards, threshold)
    print(
        f"\nrelayrl variants against the default run (sync, fp32); parity threshold "
        f"{threshold:.3f} = {PARITY_FRACTION} x best 3-step mean reward {best:.3f}"
    )
    print(
        f"{'run':10}{'s/step':>8}{'compl/s':>9}{'x default':>10}{'steps to thr':>13}{'parity':>8}"
        f"{'last-5 reward':>14}{'|dlogprob| probe':>18}{'behaviour kl':>14}{'1st step at':>12}{'engine s':>9}"
    )
    for name, side in {"default": base, **variants}.items():
        a, b = summary(side), summary(base)
        rate = a["steady completions/s (steps 2..N)"]
        reached = steps_to(side.rewards, threshold)
        parity = (
            ""
            if name == "default"
            else ("yes" if reached and base_steps and reached <= PARITY_STEPS * base_steps else "no")
        )
        probe = f"{statistics.mean(side.mismatch):.2e}" if side.mismatch else "n/a"
        kl = statistics.mean(x for x in side.behaviour_kl if x == x) if side.behaviour_kl else float("nan")
        last = statistics.mean(side.rewards[-5:])
        print(
            f"{name:10}{a['steady s/step (median, steps 2..N)']:>8.2f}{rate:>9.2f}"
            f"{rate / b['steady completions/s (steps 2..N)']:>9.2f}x{reached!s:>13}{parity:>8}"
            f"{last:>14.3f}{probe:>18}{kl:>14.2e}{side.first_step_at:>12.1f}{side.engine_s:>9.1f}"
        )
        print(f"{'':10}reward: " + " ".join(f"{x:.2f}" for x in side.rewards))
    if "async" in variants:
        print(overlap_line(base, variants["async"]))


def overlap_line(sync: Side, asyn: Side) -> str:
    """Async against its ideal: with generate + reward (Tg) and train + sync (Tt) seconds per step of the
    sync run, overlapping them at best gives (Tg + Tt) / max(Tg, Tt); steady steps only (2..N)."""
    tg, tt = statistics.mean(sync.generate_s[1:] or sync.generate_s), statistics.mean(sync.train_s[1:] or sync.train_s)
    ideal = (tg + tt) / max(tg, tt)
    rate = [summary(side)["steady completions/s (steps 2..N)"] for side in (asyn, sync)]
    measured = rate[0] / rate[1]
    return (
        f"async overlap: Tg={tg:.2f}s Tt={tt:.2f}s, ideal (Tg+Tt)/max(Tg,Tt) = {ideal:.2f}x; measured "
        f"{measured:.2f}x = {measured / ideal:.2f} of ideal -> {'PASS' if measured >= 0.9 * ideal else 'MISS'}"
        " (target >= 0.9)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--recipe", default="grpo_arith")
    parser.add_argument(
        "--trl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a GRPOConfig field for the TRL side (printed with the table)",
    )
    parser.add_argument(
        "--variants",
        default="",
        metavar="async,bf16,spawn",
        help="also run these relayrl variants of the job and compare them with the default run",
    )
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL side (e.g. for --variants alone)")
    parser.add_argument("--trl-child", type=Path, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.trl_child:
        trl_child(args.trl_child, args.recipe, args.steps, overrides, args.trl_set)
        return
    work = Path(tempfile.mkdtemp(prefix="relayrl-vs-trl-"))
    print(f"work dir (logs): {work}", flush=True)
    relayrl = run_relayrl(args.recipe, args.steps, overrides, work)
    names = [v for v in args.variants.split(",") if v]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        sys.exit(f"--variants {','.join(sorted(unknown))}: unknown; choose from {','.join(VARIANTS)}")
    variants = {v: run_relayrl(args.recipe, args.steps, [*overrides, *VARIANTS[v]], work / v) for v in names}
    if not args.no_trl:
        trl = run_trl(args.recipe, args.steps, overrides, args.trl_set, work)
        report(relayrl, trl, args.steps, args.trl_set, overrides)
    if variants:
        report_variants(relayrl, variants)
    print("\n" + "\n".join(floor_report(relayrl.run_dir)))


if __name__ == "__main__":
    main()
