"""Padding-free packing equals the padded computation: logprobs, every LOSS_AGG loss, gradients, normalisers.

The trainer runs in-process on the tiny Llama (a one-rank gloo group, no FSDP: packing is about what the
model is fed, not how it is sharded), wired as ``hf.load_sharded`` wires it: the chunked head and the packed
attention. References are built by hand: every sequence run alone through a plain HF model (sdpa or eager,
no padding, full logits), and the padded micro-batches of ``trainer.max_tokens_per_micro_batch=0``.
"""

from __future__ import annotations

import dataclasses
from typing import TypedDict

import pytest
import torch

from relayrl.algorithms.logprobs import token_logprobs
from relayrl.algorithms.losses import LOSS_AGG
from relayrl.algorithms.objective import build_loss
from relayrl.config import AlgorithmConfig, ModelConfig, TrainerConfig
from relayrl.trainer import head
from relayrl.trainer.actor import TrainerActor
from relayrl.trainer.attention import use_packed_attention
from relayrl.trainer.batch import build_train_batch, empty_micro_batch, split_batch
from relayrl.trainer.packing import attention_allowed, pack_rows, place, plan_chunks, split_to_count
from relayrl.trainer.precision import keep_head_fp32
from relayrl.trainer.step import step_totals
from relayrl.types import TrainBatch, Trajectory, TrajectoryGroup, VersionSpan

TEMPERATURE = 0.8


class Layout(TypedDict):
    """The ``TrainerConfig`` fields that choose padded rows, packed rows or packed rows sharing prefixes."""

    max_tokens_per_micro_batch: int
    shared_prefix: bool


PADDED: Layout = {"max_tokens_per_micro_batch": 0, "shared_prefix": False}
PACKED: Layout = {"max_tokens_per_micro_batch": 40, "shared_prefix": False}
SHARED: Layout = {"max_tokens_per_micro_batch": 60, "shared_prefix": True}


# ------------------------------------------------------------------------------------------- helpers
def synthetic_groups(n_groups: int = 3, group_size: int = 4, vocab: int = 500) -> list[TrajectoryGroup]:
    """Groups of one prompt and G completions of different lengths; odd samples begin alike (7, 8), so
    the common prefix runs past the prompt; one completion has a 0 in its mask (an environment token)."""
    g = torch.Generator().manual_seed(0)
    groups = []
    for p in range(n_groups):
        prompt = torch.randint(3, vocab, (5 + 3 * p,), generator=g).tolist()
        trajs = []
        for s in range(group_size):
            comp = ([7, 8] if s % 2 else []) + torch.randint(3, vocab, (2 + (2 * p + s) % 5,), generator=g).tolist()
            T = len(comp)
            mask = [1] * (T - 2) + [0, 1] if (p, s) == (1, 2) else None
            trajs.append(
                Trajectory(
                    p,
                    s,
                    prompt,
                    comp,
                    (-torch.rand(T, generator=g) * 6).tolist(),
                    "",
                    "stop",
                    [VersionSpan(0, 0, T)],
                    reward=float((s + p) % 2) + 0.5 * s,
                    completion_mask=mask,
                )
            )
        groups.append(TrajectoryGroup(p, f"prompt {p}", {}, trajs))
    return groups


def plain_model(model_path, attn: str = "sdpa"):
    """The reference: the HF model as transformers loads it (full logits, its own attention)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32, attn_implementation=attn).eval()


def local_actor(model_path, algo: AlgorithmConfig | None = None, **trainer) -> TrainerActor:
    """A ``TrainerActor`` wired by hand on one CPU rank around an unsharded HF model, its head and attention
    as ``hf.load_sharded`` sets them."""

    actor = TrainerActor(
        0,
        1,
        "127.0.0.1",
        0,
        str(model_path),
        ModelConfig(path=str(model_path)),
        TrainerConfig(lr=1e-3, **trainer),
        algo or AlgorithmConfig(group_size=4),
        TEMPERATURE,
        seed=0,
    )
    actor.device, actor.dp_rank, actor.dp_size = torch.device("cpu"), 0, 1
    actor.dp_group = None  # type: ignore[assignment]  # all_reduce's default group: this one rank
    model = use_packed_attention(plain_model(model_path))
    keep_head_fp32(head.install(head.lm_head(model)))
    actor.model = model
    actor.ref_model, actor.pad_token_id = None, 0
    actor.optimizer = torch.optim.AdamW(actor.model.parameters(), lr=1e-3)
    return actor


def step_share(groups: list[TrajectoryGroup]) -> TrainBatch:
    return split_batch(build_train_batch(groups, pad_token_id=0), 0, 1)


def alone_logprobs(model, ids: list[int]) -> torch.Tensor:
    """The reference: one sequence, no padding, no packing: [n - 1]."""
    with torch.no_grad():
        x = torch.tensor([ids])
        return token_logprobs(model(input_ids=x).logits, x, TEMPERATURE)[0]


def max_logprob_error(actor: TrainerActor, micro, reference_model) -> tuple[float, int]:
    """Largest |trainer logprob - sequence-alone logprob| over every loss token, and how many were checked."""
    worst, checked = 0.0, 0
    for mb in micro:
        lp = actor.policy_step.logprobs(actor.model, mb)
        for r in range(len(mb)):
            n = int(mb.attention_mask[r].sum())
            ref = alone_logprobs(reference_model, mb.input_ids[r, :n].tolist())
            for t in mb.loss_mask[r].nonzero().flatten().tolist():
                worst = max(worst, abs(float(lp[r, t]) - float(ref[mb.target_start + t])))
                checked += 1
    return worst, checked


def step_loss_and_grads(actor: TrainerActor, share: TrainBatch, agg: str):
    """The step's loss (sum of numerators / global denominator), its gradient, and the normalisers."""
    actor.objective = build_loss(dataclasses.replace(actor.algo, loss_agg=agg, norm_len=16))
    micro = actor._micro_batches(share)
    n_tokens, denom = step_totals(micro, actor.objective, actor._all_reduce)
    actor.model.zero_grad(set_to_none=True)
    total = sum(actor.policy_step.train_micro(actor.model, mb, None, None, denom, 1)[0].loss for mb in micro)
    grads = {n: p.grad.clone() for n, p in actor.model.named_parameters() if p.grad is not None}
    return float(total / denom), grads, float(n_tokens), float(denom), len(micro)


# ------------------------------------------------------------------------------------------- pure index math
def test_attention_allowed_is_block_causal():
    # segment 0: a plain sequence of 2; segment 1: prefix of 2, suffix A (1 token), suffix B (2 tokens)
    segment = torch.tensor([0, 0, 1, 1, 1, 1, 1])
    branch = torch.tensor([0, 0, 0, 0, 1, 2, 2])
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0, 0],
            [0, 0, 1, 1, 0, 0, 0],
            [0, 0, 1, 1, 1, 0, 0],  # A sees the prefix and itself
            [0, 0, 1, 1, 0, 1, 0],  # B's first token: prefix, not A
            [0, 0, 1, 1, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(attention_allowed(segment, branch), expected)


def test_pack_rows_plain_layout_by_hand():
    # two sequences, padded loss layout from target_start=1: row 0 = [5 6 7] scores 7 at column 0 (j=1),
    # row 1 = [5 8 9 4] scores 9, 4 at columns 0, 1
    seqs = [[5, 6, 7], [5, 8, 9, 4]]
    loss_mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    row = pack_rows(seqs, [[0, 1]], loss_mask, target_start=1, share_prefix=False)
    assert row.input_ids.tolist() == [[5, 6, 7, 5, 8, 9, 4]]
    assert row.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    assert row.segment.tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert row.score_pos.tolist() == [1, 4, 5] and row.score_target.tolist() == [7, 9, 4]
    assert row.gather.tolist() == [[0, -1], [1, 2]]


def test_place_scatters_and_sums_shared_gradients():
    values = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    gather = torch.tensor([[0, 0], [1, -1], [2, 0]])
    out = place(values, gather)
    assert out.tolist() == [[1.0, 1.0], [2.0, 0.0], [3.0, 1.0]]
    out.sum().backward()
    assert values.grad.tolist() == [3.0, 1.0, 1.0]  # entry 0 is used three times


def test_plan_chunks_and_split_to_count():
    assert plan_chunks([3, 3, 5, 1, 9, 2], budget=6) == [[0, 1], [2, 3], [4], [5]]
    costs = [4, 4, 4, 4, 9]
    chunks = split_to_count([[0, 1, 2, 3], [4]], costs, 4)
    assert chunks == [[0], [1], [2, 3], [4]] and [u for c in chunks for u in c] == [0, 1, 2, 3, 4]
    assert split_to_count([[0], [1]], costs, 5) == [[0], [1]]  # nothing left to split: caller pads


# ------------------------------------------------------------------------------------------- against the model
@pytest.mark.parametrize("model", ["tiny_llama", "tiny_qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("mode", [PACKED, SHARED], ids=["packed", "shared_prefix"])
def test_logprobs_equal_each_sequence_alone(one_rank_group, request, model, attn, mode):
    """Against each sequence alone through transformers' own sdpa and eager attention."""
    path = request.getfixturevalue(model)
    actor = local_actor(path, **mode)
    share = step_share(synthetic_groups())
    micro = actor._micro_batches(share)
    assert all(mb.packed is not None and mb.packed.n_tokens <= mode["max_tokens_per_micro_batch"] for mb in micro)
    assert (
        sum(mb.packed.n_tokens for mb in micro if mb.packed is not None)
        < int(share.attention_mask.sum()) + (mode is PACKED) * 10**6
    )
    worst, checked = max_logprob_error(actor, micro, plain_model(path, attn))
    assert checked == int(share.loss_mask.sum())
    assert worst < 1e-5


def test_a_causal_only_mask_would_leak_across_sequences(one_rank_group, tiny_llama):
    """The check above is sensitive: one causal span over the packed row (no blocks) changes the logprobs."""
    actor = local_actor(tiny_llama, **PACKED)
    micro = actor._micro_batches(step_share(synthetic_groups()))
    for mb in micro:
        mb.packed.segment.zero_()
    assert max_logprob_error(actor, micro, plain_model(tiny_llama))[0] > 1e-3


@pytest.mark.parametrize("agg", sorted(LOSS_AGG))
@pytest.mark.parametrize("mode", [PACKED, SHARED], ids=["packed", "shared_prefix"])
def test_losses_gradients_and_normalisers_equal_padded(one_rank_group, tiny_llama, agg, mode):
    """Entropy bonus and token-level IS on too, so every per-token path of ``train_micro`` is compared."""
    algo = AlgorithmConfig(group_size=4, entropy_coef=0.01, off_policy="tis")
    share = step_share(synthetic_groups())
    padded = step_loss_and_grads(local_actor(tiny_llama, algo=algo, micro_batch_size=5, **PADDED), share, agg)
    packed = step_loss_and_grads(local_actor(tiny_llama, algo=algo, **mode), share, agg)
    assert padded[2:4] == packed[2:4]  # tokens and LOSS_AGG denominator
    assert abs(padded[0] - packed[0]) < 1e-6 and padded[0] != 0.0
    assert padded[1].keys() == packed[1].keys()
    for name, g in padded[1].items():
        assert (packed[1][name] - g).norm() <= 1e-4 * g.norm() + 1e-12, name


def test_empty_micro_batch_adds_nothing(one_rank_group, tiny_llama):
    """A rank with fewer chunks than its peers runs extra micro-batches: zero loss, zero gradient."""
    actor = local_actor(tiny_llama, **SHARED)
    share = step_share(synthetic_groups())
    mb = empty_micro_batch(share, True)
    actor.model.zero_grad(set_to_none=True)
    stats, _ = actor.policy_step.train_micro(actor.model, mb, None, None, torch.tensor(10.0), 1)
    assert float(stats.loss) == 0.0 and float(mb.loss_mask.sum()) == 0.0
    assert all(float(p.grad.abs().max()) == 0.0 for p in actor.model.parameters() if p.grad is not None)


@pytest.mark.parametrize("mode,units", [(PACKED, 4), (SHARED, 2)], ids=["packed", "shared_prefix"])
def test_micro_batch_count_padded_to_the_busiest_rank(one_rank_group, tiny_llama, monkeypatch, mode, units):
    """Told another rank has 7 chunks, this rank splits its own into its units (rows, or groups with a shared
    prefix) and adds empty micro-batches for the rest, without losing or repeating a loss token."""
    actor = local_actor(tiny_llama, **mode)
    share = step_share(synthetic_groups(n_groups=2, group_size=2))  # 4 rows, 2 groups, 1 chunk
    monkeypatch.setattr(actor, "_all_reduce", lambda value, op=None, dtype=None: torch.tensor(7.0))
    micro = actor._micro_batches(share)
    assert len(micro) == 7
    assert sum(float(mb.loss_mask.sum()) for mb in micro) == float(share.loss_mask.sum())
    assert sum(len(mb) for mb in micro) == 4 + (7 - units)  # one row per empty micro-batch


@pytest.mark.parametrize(
    "overrides,field",
    [
        (["trainer.max_tokens_per_micro_batch=0"], "trainer.shared_prefix"),  # shared_prefix defaults on
        (
            ["trainer.max_tokens_per_micro_batch=-1", "trainer.shared_prefix=false"],
            "trainer.max_tokens_per_micro_batch",
        ),
        (["trainer.dtype=fp16"], "trainer.dtype"),
    ],
)
def test_config_rejects_bad_combinations(overrides, field):
    from relayrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=field):
        load_config("grpo_tiny", overrides)
    assert (
        load_config(
            "grpo_tiny", ["trainer.max_tokens_per_micro_batch=0", "trainer.shared_prefix=false", "trainer.dtype=bf16"]
        ).trainer.dtype
        == "bf16"
    )
