"""PPO on real Ray + gloo + FSDP2 with the tiny Llama: the critic shares the trainer ranks, its values feed GAE,
both models learn, and the value loss falls when one batch is trained on repeatedly.

One fixed step (3 prompts x 3 completions, rewards and lengths in the table below) is trained 6 times with
world_size 1 and twice with world_size 2 (micro-batches of 2: one padding row), 2 epochs each so the value
clip acts, with a frozen reference and the KL (k1) in the reward. DAPO's dynamic sampling is on: a fourth
group whose rewards are all equal is dropped before anything else, so the hand numbers are the table's, and
a step made of that group alone changes nothing.
"""

import math
from typing import Any

import pytest
import torch

from relayrl.config import AlgorithmConfig, CriticConfig, ModelConfig, TrainerConfig
from relayrl.types import Trajectory, TrajectoryGroup, VersionSpan

# (completion length, reward) of sample s of prompt p
TABLE = [[(2, 0.0), (3, 1.5), (4, 1.0)], [(5, 1.0), (6, 0.5), (2, 2.0)], [(3, 0.0), (4, 1.5), (5, 1.0)]]
# Hand-worked from TABLE: 34 completion tokens; with gamma = lam = 1 every token's return is its sequence's
# reward, so the token-mean return is sum(T R) / sum(T) = 31.5 / 34 = .926471, and with the critic's zeroed
# head (V = 0) the first epoch's value loss is .5 * sum(T R^2) / sum(T) = .5 * 39.25 / 34 = .577206.
TOKENS, RETURN_MEAN, FIRST_VALUE_LOSS = 34.0, 31.5 / 34, 0.5 * 39.25 / 34
STEPS = 6


def _groups(vocab: int) -> list[TrajectoryGroup]:
    g = torch.Generator().manual_seed(3)
    groups = []
    for p, row in enumerate(TABLE):
        prompt = torch.randint(3, vocab, (4 + p,), generator=g).tolist()
        trajs = [
            Trajectory(
                p,
                s,
                prompt,
                torch.randint(3, vocab, (T,), generator=g).tolist(),
                (-torch.rand(T, generator=g) * 6).tolist(),
                "",
                "stop",
                [VersionSpan(0, 0, T)],
                reward=r,
            )
            for s, (T, r) in enumerate(row)
        ]
        groups.append(TrajectoryGroup(p, f"prompt {p}", {}, trajs))
    return groups


def _flat_group(vocab: int) -> TrajectoryGroup:
    """Three completions that all got reward .7: no spread, dropped by dynamic sampling."""
    return TrajectoryGroup(
        9,
        "flat",
        {},
        [
            Trajectory(9, s, [3, 4, 5], [6 + s, 7], [-1.0, -1.0], "", "stop", [VersionSpan(0, 0, 2)], reward=0.7)
            for s in range(3)
        ],
    )


def _initial_state(path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


@pytest.fixture(scope="module")
def ppo_runs(ray_session, tiny_llama):
    from relayrl.trainer.ranks import TrainerGroup

    initial = _initial_state(tiny_llama)
    vocab = initial["model.embed_tokens.weight"].shape[0]
    groups = [*_groups(vocab), _flat_group(vocab)]
    algo = AlgorithmConfig(name="gae", group_size=3, kl_coef=0.05, kl_estimator="k1", dynamic_sampling=True)
    out: dict[str, Any] = {"initial": initial}  # state dicts, stats lists and stats
    for ws, micro, steps in ((1, 3, STEPS), (2, 2, 2)):
        trainer = TrainerGroup(
            ws,
            str(tiny_llama),
            ModelConfig(path=str(tiny_llama)),
            TrainerConfig(world_size=ws, lr=1e-3, micro_batch_size=micro, epochs=2, num_cpus=1),
            algo,
            temperature=1.0,
            seed=0,
            critic_cfg=CriticConfig(lr=3e-3, value_clip=0.2),
        )
        try:
            out[f"stats{ws}"] = [trainer.train_step([groups]) for _ in range(steps)]
            out[f"policy{ws}"], out[f"critic{ws}"] = trainer.state_dict(), trainer.critic_state_dict()
            if ws == 1:
                out["flat_stats"] = trainer.train_step([[_flat_group(vocab)]])
                out["policy_after_flat"] = trainer.state_dict()
        finally:
            trainer.shutdown()
    for s in out["stats1"]:
        print(
            {
                k: round(v, 4)
                for k, v in s.items()
                if k.startswith(("value", "explained", "return", "critic", "kl", "loss", "clip", "step_s"))
            }
        )
    return out


def test_first_step_matches_the_hand_numbers(ppo_runs):
    first = ppo_runs["stats1"][0]
    assert first["tokens"] == TOKENS and first["sequences"] == 9
    assert first["value_mean"] == 0.0  # zeroed head: V_old = 0
    assert first["return_mean"] == pytest.approx(RETURN_MEAN, abs=1e-6)
    assert first["explained_variance"] == pytest.approx(0.0, abs=1e-6)  # 1 - Var(R - 0) / Var(R)
    assert first["kl"] == 0.0  # pi_old == pi_ref before any update
    # value loss is the mean over 2 epochs: the first is exactly FIRST_VALUE_LOSS, the second lower
    assert FIRST_VALUE_LOSS / 2 < first["value_loss"] < FIRST_VALUE_LOSS


def test_dynamic_sampling_drops_the_flat_group_and_skips_an_empty_step(ppo_runs):
    assert all(s["dapo/dropped_groups"] == 1 and s["dapo/kept_groups"] == 3 for s in ppo_runs["stats1"])
    flat = ppo_runs["flat_stats"]
    assert (flat["dapo/dropped_groups"], flat["dapo/kept_groups"], flat["sequences"]) == (1, 0, 0)
    for k, v in ppo_runs["policy1"].items():
        assert torch.equal(ppo_runs["policy_after_flat"][k], v), k


def test_value_loss_falls_and_critic_explains_returns(ppo_runs):
    stats = ppo_runs["stats1"]
    losses = [s["value_loss"] for s in stats]
    assert all(math.isfinite(v) for s in stats for v in s.values())
    assert losses[-1] < 0.5 * losses[0], losses
    assert stats[-1]["explained_variance"] > 0.05  # from 0: V starts to tell sequences apart
    assert stats[-1]["value_mean"] > 0.5  # V moved from 0 towards R ~ .93
    assert max(s["value_clip_frac"] for s in stats) > 0  # epoch 2 moves V past the clip
    assert stats[-1]["kl"] > 0 and stats[-1]["grad_norm"] > 0 and stats[-1]["critic_grad_norm"] > 0


def test_policy_and_critic_both_changed(ppo_runs):
    initial, policy, critic = ppo_runs["initial"], ppo_runs["policy1"], ppo_runs["critic1"]
    assert max((policy[k] - initial[k]).abs().max().item() for k in policy) > 1e-3
    assert critic["score.weight"].abs().max() > 1e-3  # the head started at zero
    layer = "model.layers.0.mlp.up_proj.weight"  # the backbone is trained too
    assert (critic[layer] - initial[layer]).abs().max() > 1e-4
    assert not torch.equal(critic[layer], policy[layer])  # two models, not one


def test_world_size_2_matches_world_size_1(ppo_runs):
    # step-wide whitening and explained variance come from all-reduced moments; padding rows count nowhere
    for s1, s2 in zip(ppo_runs["stats1"][:2], ppo_runs["stats2"]):
        for key in (
            "loss",
            "kl",
            "grad_norm",
            "value_loss",
            "value_clip_frac",
            "explained_variance",
            "value_mean",
            "return_mean",
            "critic_grad_norm",
        ):
            assert s2[key] == pytest.approx(s1[key], abs=1e-5, rel=1e-4), key
