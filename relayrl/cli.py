"""The ``relayrl`` command.

::

    relayrl train --config-name grpo_arith trainer.lr=1e-6 ...    # a recipe with Hydra overrides
    relayrl eval runs/<id>/checkpoints/final -n 8 -k 1 8          # accuracy and pass@k with vLLM
    relayrl plot runs/<id>                                        # PNG charts into runs/<id>/plots
    relayrl runs [runs]                                           # runs with status and best reward

Recipes are Hydra configs composed against the typed schema (relayrl/config.py). A bad key, type or
combination exits with status 2 and one line naming the field and the fix, before Ray starts.
"""

from __future__ import annotations

import argparse
import sys

from relayrl.config import RECIPES_DIR, ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relayrl", description="RL post-training for LLMs.")
    sub = p.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run a recipe (Hydra overrides: key=value ...)")
    train.add_argument("--config-name", "-cn", default="grpo_arith", help="recipe name (default: grpo_arith)")
    train.add_argument("--config-dir", "-cd", default=None, help=f"recipe directory (default: {RECIPES_DIR})")
    train.add_argument("--print-config", action="store_true", help="print the composed config and exit")
    train.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trainer.lr=1e-6 run.steps=5")
    plot = sub.add_parser("plot", help="write PNG charts of a run's metrics.jsonl into <run>/plots")
    plot.add_argument("run_dir")
    runs = sub.add_parser("runs", help="list run directories with status (finished/running/failed) and best reward")
    runs.add_argument("dir", nargs="?", default="runs", help="folder holding run directories (default: runs)")
    _eval_parser(sub)
    return p


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser("eval", help="score a checkpoint or HF model on a dataset with vLLM (accuracy, pass@k)",
                        description="Data, rewards and sampling come from the checkpoint's run directory "
                                    "(config.yaml) or from --config-name; Hydra overrides change them "
                                    "(data.task=jsonl data.path=test.jsonl rollout.max_tokens=64).")
    ev.add_argument("model", help="checkpoint dir (runs/<id>/checkpoints/final), HF model dir or built-in name")
    ev.add_argument("--config-name", "-cn", default=None,
                    help="recipe for data/rewards/sampling (default: the run's config.yaml, else grpo_arith)")
    ev.add_argument("--config-dir", "-cd", default=None, help=f"recipe directory (default: {RECIPES_DIR})")
    ev.add_argument("-n", type=int, default=1, help="samples per prompt (default 1)")
    ev.add_argument("-k", type=int, nargs="+", default=None, help="pass@k for these k (default: 1 and n)")
    ev.add_argument("--limit", type=int, default=None, help="first N prompts only")
    ev.add_argument("--temperature", type=float, default=None, help="sampling temperature (0: greedy; "
                    "default: rollout.temperature)")
    ev.add_argument("--out", default=None, help="write completions.jsonl + summary.json here "
                    "(default: <run>/eval/<timestamp> for a checkpoint in a run dir)")
    ev.add_argument("overrides", nargs="*", help="overrides, e.g. data.num_prompts=64 rollout.max_tokens=64")


def _train(args: argparse.Namespace) -> int:
    from relayrl.config import load_config

    cfg = load_config(args.config_name, args.overrides, args.config_dir)
    if args.print_config:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        return 0
    from relayrl.controller import train

    train(cfg)
    return 0


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
    if not console.is_terminal:          # pipes and CI: don't wrap rows at 80 columns
        console = Console(width=200)
    console.print(runs_table(infos) if infos else f"no runs under {args.dir}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from relayrl.config import load_config
    from relayrl.monitor.evaluate import evaluate, find_run_dir, run_config

    run_dir = find_run_dir(args.model)
    model = run_dir / "checkpoints" / "final" if run_dir == Path(args.model) else args.model   # a run dir itself
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


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        return {"train": _train, "plot": _plot, "runs": _runs, "eval": _eval}[args.command](args)
    except ConfigError as exc:
        print(f"relayrl: config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
