"""Pipeline stages (``trainer/pipeline.py``): the split by hand, then 2 gloo ranks in real processes running
torch's GPipe, 1F1B and interleaved 1F1B schedules, whose gradients equal one process's full-model backward
of the same RL loss (fp32), with a tied and an untied LM head."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch
import torch.distributed as dist

from bench.ranks import spawn_ranks
from relayrl.algorithms.objective import build_loss
from relayrl.config import AlgorithmConfig
from relayrl.trainer import head, pipeline
from relayrl.trainer.pipeline import Pipeline, build_stages, stage_ids, stage_layers, targets

ROWS, LENGTH, MICRO = 8, 12, 4
LR, CLIP = 1e-3, 0.05
PARAM_ATOL = 3e-5
"""Weights after 2 AdamW steps at lr 1e-3: Adam scales a near-zero gradient's float noise up to an update of
order lr, so weights differ by ~1e-5 where gradients agree to 1e-6 (as in ``test_tp``); a wrong split moves
them by ~lr."""
CASES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)]


def test_stage_layers_and_ids_by_hand():
    assert stage_layers(8, 4) == [range(2), range(2, 4), range(4, 6), range(6, 8)]
    assert stage_ids(1, 2, 2) == [1, 3] and stage_ids(0, 4) == [0]
    with pytest.raises(ValueError, match="6 layers do not split into 4 pipeline stages"):
        stage_layers(6, 4)


def test_targets_by_hand():
    """Position t predicts token t + 1; the last position predicts nothing (id 0, mask 0); the engine's
    and the reference's logprobs default to the old ones."""
    ids = torch.tensor([[5, 6, 7]])
    out = targets(ids, torch.tensor([[1.0, 2.0]]), torch.tensor([[-1.0, -2.0]]), torch.tensor([[1.0, 0.0]]))
    assert out.tolist() == [[[6, 1, -1, 1, -1, -1], [7, 2, -2, 0, -2, -2], [0, 0, 0, 0, 0, 0]]]


def _model(tied: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).float()
    head.install(model.get_output_embeddings())  # the loss runs the head's own forward (load_stages installs it)
    return model


def _batch() -> tuple[torch.Tensor, ...]:
    """Right-padded rows: row i has 12 - (i % 3) tokens (its padding is masked), random advantages and old
    logprobs near log(1/64) so that some ratios clip."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (ROWS, LENGTH), generator=g)
    mask = torch.ones(ROWS, LENGTH - 1)
    for i in range(ROWS):
        if i % 3:
            ids[i, LENGTH - i % 3 :] = 0
            mask[i, LENGTH - 1 - i % 3 :] = 0
    mask[:, :3] = 0  # the prompt
    advantages = torch.randn(ROWS, 1, generator=g).expand(ROWS, LENGTH - 1).contiguous()
    old = -4.2 + 0.3 * torch.randn(ROWS, LENGTH - 1, generator=g)
    return ids, advantages, old, mask


def _loss_parts():
    objective = build_loss(AlgorithmConfig())
    mask = _batch()[-1]
    _, denominator = objective.aggregate(torch.zeros_like(mask), mask)
    return objective, denominator


def _worker(rank: int, tied: bool, out: str) -> None:
    model = _model(tied)
    ids, advantages, old, mask = _batch()
    objective, denominator = _loss_parts()
    results = {}
    for schedule, virtual in CASES:
        model.zero_grad(set_to_none=True)
        loss = pipeline.rl_loss(objective, 1.0, 5, denominator)
        world = dist.group.WORLD
        assert world is not None
        pipe = Pipeline(model, world, loss, MICRO, schedule, virtual)
        total = pipe.step(ids, targets(ids, advantages, old, mask))
        grads = {name: p.grad.clone() for name, p in pipe.named_parameters() if p.grad is not None}
        results[schedule] = (grads, total)
    results["train"] = _train_two_steps(_model(tied), objective, denominator)
    torch.save(results, f"{out}.{rank}")


def _train_two_steps(model: torch.nn.Module, objective, denominator) -> tuple:
    """Two 1F1B steps with AdamW and clipping; (this rank's weights, the pre-clip norms, logprobs after)."""
    world = dist.group.WORLD
    assert world is not None
    ids, advantages, old, mask = _batch()
    pipe = Pipeline(model, world, pipeline.rl_loss(objective, 1.0, 5, denominator), MICRO, "1f1b")
    optimizer = torch.optim.AdamW([p for _, p in pipe.named_parameters()], lr=LR)
    norms = []
    for _ in range(2):
        pipe.step(ids, targets(ids, advantages, old, mask))
        norms.append(pipe.clip_and_step(optimizer, CLIP))
    weights = {name: p.detach().clone() for name, p in pipe.named_parameters()}
    return weights, norms, pipe.logprobs(ids, 1.0, 5)


def _full_loss(model: torch.nn.Module, objective, denominator) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-position logprobs) from HF's own forward of the whole model and batch."""
    ids, advantages, old, mask = _batch()
    logits = model(input_ids=ids).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    per_token, _ = objective.policy_loss(logprobs, old, advantages, mask)
    numerator, _ = objective.aggregate(per_token, mask)
    return numerator / denominator, logprobs


def _oracle_training(tied: bool) -> tuple[dict[str, torch.Tensor], list[float], torch.Tensor]:
    model = _model(tied)
    objective, denominator = _loss_parts()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    norms = []
    for _ in range(2):
        _full_loss(model, objective, denominator)[0].backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        logprobs = _full_loss(model, objective, denominator)[1]
    return {n: p.detach() for n, p in model.named_parameters()}, norms, logprobs


def _oracle(tied: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The same loss from HF's own forward of the whole model, the whole batch at once, in this process."""
    model = _model(tied)
    objective, denominator = _loss_parts()
    loss = _full_loss(model, objective, denominator)[0]
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, loss.detach()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_two_pipeline_ranks_train_what_one_process_trains(tmp_path, tied):
    """Every parameter's gradient on the rank(s) holding it equals the full model's, for each schedule; the
    last stage's loss is the full batch's. Tied: both ends' copies of the embedding hold the summed grad."""
    out = str(tmp_path / "grads")
    spawn_ranks(_worker, 2, tmp_path / "store", tied, out)
    expected, loss = _oracle(tied)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for schedule, _ in CASES:
        seen: set[str] = set()
        for rank in ranks:
            grads, total = rank[schedule]
            for name, grad in grads.items():
                torch.testing.assert_close(grad, expected[name], rtol=1e-5, atol=1e-7, msg=f"{schedule} {name}")
                seen.add(name)
            if total is not None:
                torch.testing.assert_close(total, loss, rtol=1e-5, atol=1e-7)
        assert seen == set(expected), (schedule, set(expected) - seen)
    assert ranks[0]["1f1b"][1] is None and ranks[1]["1f1b"][1] is not None
    weights, norms, logprobs = _oracle_training(tied)
    assert norms[0] > CLIP  # the clip acted
    start = dict(_model(tied).named_parameters())
    assert max((weights[n] - start[n]).abs().max().item() for n in weights) > 10 * PARAM_ATOL  # they moved
    for rank in ranks:
        got, got_norms, _ = rank["train"]
        assert got_norms == pytest.approx(norms, rel=1e-5)
        for name, w in got.items():
            torch.testing.assert_close(w, weights[name], rtol=0, atol=PARAM_ATOL, msg=f"after 2 steps: {name}")
    assert set(ranks[0]["train"][0]) | set(ranks[1]["train"][0]) == set(weights)
    assert ranks[0]["train"][2] is None
    torch.testing.assert_close(ranks[1]["train"][2], logprobs, rtol=1e-5, atol=1e-6)


def test_build_stages_cover_every_parameter_once_by_its_model_name():
    model = _model(tied=False)
    names = [
        stage.global_name(n)
        for r in range(2)
        for stage in build_stages(model, r, 2, 2)
        for n, _ in stage.named_parameters()
    ]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())


def test_a_model_without_causal_maskless_attention_is_refused():
    model = _model(tied=False)
    cast(Any, model).set_attn_implementation("eager")
    with pytest.raises(ValueError, match="pipeline stages need causal attention without a mask"):
        build_stages(model, 0, 2)


@pytest.mark.parametrize(
    "rows, shards, expected", [(10, 4, [3, 3, 3, 1]), (9, 4, [3, 3, 3, 0]), (2, 4, [1, 1, 0, 0]), (8, 2, [4, 4])]
)
def test_shard_rows_are_fsdp2s_dim0_split(rows, shards, expected):
    """A middle stage's zeros for the tied gradient match the ends' FSDP2 shard of its dp replica: torch.chunk's
    split, the trailing shards empty."""
    assert [pipeline.shard_rows(rows, shards, i) for i in range(shards)] == expected
    chunks = torch.arange(rows).chunk(shards)
    assert expected == [len(chunks[i]) if i < len(chunks) else 0 for i in range(shards)]
