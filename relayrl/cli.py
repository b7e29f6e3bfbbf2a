"""The ``relayrl`` command: ``relayrl train --config-name grpo_arith trainer.lr=1e-6 ...``.

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
    return p


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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"train": _train, "plot": _plot}[args.command](args)
    except ConfigError as exc:
        print(f"relayrl: config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
