"""Reward model served by a Ray actor: scores differ by text and equal a direct HF forward."""

from __future__ import annotations

import asyncio

import pytest
import torch

from relayrl.rewards import load_reward_fns, score_groups
from relayrl.types import Trajectory, TrajectoryGroup


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory):
    """A random 2-layer LlamaForSequenceClassification (one score head) with the tiny test tokenizer."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from relayrl.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = LlamaConfig(  # type: ignore[call-arg]  # num_labels is a PretrainedConfig kwarg
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("rm")
    LlamaForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _hf_scores(path, texts: list[str]) -> list[float]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.inference_mode():  # one text at a time: no padding anywhere
        return [model(**tok(t, return_tensors="pt")).logits[0, 0].item() for t in texts]


def test_reward_model_scores_equal_a_direct_forward(tiny_rm, ray_session):
    [(name, rm, weight)] = load_reward_fns([("reward_model", 1.0, {"path": str(tiny_rm), "batch_size": 3})])
    prompts = ["What is 2 + 2?", "What is 2 + 2?", "What is 12 + 7?", "q", "q"]
    completions = [" Answer: 4", " Answer: 5", " 19, because twelve plus seven is nineteen", "", " hello there"]
    try:
        got = asyncio.run(rm(prompts, completions))  # padded batches of 3 in the actor
        want = _hf_scores(tiny_rm, [p + c for p, c in zip(prompts, completions)])
        assert got == pytest.approx(want, abs=1e-5)
        assert len({round(v, 6) for v in got}) == len(got), f"scores should differ by text: {got}"
        group = TrajectoryGroup(
            0,
            prompts[0],
            {},
            [Trajectory(0, i, [1], [2], [-0.1], c, "stop", []) for i, c in enumerate(completions[:2])],
        )
        score_groups([group], [(name, rm, weight)])  # as a reward function, by name
        assert [t.rewards["reward_model"] for t in group.trajectories] == pytest.approx(want[:2], abs=1e-5)
    finally:
        ray_session.kill(rm.server)  # type: ignore[attr-defined]  # a RewardModel instance
