"""Evaluation during training (eval.every): which steps evaluate, the figures by hand, and one tiny run on
Ray (real vLLM engine, trainer rank, reward pool) whose eval/* lines are checked against the completions
they came from and whose greedy completions equal transformers' greedy decoding of the evaluated weights."""

from __future__ import annotations

import json
from math import comb
from typing import Any

import pytest

from relayrl.config import ConfigError, EvalConfig, load_config
from relayrl.controller.training_eval import due_versions, eval_metrics, is_due
from relayrl.monitor.schema import lookup, schema_gaps
from relayrl.rewards.builtin import digit_fraction

STEPS, EVERY, SAMPLES, PROMPTS = 4, 2, 4, 6
EVAL_KEYS = {"eval/greedy_accuracy", "eval/sampled_accuracy", f"eval/pass@{SAMPLES}", "eval/mean_reward", "eval/time_s"}


def length_multiple_of_3(prompts, completions, **columns):
    """Passes (1.0) when the completion length is a multiple of 3: about a third of random text does."""
    return [1.0 if len(c) % 3 == 0 else 0.0 for c in completions]


# ---- pure parts ------------------------------------------------------------------------------------
def test_which_versions_evaluate():
    assert due_versions(5, 2, True) == [0, 2, 4]  # before step 1, after 2, after 4 (not 5)
    assert due_versions(5, 2, False) == [2, 4]
    assert due_versions(3, 1, True) == [0, 1, 2, 3]
    assert due_versions(5, 0, True) == []  # off: not even before the first step
    assert due_versions(5, 7, False) == [] and due_versions(5, 7, True) == [0]
    assert is_due(10, 5, False) and not is_due(11, 5, True)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("every", -1, "eval.every=-1 must be >= 0"),
        ("samples", 0, "eval.samples=0 must be >= 1"),
        ("train_prompts", 0, "eval.train_prompts=0 must be >= 1"),
    ],
)
def test_config_checks_name_the_field_and_the_fix(field, value, message):
    with pytest.raises(ConfigError, match=message + r".*; set eval\."):
        EvalConfig(**{field: value})


def test_config_defaults_are_off_and_a_multi_turn_env_is_refused():
    cfg = EvalConfig()
    assert (cfg.every, cfg.before_first_step, cfg.samples, cfg.train_prompts) == (0, True, 4, 16)
    assert load_config("grpo_tiny", ["eval.every=2", "eval.samples=2"]).eval.every == 2
    with pytest.raises(ConfigError, match=r"eval\.every=2 scores single-turn completions.*set eval\.every=0"):
        load_config("grpo_tiny", ["eval.every=2", "env.name=calculator"])


def _row(prompt_id: int, passed: bool, reward: float | None) -> dict:
    return {"prompt_id": prompt_id, "passed": passed, "reward": reward}


def test_eval_metrics_by_hand():
    """2 prompts. Greedy: prompt 0 passes, prompt 1 fails -> 1/2. Sampled (3 each): prompt 0 passes 2 of 3,
    prompt 1 none -> accuracy 2/6; pass@3 = mean(1 - C(1,3)/C(3,3), 1 - C(3,3)/C(3,3)) = mean(1, 0) = 0.5.
    mean_reward over the scored sampled completions (one excluded: None): (1.5 + 1.0 + 0.2 + 0.1 + 0.0) / 5."""
    greedy = [_row(0, True, 1.0), _row(1, False, 0.0)]
    sampled = [
        _row(0, True, 1.5),
        _row(0, True, 1.0),
        _row(0, False, 0.2),
        _row(1, False, 0.1),
        _row(1, False, 0.0),
        _row(1, False, None),
    ]
    out = eval_metrics(greedy, sampled, 3, seconds=2.5)
    assert out == {
        "eval/greedy_accuracy": 0.5,
        "eval/sampled_accuracy": pytest.approx(2 / 6),
        "eval/pass@3": 0.5,
        "eval/mean_reward": pytest.approx(2.8 / 5),
        "eval/time_s": 2.5,
    }
    assert all(lookup(k).when == "eval" for k in out)  # every figure is in the schema


class _Recorder:
    """A fake replica's ``generate``: ``.remote(prompts, n)`` records the call and returns a label."""

    def __init__(self, name: str):
        self.name, self.calls = name, []

    def remote(self, prompts, n):
        self.calls.append((prompts, n))
        return f"{self.name}:{len(self.calls)}"


class _Replica:
    def __init__(self, name: str):
        self.generate = _Recorder(name)


class _Logger:
    def __init__(self):
        self.logged = []

    def log(self, step, metrics):
        self.logged.append((step, metrics))


def _evaluator(tiny_llama, tmp_path, every=2, before=True, replicas=2):
    """A TrainingEval on fake replicas and a fake run (the held-out draw and formatting are real)."""
    from types import SimpleNamespace

    from relayrl.controller.training_eval import TrainingEval

    cfg = load_config(
        "grpo_tiny",
        [
            f"model.path={tiny_llama}",
            f"eval.every={every}",
            f"eval.samples={SAMPLES}",
            f"eval.train_prompts={PROMPTS}",
            f"eval.before_first_step={before}",
        ],
    )
    # stand-ins with only the fields TrainingEval reads
    rollouts = [_Replica(f"r{i}") for i in range(replicas)]
    system: Any = SimpleNamespace(model_path=tiny_llama, rollouts=rollouts, catch_up=lambda version: rollouts)
    run: Any = SimpleNamespace(path=tmp_path, logger=_Logger())
    return TrainingEval(cfg, system, run)


def test_prompts_are_spread_over_replicas_greedy_unseeded_samples_seeded(tiny_llama, tmp_path):
    from relayrl.data.sampler import prompt_seed

    ev = _evaluator(tiny_llama, tmp_path)
    greedy, sampled = ev._generate()
    assert greedy == ["r0:1", "r1:1"] and sampled == ["r0:2", "r1:2"]  # one call each per replica
    (g0, n_g), (s0, n_s) = ev.system.rollouts[0].generate.calls
    (g1, _), (s1, _) = ev.system.rollouts[1].generate.calls
    assert (n_g, n_s) == (1, SAMPLES)
    assert sorted(p.prompt_id for p in g0 + g1) == list(range(PROMPTS))  # every prompt once, round-robin
    assert [p.prompt_id for p in s0] == [p.prompt_id for p in g0] == [0, 2, 4]
    assert all(p.temperature == 0.0 and p.seed is None for p in g0 + g1)
    assert all(p.temperature is None and p.seed == prompt_seed(1, p.prompt_id) for p in s0 + s1)
    assert [p.prompt for p in g0] == [p.prompt for p in s0]
    assert ev._generate() and ev.system.rollouts[0].generate.calls[2][0] == g0  # the same prompts next time


def test_before_first_step_logs_step_0_and_after_step_returns_due_figures(tiny_llama, tmp_path):
    ev = _evaluator(tiny_llama, tmp_path)
    ev.evaluate = lambda version: {"eval/greedy_accuracy": version / 10}
    ev.before_first_step(3)  # a resumed run: its start version is not evaluated again
    assert ev.run.logger.logged == []
    ev.before_first_step(0)
    assert ev.run.logger.logged == [(0, {"eval/greedy_accuracy": 0.0})]
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/greedy_accuracy": 0.0}) + "\n")
    ev.before_first_step(0)  # a restart from scratch: step 0 is logged already
    assert len(ev.run.logger.logged) == 1
    assert [ev.after_step(v) for v in (1, 2, 3, 4)] == [
        {},
        {"eval/greedy_accuracy": 0.2},
        {},
        {"eval/greedy_accuracy": 0.4},
    ]
    off = _evaluator(tiny_llama, tmp_path, every=0)
    off.evaluate = lambda version: pytest.fail("eval.every=0 evaluates nothing")
    off.before_first_step(0)
    assert off.prompts == [] and [off.after_step(v) for v in (1, 2)] == [{}, {}]
    no_first = _evaluator(tiny_llama, tmp_path, before=False)
    no_first.evaluate = lambda version: {"eval/time_s": 1.0}
    no_first.before_first_step(0)
    assert no_first.run.logger.logged == [] and no_first.after_step(2) == {"eval/time_s": 1.0}


def test_resume_keeps_the_step_0_eval_line_and_does_not_count_it(tmp_path):
    """RunDir.reopen at step 2 keeps the step-0 eval line (and step 2's eval) and cuts step 3; the reward
    list, which the end-of-run summary and status.json's steps_done come from, holds steps 1 and 2 only."""
    from relayrl.controller.run import RunDir
    from relayrl.monitor.runs import read_jsonl

    cfg = load_config("grpo_tiny", [f"run.output_dir={tmp_path}", "logging.wandb=disabled", "logging.console=false"])
    run = RunDir.create(cfg)
    run.logger.close()
    (run.path / "prompts.jsonl").write_text(
        "".join(json.dumps({"step": s, "prompt_ids": [2 * s, 2 * s + 1]}) + "\n" for s in (1, 2, 3))
    )
    (run.path / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "eval/greedy_accuracy": 0.25})
        + "\n"
        + "".join(json.dumps({"step": s, "reward/mean": 0.5, "eval/greedy_accuracy": 0.5}) + "\n" for s in (1, 2, 3))
    )
    state = {"step": 2, "counts": {"issued": 4, "trained": 4, "dropped": 0}, "sampler": {}, "pending": []}
    reopened = RunDir.reopen(cfg, run.path, state)
    reopened.logger.close()
    assert [r["step"] for _, r in read_jsonl(run.path / "metrics.jsonl")] == [0, 1, 2]
    assert reopened.rewards == [0.5, 0.5]


# ---- one tiny run ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def eval_run(ray_session, tiny_llama, tmp_path_factory):
    from relayrl.controller import train

    out = tmp_path_factory.mktemp("runs")
    cfg = load_config(
        "grpo_tiny",
        [
            f"model.path={tiny_llama}",
            f"run.output_dir={out}",
            "trainer.num_cpus=0.5",
            "rollout.num_cpus=0.5",
            f"run.steps={STEPS}",
            f"eval.every={EVERY}",
            f"eval.samples={SAMPLES}",
            f"eval.train_prompts={PROMPTS}",
            (
                "rewards=[{fn: tests.controller.test_eval_during_training:length_multiple_of_3}, "
                "{fn: relayrl.rewards.builtin:digit_fraction, weight: 0.5}]"
            ),
        ],
    )
    result = train(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return result, rows


def _completions(run_dir, step: int) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "eval" / f"step_{step}" / "completions.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_eval_lines_at_exactly_the_due_steps(eval_run):
    result, rows = eval_run
    assert [r["step"] for r in rows] == [0, *range(1, STEPS + 1)]
    assert [r["step"] for r in rows if EVAL_KEYS & r.keys()] == due_versions(STEPS, EVERY, True) == [0, 2, 4]
    assert set(rows[0]) == EVAL_KEYS | {"step", "wall_time"}  # step 0: the initial model, eval only
    for r in rows:
        if r["step"] in (0, 2, 4):
            assert r.keys() >= EVAL_KEYS
            assert all(0.0 <= r[k] <= 1.0 for k in EVAL_KEYS - {"eval/mean_reward", "eval/time_s"})
            assert 0.0 <= r["eval/mean_reward"] <= 1.5 and r["eval/time_s"] > 0
    undocumented, missing = schema_gaps({k for r in rows for k in r}, {"eval", "first_sync", "first_step", "push"})
    assert undocumented == [] and not [m for m in missing if m.startswith("eval/")]
    assert (result.run_dir / "plots" / "eval.png").stat().st_size > 10_000
    assert len(result.rewards) == STEPS  # the step-0 line is no training step


@pytest.mark.slow
def test_eval_figures_recount_from_the_completions(eval_run):
    """Re-score every eval completion here and recount accuracy, pass@k and mean reward by hand."""
    result, rows = eval_run
    for r in (r for r in rows if EVAL_KEYS & r.keys()):
        comps = _completions(result.run_dir, r["step"])
        greedy = [c for c in comps if c["decoding"] == "greedy"]
        sampled = [c for c in comps if c["decoding"] == "sampled"]
        assert sorted(c["prompt_id"] for c in greedy) == list(range(PROMPTS))
        assert len(sampled) == PROMPTS * SAMPLES
        for c in comps:
            assert c["passed"] == (len(c["completion"]) % 3 == 0)
            assert c["reward"] == pytest.approx(c["passed"] + 0.5 * digit_fraction([], [c["completion"]])[0])
        passes = [sum(c["passed"] for c in sampled if c["prompt_id"] == i) for i in range(PROMPTS)]
        assert r["eval/greedy_accuracy"] == pytest.approx(sum(c["passed"] for c in greedy) / PROMPTS)
        assert r["eval/sampled_accuracy"] == pytest.approx(sum(passes) / (PROMPTS * SAMPLES))
        pass_k = sum(1 - comb(SAMPLES - c, SAMPLES) / comb(SAMPLES, SAMPLES) for c in passes) / PROMPTS
        assert r[f"eval/pass@{SAMPLES}"] == pytest.approx(pass_k)
        assert r["eval/mean_reward"] == pytest.approx(sum(c["reward"] for c in sampled) / len(sampled))
    prompts = [sorted((c["prompt_id"], c["prompt"]) for c in _completions(result.run_dir, s)) for s in (0, 2, 4)]
    assert prompts[0] == prompts[1] == prompts[2]  # the same held-out set every time


def _hf_greedy(model_dir, prompts: list[str], max_tokens: int) -> list[str]:
    """transformers' greedy continuation of each prompt (tests/models/test_vllm_parity: vLLM agrees)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    texts: list[str] = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            # misc: transformers 5.19 types from_pretrained's model as a class its own generate's `self` rejects
            out = model.generate(  # type: ignore[misc]
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
            )
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert isinstance(text, str)  # one sequence decodes to one string
        texts.append(text)
    return texts


@pytest.mark.slow
def test_greedy_eval_is_the_greedy_decoding_of_the_evaluated_weights(eval_run, tiny_llama):
    """Step 0's greedy completions are the initial model's greedy decoding; step 4's those of the final
    checkpoint (= weights v4): the eval logged at step v ran on weights v, deterministically."""
    result, _ = eval_run
    first = sorted(
        (c["prompt_id"], c["prompt"], c["completion"])
        for c in _completions(result.run_dir, 0)
        if c["decoding"] == "greedy"
    )
    last = sorted(
        (c["prompt_id"], c["prompt"], c["completion"])
        for c in _completions(result.run_dir, STEPS)
        if c["decoding"] == "greedy"
    )
    prompts = [p for _, p, _ in first]
    assert [c for _, _, c in first] == _hf_greedy(tiny_llama, prompts, 16)
    assert [c for _, _, c in last] == _hf_greedy(result.checkpoint, prompts, 16)
    assert [c for _, _, c in first] != [c for _, _, c in last], "training changed no greedy completion"
