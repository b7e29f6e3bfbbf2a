"""The ``relayrl`` command.

::

    relayrl train --config-name grpo_arith trainer.lr=1e-6 ...    # a recipe with Hydra overrides
    relayrl eval runs/<id>/checkpoints/final -n 8 -k 1 8          # accuracy and pass@k with vLLM
    relayrl plot runs/<id>                                        # PNG charts into runs/<id>/plots
    relayrl runs [runs]                                           # runs with status and best reward
    relayrl plan runs/<id> --devices 8                            # predicted step time of each placement
    relayrl simulate --cluster h100-2x8 -cn grpo_arith            # the scheduler on a simulated GPU cluster

Recipes are Hydra configs composed against the typed schema (relayrl/config/). A bad key, type or
combination exits with status 2 and one line naming the field and the fix, before Ray starts.
"""

from __future__ import annotations

import argparse
import sys

from relayrl.config import RECIPES_DIR, ConfigError
from relayrl.logs import show_on_console


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relayrl", description="RL post-training for LLMs.")
    sub = p.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run a recipe (Hydra overrides: key=value ...)")
    train.add_argument("--config-name", "-cn", default="grpo_arith", help="recipe name (default: grpo_arith)")
    train.add_argument("--config-dir", "-cd", default=None, help=f"recipe directory (default: {RECIPES_DIR})")
    train.add_argument("--print-config", action="store_true", help="print the composed config and exit")
    train.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="show every actor's and engine's output on the console (logging.verbose=true); "
        "by default it goes to <run dir>/logs/",
    )
    train.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trainer.lr=1e-6 run.steps=5")
    plot = sub.add_parser("plot", help="write PNG charts of a run's metrics.jsonl into <run>/plots")
    plot.add_argument("run_dir")
    runs = sub.add_parser("runs", help="list run directories with status (finished/running/failed) and best reward")
    runs.add_argument("dir", nargs="?", default="runs", help="folder holding run directories (default: runs)")
    scale = sub.add_parser("scale", help="add or remove rollout replicas of a running run")
    scale.add_argument("run_dir", help="the running run's directory (runs/<id>)")
    scale.add_argument("--replicas", type=int, required=True, help="rollout replicas to serve from now on")
    _eval_parser(sub)
    _plan_parser(sub)
    _simulate_parser(sub)
    return p


def _simulate_parser(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser(
        "simulate",
        help="run a recipe's scheduler on a simulated GPU cluster: per-step timeline, throughput, "
        "staleness histogram, Gantt PNG; --rank: layouts ranked by simulated throughput",
        description="The real StepPolicy driven by a discrete-event clock and cost models of the cluster "
        "(docs/simulate.md gives the formulas and their assumptions). Starts no Ray and no engine.",
    )
    sim.add_argument("--cluster", required=True, help="cluster YAML, or a shipped name (relayrl/plan/clusters/)")
    sim.add_argument("--config-name", "-cn", default="grpo_arith", help="recipe name (default: grpo_arith)")
    sim.add_argument("--config-dir", "-cd", default=None, help=f"recipe directory (default: {RECIPES_DIR})")
    sim.add_argument("--steps", type=int, default=None, help="steps to simulate (default: run.steps)")
    sim.add_argument("--out", default=None, help="write timeline.json and gantt.png here")
    sim.add_argument("--gantt-steps", type=int, default=4, help="steps the Gantt picture shows (default 4)")
    sim.add_argument("--rank", action="store_true", help="rank every layout of the cluster's GPUs instead")
    sim.add_argument("-k", type=int, nargs="+", default=[1], help="--rank: async staleness bounds (default 1)")
    sim.add_argument(
        "--train-layouts",
        action="store_true",
        help="rank the trainer GPUs' tensor/pipeline/data-parallel layouts for the model and step instead",
    )
    sim.add_argument("overrides", nargs="*", help="recipe overrides, e.g. mode=async rollout.max_tokens=2048")


def _plan_parser(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser(
        "plan",
        help="predict step time and throughput of placements and rollout:trainer "
        "splits from a profiled run (or given figures); print the best overrides",
        description="Profile = medians of a run's metrics after the warm-up step; layouts ranked by the "
        "simulator fed the profile (docs/plan.md gives the model's equations and limits).",
    )
    plan.add_argument("runs", nargs="*", help="run directories to profile (several: per-call generation cost fitted)")
    plan.add_argument(
        "--devices", "-n", type=int, required=True, help="devices to split (GPUs; CPU cores on a CPU box)"
    )
    plan.add_argument("--profile", default=None, help="yaml of profile fields (given figures) instead of run dirs")
    plan.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a profile field, e.g. --set train_efficiency=0.8 --set switch_s=2",
    )
    plan.add_argument("-k", type=int, nargs="+", default=[1], help="async staleness bounds to consider (default 1)")
    plan.add_argument(
        "--cores",
        type=int,
        default=None,
        help="devices are CPU cores, this many per machine; 0: devices are GPUs "
        "(default: this box's cores if it has no GPU)",
    )
    plan.add_argument("--save-profile", default=None, help="write the profile as yaml (edit it, pass it to --profile)")


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "eval",
        help="score a checkpoint or HF model on held-out prompts with vLLM (accuracy, pass@k)",
        description="Data, rewards and sampling come from the checkpoint's run directory "
        "(config.yaml) or from --config-name; Hydra overrides change them "
        "(data.task=jsonl data.path=test.jsonl rollout.max_tokens=64). Scores "
        "eval.num_prompts (64) prompts of eval.split: heldout (arith: problems "
        "training never saw) or data (the data section's rows).",
    )
    ev.add_argument("model", help="checkpoint dir (runs/<id>/checkpoints/final), HF model dir or built-in name")
    ev.add_argument(
        "--config-name",
        "-cn",
        default=None,
        help="recipe for data/rewards/sampling (default: the run's config.yaml, else grpo_arith)",
    )
    ev.add_argument("--config-dir", "-cd", default=None, help=f"recipe directory (default: {RECIPES_DIR})")
    ev.add_argument("-n", type=int, default=1, help="samples per prompt (default 1)")
    ev.add_argument("-k", type=int, nargs="+", default=None, help="pass@k for these k (default: 1 and n)")
    ev.add_argument("--limit", type=int, default=None, help="prompts to score (default: eval.num_prompts; 0: all)")
    ev.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature (0: greedy; default: rollout.temperature)"
    )
    ev.add_argument(
        "--out",
        default=None,
        help="write completions.jsonl + summary.json here "
        "(default: <run>/eval/<timestamp> for a checkpoint in a run dir)",
    )
    ev.add_argument("overrides", nargs="*", help="overrides, e.g. data.num_prompts=64 rollout.max_tokens=64")


def _train(args: argparse.Namespace) -> int:
    from relayrl.config import load_config
    from relayrl.rollout.actor import start_driver_forkserver, stop_shared

    if not args.print_config:
        start_driver_forkserver()  # the engines' vLLM import starts now, beside the driver's own start
    try:
        overrides = [*args.overrides, *(["logging.verbose=true"] if args.verbose else [])]
        cfg = load_config(args.config_name, overrides, args.config_dir)
        if args.print_config:
            from omegaconf import OmegaConf

            print(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
            return 0
        from relayrl.controller import train

        train(cfg)
        return 0
    except KeyboardInterrupt:  # Ctrl-C: the driver said what the run keeps; no traceback
        return 130
    finally:
        stop_shared()


def _plot(args: argparse.Namespace) -> int:
    from relayrl.monitor.plot import plot_run

    for path in plot_run(args.run_dir):
        print(path)
    return 0


def _runs(args: argparse.Namespace) -> int:
    from rich.console import Console

    from relayrl.monitor.runs import runs_table, scan_runs

    try:
        infos = scan_runs(args.dir)
    except FileNotFoundError as exc:
        print(f"relayrl: {exc}", file=sys.stderr)
        return 2
    console = Console()
    if not console.is_terminal:  # pipes and CI: don't wrap rows at 80 columns
        console = Console(width=200)
    console.print(runs_table(infos) if infos else f"no runs under {args.dir}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from relayrl.config import load_config
    from relayrl.monitor.evaluate import evaluate, find_run_dir, run_config

    run_dir = find_run_dir(args.model)
    model = run_dir / "checkpoints" / "final" if run_dir == Path(args.model) else args.model  # a run dir itself
    if args.config_name is None and run_dir is not None:
        cfg = run_config(run_dir, args.overrides)
    else:
        cfg = load_config(args.config_name or "grpo_arith", args.overrides, args.config_dir)
    out = args.out or (run_dir / "eval" / time.strftime("%Y%m%d-%H%M%S") if run_dir is not None else None)
    ks = tuple(args.k) if args.k else tuple(sorted({1, args.n}))
    result = evaluate(cfg, model, n=args.n, ks=ks, limit=args.limit, temperature=args.temperature, out_dir=out)
    print(result.summary())
    if out is not None:
        print(f"completions and summary in {out}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from rich.console import Console

    from relayrl.plan import overrides, rank
    from relayrl.plan.report import load_profile, plan_table, profile_lines, save_profile

    cores = _cpu_cores() if args.cores is None else (args.cores or None)
    try:
        profile = load_profile(args.runs, args.profile, args.set, cores)
        preds = rank(profile, args.devices, tuple(args.k))
    except (OSError, ValueError) as exc:
        print(f"relayrl: plan: {exc}", file=sys.stderr)
        return 2
    if args.save_profile:
        save_profile(profile, args.save_profile)
    console = Console() if Console().is_terminal else Console(width=200)
    console.print("\n".join(profile_lines(profile)), highlight=False)
    console.print(plan_table(preds))
    console.print(f"recommended: {' '.join(overrides(preds[0].layout, cpu=cores is not None))}", highlight=False)
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from relayrl.config import load_config
    from relayrl.plan.scenario import find_cluster, rank_layouts, rank_lines, report_lines, scenario, write_outputs
    from relayrl.plan.train_layouts import train_layout_lines

    try:
        cfg = load_config(args.config_name, args.overrides, args.config_dir)
        spec = find_cluster(args.cluster)
        if args.train_layouts:
            prompt_len = int(spec.workload.get("prompt_len", 256))
            print("\n".join(train_layout_lines(cfg, spec, prompt_len)))
            return 0
        if args.rank:
            print("\n".join(rank_lines(rank_layouts(cfg, spec, tuple(args.k)))))
            return 0
        sc = scenario(cfg, spec)
        result = sc.run(args.steps)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"relayrl: simulate: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report_lines(sc, result, args.cluster)))
    if args.out:
        for path in write_outputs(sc, result, Path(args.out), args.gantt_steps):
            print(path)
    return 0


def _cpu_cores() -> int | None:
    """This box's cores when it has no CUDA GPU (a device is then a core), else None (a device is a GPU)."""
    import os

    import torch

    return None if torch.cuda.is_available() else os.cpu_count()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """argparse, except that ``key=value`` overrides may also come after options (``eval M -n 4 a=b``):
    argparse takes positionals only in one run, so the overrides it leaves over are added back here."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and (not hasattr(args, "overrides") or any(x.startswith("-") or "=" not in x for x in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def _scale(args: argparse.Namespace) -> int:
    from relayrl.controller.membership import ScaleError, request_scale

    try:
        print(request_scale(args.run_dir, args.replicas))
    except ScaleError as exc:
        print(f"relayrl: {exc}", file=sys.stderr)
        return 2
    return 0


COMMANDS = {
    "train": _train,
    "scale": _scale,
    "plot": _plot,
    "runs": _runs,
    "eval": _eval,
    "plan": _plan,
    "simulate": _simulate,
}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    show_on_console("stderr" if args.command == "eval" else "stdout")  # eval's stdout is its result
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"relayrl: config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
