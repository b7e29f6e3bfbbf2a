"""Nothing to learn, nothing computed: a group whose rewards don't vary is left out of the update
(``algorithm.drop_zero_spread``), a micro-batch whose advantages are all 0 skips its forward and backward, and
neither changes the weights the step arrives at. Real Ray + gloo + FSDP2 ranks with the tiny Llama.

The step: three groups of three, the last one flat (every completion scored 1.0). With drop_zero_spread off,
world_size 1 with padded micro-batches of 3 rows holds the flat group alone in its last micro-batch and skips it, while
world_size 2 (micro-batches of 2) has no micro-batch that is flat on both ranks and runs them all: the same
weights from both say the skip left the gradient exactly as it was.
"""

import dataclasses

import pytest
import torch

from relayrl.config import AlgorithmConfig, ModelConfig, TrainerConfig
from relayrl.types import TrajectoryGroup
from tests.trainer.test_actor import TEMPERATURE, _hf_model, _synthetic_groups


def _flat_last(groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    last = groups[-1]
    flat = [dataclasses.replace(t, reward=1.0) for t in last.trajectories]
    return [*groups[:-1], TrajectoryGroup(last.prompt_id, last.prompt, last.columns, flat)]


def _train(ws: int, micro: int, algo: AlgorithmConfig, groups: list[TrajectoryGroup], model_path) -> dict:
    from relayrl.trainer.ranks import TrainerGroup

    trainer = TrainerGroup(
        ws,
        str(model_path),
        ModelConfig(path=str(model_path)),
        TrainerConfig(
            world_size=ws,
            lr=1e-3,
            micro_batch_size=micro,
            max_tokens_per_micro_batch=0,
            shared_prefix=False,
            epochs=1,
            num_cpus=1,
        ),
        algo,
        temperature=TEMPERATURE,
        seed=0,
    )
    try:
        return {"stats": trainer.train_step([groups]), "state": trainer.state_dict()}
    finally:
        trainer.shutdown()


pytestmark = pytest.mark.slow  # four trainer groups start up: about two minutes on 2 cores


@pytest.fixture(scope="module")
def skip_runs(ray_session, tiny_llama):
    groups = _flat_last(_synthetic_groups(vocab=_hf_model(tiny_llama).config.vocab_size))
    keep = AlgorithmConfig(group_size=3, drop_zero_spread=False)
    out = {
        "initial": _hf_model(tiny_llama).state_dict(),
        "keep1": _train(1, 3, keep, groups, tiny_llama),
        "keep2": _train(2, 2, keep, groups, tiny_llama),
        "drop1": _train(1, 3, AlgorithmConfig(group_size=3), groups, tiny_llama),
        "all_flat": _train(1, 3, AlgorithmConfig(group_size=3, drop_zero_spread=False), groups[-1:], tiny_llama),
    }
    print({k: v["stats"] for k, v in out.items() if k != "initial"})
    return out


def test_flat_micro_batch_is_skipped_and_the_weights_are_the_same(skip_runs):
    s1, s2 = skip_runs["keep1"]["stats"], skip_runs["keep2"]["stats"]
    assert s1["skipped_micro_batches"] == 1 and s2["skipped_micro_batches"] == 0
    assert s1["sequences"] == s2["sequences"] == 9 and s1["skipped_groups"] == 0  # kept: in the batch
    assert s1["loss_denominator"] == s2["loss_denominator"]  # the flat group's tokens still count
    for key in ("loss", "grad_norm"):
        assert s1[key] == pytest.approx(s2[key], abs=1e-5, rel=1e-5), key
    w1, w2 = skip_runs["keep1"]["state"], skip_runs["keep2"]["state"]
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=1e-4, rtol=0, msg=k)


def test_flat_group_is_dropped_from_the_batch(skip_runs):
    stats = skip_runs["drop1"]["stats"]
    assert stats["skipped_groups"] == 1 and stats["sequences"] == 6
    assert stats["skipped_micro_batches"] == 0
    kept_tokens = skip_runs["keep1"]["stats"]["loss_denominator"]
    assert 0 < stats["loss_denominator"] < kept_tokens  # token-mean over the groups that vary only
    changed = max((skip_runs["drop1"]["state"][k] - v).abs().max().item() for k, v in skip_runs["initial"].items())
    assert changed > 1e-4


def test_a_step_with_nothing_to_learn_leaves_the_weights_alone(skip_runs):
    # Kept but flat: no forward, no backward, and no AdamW step (which would move them by weight decay).
    stats = skip_runs["all_flat"]["stats"]
    assert stats["skipped_micro_batches"] == 1 and stats["sequences"] == 3
    assert "grad_norm" not in stats and "entropy" not in stats  # no means over tokens nothing was computed on
    for k, v in skip_runs["initial"].items():
        assert torch.equal(skip_runs["all_flat"]["state"][k], v), k
