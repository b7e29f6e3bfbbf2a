"""``relayrl eval``: score a checkpoint or HF model on a dataset with vLLM - accuracy and pass@k.

    prompts (cfg.data, chat template as in training) --> RolloutActor (vLLM, n samples each)
        --> reward functions (cfg.rewards, in this process) --> pass per completion --> accuracy, pass@k

A completion *passes* when its primary reward function (the first in ``cfg.rewards``) gives >= 1, the
rule behind ``reward/pass_rate`` in training; a completion a reward function failed on counts as not
passing. accuracy = passing completions / all completions (= mean pass@1); pass@k per prompt is the
unbiased estimator of ``monitor.passk``, averaged over prompts.

Generation goes through the same ``RolloutActor`` (and engine arguments) as training, so an eval of
``checkpoints/final`` samples exactly as the last training step did, unless ``temperature`` overrides.
Reward functions run in this process without the training pool's timeouts.

What is scored (``cfg.eval``): at most ``eval.num_prompts`` prompts (64; ``--limit`` overrides) of a split,
``heldout`` (default) or ``data``, drawn by ``data.eval_split.eval_rows`` (which rows each split holds is told
there). Prompts go to the engine in chunks, so a progress bar (a line per chunk off a terminal) shows prompts
done and the ETA.

Evaluation during training (``eval.every``, ``controller/training_eval.py``) draws its prompts with the same
``eval_rows`` and ``format_prompts`` and scores with ``completion_rows`` and ``summarize``, so both count a pass
and pass@k alike.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayrl.config import Config, ConfigError
from relayrl.data import Prompt, chat_formatter
from relayrl.data.eval_split import eval_rows
from relayrl.monitor.metrics import _clock
from relayrl.monitor.passk import mean_pass_at_k
from relayrl.preflight import check_rows, resolve_model_path, resolve_rewards

logger = logging.getLogger(__name__)

CHUNK_COMPLETIONS = 64
"""Completions per generate call: the unit of progress (one bar update, one ETA estimate)."""
IN_FLIGHT = 2
"""Generate calls queued on the engine at once: the next chunk is ready when one finishes, so the
engine never idles between chunks."""


@dataclass
class EvalResult:
    model: str
    prompts: int
    samples_per_prompt: int
    accuracy: float  # passing completions / all completions
    pass_at_k: dict[int, float]  # k -> mean pass@k over prompts
    mean_reward: float  # mean weighted total reward over scored completions
    rows: list[dict[str, Any]]  # one per completion: prompt_id, sample, completion, rewards, passed
    split: str = ""  # which prompts were scored (eval_rows' description)

    def summary(self) -> str:
        passed = sum(r["passed"] for r in self.rows)
        ks = " | ".join(f"pass@{k} {v:.3f}" for k, v in sorted(self.pass_at_k.items()))
        return (
            f"accuracy {self.accuracy:.3f} ({passed}/{len(self.rows)}) | {ks} | mean reward "
            f"{self.mean_reward:.3f} | {self.prompts} prompts x {self.samples_per_prompt} samples"
            + (f" | {self.split}" if self.split else "")
        )


def run_config(run_dir: str | Path, overrides: Sequence[str] = ()) -> Config:
    """The resolved ``config.yaml`` of a run directory, with ``key=value`` overrides, validated."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from relayrl.config import validate

    path = Path(run_dir) / "config.yaml"
    try:
        saved = OmegaConf.load(path)
        if isinstance(saved, DictConfig):  # a list at the top fails the merge below, as any bad file does
            saved.pop("defaults", None)
        merged = OmegaConf.merge(OmegaConf.structured(Config), saved, OmegaConf.from_dotlist(list(overrides)))
        cfg = OmegaConf.to_object(merged)
        assert isinstance(cfg, Config), "a merge onto the structured Config converts back to a Config"
        return validate(cfg)
    except (OSError, OmegaConfBaseException) as exc:
        raise ConfigError(f"{path}: {str(exc).splitlines()[0]}; pass --config-name to use a recipe instead") from None


def find_run_dir(model: str | Path) -> Path | None:
    """The run directory a checkpoint lies in (``<run>/checkpoints/<name>``), or ``model`` itself if it is one."""
    for candidate in (Path(model), *list(Path(model).parents)[:2]):
        if (candidate / "config.yaml").is_file() and (candidate / "metrics.jsonl").exists():
            return candidate
    return None


def evaluate(
    cfg: Config,
    model: str | Path | None = None,
    n: int = 1,
    ks: tuple[int, ...] = (1,),
    limit: int | None = None,
    temperature: float | None = None,
    out_dir: str | Path | None = None,
) -> EvalResult:
    """Sample ``n`` completions for each of ``limit`` (default ``eval.num_prompts``) prompts of the
    ``eval.split`` split with ``model`` (default ``cfg.model.path``), score them with ``cfg.rewards``;
    write completions.jsonl and summary.json into ``out_dir`` when given."""
    bad_k = [k for k in ks if not 1 <= k <= n]
    if bad_k:
        raise ConfigError(f"pass@k needs 1 <= k <= n; got k={bad_k} with n={n}; raise -n or lower -k")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(model or cfg.model.path)))
    model_path = resolve_model_path(cfg)
    reward_fns = resolve_rewards(cfg, None)
    rows, split = eval_rows(cfg, cfg.eval.num_prompts if limit is None else limit)
    check_rows(cfg, model_path, rows, split)
    logger.info("relayrl: eval: %d prompts x %d samples; %s", len(rows), n, split)
    prompts = format_prompts(cfg, model_path, rows)
    groups = generate(cfg, model_path, prompts, n, temperature)
    result = dataclasses.replace(summarize(str(model_path), score(groups, reward_fns), n, ks), split=split)
    if out_dir is not None:
        write_result(result, Path(out_dir))
    return result


def format_prompts(cfg: Config, model_path: Path, rows: list[dict[str, Any]]) -> list[Prompt]:
    """One unseeded ``Prompt`` per row (id: the row's index), chat-formatted as in training."""
    from transformers import AutoTokenizer

    fmt = chat_formatter(AutoTokenizer.from_pretrained(model_path), cfg.data.chat_template)
    return [Prompt(i, fmt(row["question"]), row) for i, row in enumerate(rows)]


def generate(cfg: Config, model_path: Path, prompts: list[Prompt], n: int, temperature: float | None) -> list[Any]:
    """``n`` completions per prompt from one rollout actor (Ray is started if it is not running)."""
    import ray

    from relayrl.controller.cluster import start_ray
    from relayrl.rollout import start_rollout_actor

    rollout_cfg = cfg.rollout if temperature is None else dataclasses.replace(cfg.rollout, temperature=temperature)
    start_ray(cfg.run.ray_address, cfg.placement, rollout_cfg.num_cpus)
    actor = start_rollout_actor(str(model_path), cfg.model, rollout_cfg, cfg.run.seed)
    try:
        logger.info("relayrl: eval: starting the engine")
        ray.get(actor.info.remote())  # engine up: the progress clock (and its ETA) is generation only
        return generate_chunks(actor, prompts, n)
    finally:
        try:
            ray.get(actor.shutdown.remote(), timeout=30)
        finally:
            ray.kill(actor)


def generate_chunks(actor: Any, prompts: list[Prompt], n: int) -> list[Any]:
    """``actor.generate`` over chunks of ``CHUNK_COMPLETIONS // n`` prompts, ``IN_FLIGHT`` at a time,
    reporting each finished chunk to a progress bar; groups come back in prompt order."""
    import ray

    size = max(1, CHUNK_COMPLETIONS // n)
    chunks = [prompts[i : i + size] for i in range(0, len(prompts), size)]
    groups: list[Any] = []
    pending = [actor.generate.remote(c, n) for c in chunks[:IN_FLIGHT]]
    with EvalProgress(len(prompts)) as progress:
        for i in range(len(chunks)):
            done = ray.get(pending.pop(0))
            if i + IN_FLIGHT < len(chunks):
                pending.append(actor.generate.remote(chunks[i + IN_FLIGHT], n))
            groups.extend(done)
            progress.advance(len(done))
    return groups


class EvalProgress:
    """Prompts generated so far: a rich bar with ETA on a terminal (as the training console draws), else
    one plain line per chunk (``eval 16/64 prompts | 0:12 elapsed | ETA 0:36``), both on stderr.
    ETA = elapsed / prompts done x prompts left (chunks are alike, so the mean rate is a fair guess)."""

    def __init__(self, total: int):
        from rich.console import Console

        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self.console = Console(stderr=True, highlight=False)
        self.bar = self._bar() if self.console.is_terminal else None

    def _bar(self) -> Any:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        bar = Progress(
            TextColumn("[bold]eval"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("prompts | ETA"),
            TimeRemainingColumn(),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._task = bar.add_task("eval", total=self.total)
        return bar

    def __enter__(self) -> EvalProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def advance(self, prompts: int) -> None:
        self.done += prompts
        if self.bar is not None:
            self.bar.update(self._task, completed=self.done)
            return
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / self.done * (self.total - self.done)
        self.console.print(f"eval {self.done}/{self.total} prompts | {_clock(elapsed)} elapsed | ETA {_clock(eta)}")

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


def score(groups: list[Any], reward_fns: list[tuple]) -> list[dict[str, Any]]:
    """Fill every trajectory's rewards (in place, in this process) and return ``completion_rows``."""
    from relayrl.rewards.scoring import fill_rewards, flatten, plan_calls, run_local, unique_names

    fns = unique_names(reward_fns)
    calls = plan_calls(groups, len(fns), 1)
    fill_rewards(groups, fns, calls, run_local(fns, flatten(groups), calls))
    return completion_rows(groups)


def completion_rows(groups: list[Any]) -> list[dict[str, Any]]:
    """One row per completion of scored ``groups``, with ``passed``: not excluded and the primary reward
    (the first function; ``fill_rewards`` keeps ``cfg.rewards`` order in ``rewards``) >= 1, the rule
    of ``reward/pass_rate``. Shared by ``relayrl eval`` and evaluation during training."""
    return [
        {
            "prompt_id": g.prompt_id,
            "sample": t.sample_idx,
            "prompt": g.prompt,
            "completion": t.completion_text,
            "reward": t.reward if t.excluded is None else None,
            "rewards": dict(t.rewards),
            "excluded": None if t.excluded is None else t.excluded.reason,
            "passed": t.excluded is None and (next(iter(t.rewards.values()), None) or 0.0) >= 1.0,
        }
        for g in groups
        for t in g.trajectories
    ]


def summarize(model: str, rows: list[dict[str, Any]], n: int, ks: tuple[int, ...]) -> EvalResult:
    """accuracy, pass@k and the mean reward from per-completion rows (``n`` per prompt)."""
    counts: dict[int, int] = {}
    for r in rows:
        counts[r["prompt_id"]] = counts.get(r["prompt_id"], 0) + int(r["passed"])
    scored = [r["reward"] for r in rows if r["reward"] is not None]
    return EvalResult(
        model,
        len(counts),
        n,
        sum(r["passed"] for r in rows) / len(rows),
        {k: mean_pass_at_k(list(counts.values()), n, k) for k in ks},
        sum(scored) / len(scored) if scored else float("nan"),
        rows,
    )


def write_result(result: EvalResult, out_dir: Path) -> None:
    summary = {k: v for k, v in dataclasses.asdict(result).items() if k != "rows"}
    write_rows(out_dir, result.rows, summary)


def write_rows(out_dir: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """``completions.jsonl`` (one row per line) and ``summary.json`` (with the time) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "completions.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    (out_dir / "summary.json").write_text(json.dumps({**summary, "time": time.time()}, indent=1) + "\n")
