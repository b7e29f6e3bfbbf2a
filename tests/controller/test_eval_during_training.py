"""Evaluation during training (eval.every): which steps evaluate, the figures by hand, and one tiny run on
Ray (real vLLM engine, trainer rank, reward pool) whose eval/* lines are checked against the completions
they came from and whose greedy completions equal transformers' greedy decoding of the evaluated weights."""

from __future__ import annotations

import json
from math import comb

import pytest

from relayrl.config import ConfigError, EvalConfig, load_config
from relayrl.controller.evaluation import due_versions, eval_metrics, is_due
from relayrl.monitor.schema import lookup, schema_gaps
from relayrl.rewards.builtin import digit_fraction

STEPS, EVERY, SAMPLES, PROMPTS = 4, 2, 4, 6
EVAL_KEYS = {"eval/greedy_accuracy", "eval/sampled_accuracy", f"eval/pass@{SAMPLES}", "eval/mean_reward",
             "eval/time_s"}


def length_multiple_of_3(prompts, completions, **columns):
    """Passes (1.0) when the completion length is a multiple of 3: about a third of random text does."""
    return [1.0 if len(c) % 3 == 0 else 0.0 for c in completions]


# ---- pure parts ------------------------------------------------------------------------------------
def test_which_versions_evaluate():
    assert due_versions(5, 2, True) == [0, 2, 4]          # before step 1, after 2, after 4 (not 5)
    assert due_versions(5, 2, False) == [2, 4]
    assert due_versions(3, 1, True) == [0, 1, 2, 3]
    assert due_versions(5, 0, True) == []                 # off: not even before the first step
    assert due_versions(5, 7, False) == [] and due_versions(5, 7, True) == [0]
    assert is_due(10, 5, False) and not is_due(11, 5, True)


@pytest.mark.parametrize("field, value, message", [
    ("every", -1, "eval.every=-1 must be >= 0"),
    ("samples", 0, "eval.samples=0 must be >= 1"),
    ("train_prompts", 0, "eval.train_prompts=0 must be >= 1"),
])
def test_config_checks_name_the_field_and_the_fix(field, value, message):
    with pytest.raises(ConfigError, match=message + r".*; set eval\."):
        EvalConfig(**{field: value})


def test_config_defaults_are_off_and_a_multi_turn_env_is_refused():
    cfg = EvalConfig()
    assert (cfg.every, cfg.before_first_step, cfg.samples, cfg.train_prompts) == (0, True, 4, 16)
    assert load_config("grpo_tiny", ["eval.every=2", "eval.samples=2"]).eval.every == 2
    with pytest.raises(ConfigError, match="eval.every=2 scores single-turn completions.*set eval.every=0"):
        load_config("grpo_tiny", ["eval.every=2", "env.name=calculator"])


def _row(prompt_id: int, passed: bool, reward: float | None) -> dict:
    return {"prompt_id": prompt_id, "passed": passed, "reward": reward}


def test_eval_metrics_by_hand():
    """2 prompts. Greedy: prompt 0 passes, prompt 1 fails -> 1/2. Sampled (3 each): prompt 0 passes 2 of 3,
    prompt 1 none -> accuracy 2/6; pass@3 = mean(1 - C(1,3)/C(3,3), 1 - C(3,3)/C(3,3)) = mean(1, 0) = 0.5.
    mean_reward over the scored sampled completions (one excluded: None): (1.5 + 1.0 + 0.2 + 0.1 + 0.0) / 5."""
    greedy = [_row(0, True, 1.0), _row(1, False, 0.0)]
    sampled = [_row(0, True, 1.5), _row(0, True, 1.0), _row(0, False, 0.2),
               _row(1, False, 0.1), _row(1, False, 0.0), _row(1, False, None)]
    out = eval_metrics(greedy, sampled, 3, seconds=2.5)
    assert out == {"eval/greedy_accuracy": 0.5, "eval/sampled_accuracy": pytest.approx(2 / 6),
                   "eval/pass@3": 0.5, "eval/mean_reward": pytest.approx(2.8 / 5), "eval/time_s": 2.5}
    assert all(lookup(k).when == "eval" for k in out)     # every figure is in the schema


# ---- one tiny run ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def eval_run(ray_session, tiny_llama, tmp_path_factory):
    from relayrl.controller import train

    out = tmp_path_factory.mktemp("runs")
    cfg = load_config("grpo_tiny", [
        f"model.path={tiny_llama}", f"run.output_dir={out}", "trainer.num_cpus=0.5", "rollout.num_cpus=0.5",
        f"run.steps={STEPS}", f"eval.every={EVERY}", f"eval.samples={SAMPLES}", f"eval.train_prompts={PROMPTS}",
        "rewards=[{fn: tests.controller.test_eval_during_training:length_multiple_of_3}, "
        "{fn: relayrl.rewards.builtin:digit_fraction, weight: 0.5}]"])
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
    assert set(rows[0]) == EVAL_KEYS | {"step", "wall_time"}          # step 0: the initial model, eval only
    for r in rows:
        if r["step"] in (0, 2, 4):
            assert EVAL_KEYS <= r.keys()
            assert all(0.0 <= r[k] <= 1.0 for k in EVAL_KEYS - {"eval/mean_reward", "eval/time_s"})
            assert 0.0 <= r["eval/mean_reward"] <= 1.5 and r["eval/time_s"] > 0
    undocumented, missing = schema_gaps({k for r in rows for k in r}, {"eval", "first_sync", "first_step"})
    assert undocumented == [] and not [m for m in missing if m.startswith("eval/")]
    assert (result.run_dir / "plots" / "eval.png").stat().st_size > 10_000
    assert len(result.rewards) == STEPS                                 # the step-0 line is no training step


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
    assert prompts[0] == prompts[1] == prompts[2]                      # the same held-out set every time


def _hf_greedy(model_dir, prompts: list[str], max_tokens: int) -> list[str]:
    """transformers' greedy continuation of each prompt (tests/models/test_vllm_parity: vLLM agrees)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    texts = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=model.config.pad_token_id)
        texts.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    return texts


@pytest.mark.slow
def test_greedy_eval_is_the_greedy_decoding_of_the_evaluated_weights(eval_run, tiny_llama):
    """Step 0's greedy completions are the initial model's greedy decoding; step 4's those of the final
    checkpoint (= weights v4): the eval logged at step v ran on weights v, deterministically."""
    result, _ = eval_run
    first = sorted((c["prompt_id"], c["prompt"], c["completion"])
                   for c in _completions(result.run_dir, 0) if c["decoding"] == "greedy")
    last = sorted((c["prompt_id"], c["prompt"], c["completion"])
                  for c in _completions(result.run_dir, STEPS) if c["decoding"] == "greedy")
    prompts = [p for _, p, _ in first]
    assert [c for _, _, c in first] == _hf_greedy(tiny_llama, prompts, 16)
    assert [c for _, _, c in last] == _hf_greedy(result.checkpoint, prompts, 16)
    assert [c for _, _, c in first] != [c for _, _, c in last], "training changed no greedy completion"
