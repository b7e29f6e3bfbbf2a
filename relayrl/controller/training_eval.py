"""Evaluation during training (``eval.every``): a fixed held-out set, greedy and sampled, at step boundaries.

::

    before step 1 (eval.before_first_step):   evaluate(weights v0, the initial model) -> logged as step 0
    step v: train -> sync v to every engine -> evaluate(weights v) if every | v -> log step v (eval/* with it)

    evaluate(v): prompts (drawn once) --spread over the replicas--> generate: 1 greedy (temperature 0)
                 + eval.samples sampled (rollout.temperature, seeded) per prompt --> the run's reward pool
                 --> completion_rows (pass rule of relayrl eval) --> eval/* metrics, eval/step_<v>/ files

Which weights: the scheduler calls ``after_step(v)`` after step v's sync committed version v on every
engine (the sync checks each engine's version) and before anything else can sync, since the driver is
blocked in the evaluation; so every eval token is sampled by weights v, the weights ``checkpoints/step_v``
and, after the last step, ``checkpoints/final`` hold. Colocated, the engines are awake then: the
hand-over back to rollout (weights and KV cache) happened in the sync, the next hand-over to the trainer
comes with the next step. Before step 1 nothing has slept yet.

What it costs: ``mode=sync`` has nothing else in flight at a step boundary, so the trainer waits exactly
the evaluation's time (``eval/time_s``). ``mode=async``: the same blocking call; replicas go on generating
what admission already allows (sharing the engines with the evaluation) while the trainer waits, so
training stalls for the evaluation's time and rollout does not.

The prompts are the first ``eval.train_prompts`` of ``eval.split`` (``data.eval_split.eval_rows``, the rows
``relayrl eval --limit`` scores), drawn once; sampled completions are seeded per (``eval.seed``, prompt), so
two evaluations of the same weights give the same completions, greedy and sampled.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import ray

from relayrl.config import Config
from relayrl.controller.run import RunDir
from relayrl.controller.system import System
from relayrl.data.eval_split import eval_rows
from relayrl.data.sampler import Prompt, prompt_seed
from relayrl.monitor.evaluate import completion_rows, format_prompts, summarize, write_rows
from relayrl.monitor.runs import read_jsonl
from relayrl.monitor.schema import EVAL_TIME_S

logger = logging.getLogger(__name__)

GREEDY_ACCURACY = "eval/greedy_accuracy"
SAMPLED_ACCURACY = "eval/sampled_accuracy"
PASS_AT_K = "eval/pass@{k}"
MEAN_REWARD = "eval/mean_reward"


def is_due(version: int, every: int, before_first_step: bool) -> bool:
    """Whether the weights of ``version`` are evaluated: 0 (the initial model) when ``before_first_step``,
    else the versions ``every`` divides; nothing when ``every`` is 0."""
    if every <= 0:
        return False
    return before_first_step if version == 0 else version % every == 0


def due_versions(steps: int, every: int, before_first_step: bool) -> list[int]:
    """The versions a fresh run of ``steps`` steps evaluates, e.g. (5, 2, True) -> [0, 2, 4]."""
    return [v for v in range(steps + 1) if is_due(v, every, before_first_step)]


def eval_metrics(
    greedy: list[dict[str, Any]], sampled: list[dict[str, Any]], samples: int, seconds: float
) -> dict[str, float]:
    """The logged figures from ``completion_rows`` of the greedy pass (1 per prompt) and the sampled one
    (``samples`` per prompt): accuracy = passing / all completions of a pass; pass@k (k = ``samples``) =
    mean over prompts of ``1 - C(n-c, k)/C(n, k)`` with n = k, i.e. the share of prompts with a passing
    sample; mean_reward = mean weighted total reward of the scored sampled completions (the held-out
    counterpart of ``reward/mean``)."""
    g = summarize("", greedy, 1, (1,))
    s = summarize("", sampled, samples, (samples,))
    return {
        GREEDY_ACCURACY: g.accuracy,
        SAMPLED_ACCURACY: s.accuracy,
        PASS_AT_K.format(k=samples): s.pass_at_k[samples],
        MEAN_REWARD: s.mean_reward,
        EVAL_TIME_S: seconds,
    }


class TrainingEval:
    """The scheduler's evaluator: ``before_first_step`` once, ``after_step`` at every step boundary."""

    def __init__(self, cfg: Config, system: System, run: RunDir):
        """Draw and format the held-out prompts once (nothing when ``eval.every`` is 0)."""
        self.cfg, self.system, self.run = cfg, system, run
        self.prompts: list[Prompt] = []
        if cfg.eval.every:
            self.prompts = self._draw()

    def _draw(self) -> list[Prompt]:
        """The formatted prompts, each with its sampling seed (``preflight.check_data`` checked their lengths and
        budgets before Ray started)."""
        cfg = self.cfg
        model_path = self.system.model_path
        assert model_path is not None, "a System made by System.start has its model path"
        rows, where = eval_rows(cfg, cfg.eval.train_prompts)
        prompts = format_prompts(cfg, model_path, rows)
        first = " and before step 1" if cfg.eval.before_first_step else ""
        logger.info(
            "relayrl: eval every %d steps%s: %d prompts x (1 greedy + %d sampled); %s",
            cfg.eval.every,
            first,
            len(prompts),
            cfg.eval.samples,
            where,
        )
        return [dataclasses.replace(p, seed=prompt_seed(cfg.eval.seed, p.prompt_id)) for p in prompts]

    def before_first_step(self, version: int) -> None:
        """Evaluate the initial weights and log them as step 0; nothing when resuming at ``version`` > 0
        (that version's evaluation, when due, was logged with its step before the run stopped) or when
        the step-0 line is there already (a restart from scratch after a trainer rank died)."""
        e = self.cfg.eval
        if version == 0 and is_due(0, e.every, e.before_first_step) and not self._logged_step_0():
            self.run.logger.log(0, self.evaluate(0))

    def _logged_step_0(self) -> bool:
        return any(r.get("step") == 0 for _, r in read_jsonl(self.run.path / "metrics.jsonl"))

    def after_step(self, version: int) -> dict[str, float]:
        """``eval/*`` of the weights ``version`` the engines just committed, when due; else {}."""
        e = self.cfg.eval
        return self.evaluate(version) if version > 0 and is_due(version, e.every, e.before_first_step) else {}

    def evaluate(self, version: int) -> dict[str, float]:
        """Generate on every replica, score with the run's reward pool, write ``eval/step_<version>/``."""
        t0 = time.perf_counter()
        greedy_refs, sampled_refs = self._generate(self.system.catch_up(version))
        scored, _ = self.system.rewards.score(greedy_refs + sampled_refs)
        groups = ray.get(scored)
        greedy = completion_rows([g for part in groups[: len(greedy_refs)] for g in part])
        sampled = completion_rows([g for part in groups[len(greedy_refs) :] for g in part])
        metrics = eval_metrics(greedy, sampled, self.cfg.eval.samples, time.perf_counter() - t0)
        rows = [{"decoding": "greedy", **r} for r in greedy] + [{"decoding": "sampled", **r} for r in sampled]
        write_rows(self.run.path / "eval" / f"step_{version}", rows, {"version": version, **metrics})
        figures = " | ".join(f"{k.split('/', 1)[1]} {v:.3f}" for k, v in metrics.items())
        logger.info("relayrl: eval of v%d: %s", version, figures)
        return metrics

    def _generate(self, replicas: list[Any] | None = None) -> tuple[list[ray.ObjectRef], list[ray.ObjectRef]]:
        """Greedy and sampled generate calls, the prompts spread round-robin over ``replicas`` (all: None)."""
        replicas = self.system.rollouts if replicas is None else replicas
        parts = [(r, self.prompts[i :: len(replicas)]) for i, r in enumerate(replicas)]
        parts = [(r, chunk) for r, chunk in parts if chunk]
        greedy = [
            r.generate.remote([dataclasses.replace(p, temperature=0.0, seed=None) for p in chunk], 1)
            for r, chunk in parts
        ]
        sampled = [r.generate.remote(chunk, self.cfg.eval.samples) for r, chunk in parts]
        return greedy, sampled
