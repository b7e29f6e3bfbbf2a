"""The LM head split by vocabulary over tp ranks (``vocab_parallel.py``): its rows' offsets by hand, and on 2 gloo
ranks in real processes the chunked logprobs, entropies and gradients of the whole head (fp32: rtol 1e-5, atol
1e-6; the split sums round in another order than one logsumexp)."""

from __future__ import annotations

from typing import cast

import pytest
import torch

from bench.ranks import spawn_ranks
from relayrl.trainer import head
from relayrl.trainer.optim import local_tensor
from relayrl.trainer.vocab_parallel import row_offset

RTOL, ATOL = 1e-5, 1e-6
VOCAB, HIDDEN, ROWS, POSITIONS, CHUNK = 11, 6, 2, 5, 3  # 11 rows over 2 ranks: 6 and 5; chunks of 3 of 10


@pytest.mark.parametrize(
    "vocab, ranks, offsets",
    [(10, 3, [0, 4, 8]), (11, 2, [0, 6]), (12, 4, [0, 3, 6, 9]), (49152, 3, [0, 16384, 32768])],
)
def test_row_offsets_follow_torch_chunk(vocab, ranks, offsets):
    """Each rank's first row is where ``torch.chunk`` (DTensor's Shard(0)) starts its rows."""
    starts = [int(part[0]) for part in torch.arange(vocab).chunk(ranks)]
    assert [row_offset(vocab, ranks, r) for r in range(ranks)] == offsets == starts


def _inputs(bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(ROWS, POSITIONS, HIDDEN, generator=g)
    weight = torch.randn(VOCAB, HIDDEN, generator=g)
    b = torch.randn(VOCAB, generator=g) if bias else None
    targets = torch.tensor([[0, 5, 6, 10, 3], [7, 1, 9, 6, 5]])  # rows of both ranks, both sides of the cut
    mix = torch.randn(2, ROWS, POSITIONS, generator=g)  # the loss's weights on logprob and entropy
    return hidden, weight, b, targets, mix


def _scores(hidden, weight, bias, targets, mix) -> dict[str, torch.Tensor]:
    """Logprob, entropy (with its gradient) and their gradients for hidden, weight and bias."""
    hidden = hidden.clone().requires_grad_(True)
    request = head.Request(targets, 0.7, CHUNK, entropy_grad=True)
    logprob, entropy = head.score(hidden, weight, bias, request)
    (mix[0] * logprob + mix[1] * entropy).sum().backward()
    out = {"logprob": logprob.detach(), "entropy": entropy.detach(), "hidden": hidden.grad}
    return out | {"weight": weight.grad, **({"bias": bias.grad} if bias is not None else {})}


def _worker(rank: int, bias: bool, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    hidden, weight, b, targets, mix = _inputs(bias)
    split = [torch.nn.Parameter(distribute_tensor(t, mesh, [Shard(0)])) if t is not None else None for t in (weight, b)]
    got = _scores(hidden, split[0], split[1], targets, mix)
    got = {k: v.to_local() if hasattr(v, "to_local") else v for k, v in got.items()}  # the rank's own rows
    torch.save(got, f"{out}.{rank}")


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_two_tp_ranks_score_what_the_whole_head_scores(tmp_path, bias):
    """Each rank holds its rows of the head (6 and 5 of 11); the chunked logprobs and entropies on both equal the
    whole head's, and so do the hidden states' gradient (summed over the ranks' rows) and each rank's rows of the
    weight's and the bias's gradients."""
    out = str(tmp_path / "scores")
    spawn_ranks(_worker, 2, tmp_path / "store", bias, out)
    hidden, weight, b, targets, mix = _inputs(bias)
    expected = _scores(hidden, torch.nn.Parameter(weight), None if b is None else torch.nn.Parameter(b), targets, mix)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for key in ("logprob", "entropy", "hidden"):
        for got in ranks:
            torch.testing.assert_close(got[key], expected[key], rtol=RTOL, atol=ATOL, msg=key)
    for key in ("weight", "bias") if bias else ("weight",):
        torch.testing.assert_close(torch.cat([got[key] for got in ranks]), expected[key], rtol=RTOL, atol=ATOL, msg=key)
        assert [got[key].shape[0] for got in ranks] == [6, 5]
    assert expected["weight"].abs().min() > 0  # every row's gradient is there to compare: both ranks' rows


class _Ends(torch.nn.Module):
    """The two ends of an LM (what ``tp.split_vocabulary`` splits): an embedding with a padding row, and a head."""

    def __init__(self, tied: bool):
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN, padding_idx=7)  # row 7: rank 1's second row
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        if tied:
            self.head.weight = self.embed.weight
        head.install(self.head)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.embed

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def loss(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logprobs of each next token, a loss on them and the entropies) through the embedding and the head."""
        hidden = torch.tanh(self.embed(ids[:, :-1]))
        request = head.Request(ids[:, 1:], 1.0, CHUNK, entropy_grad=True)
        logprob, entropy = head.head_scores(cast(torch.nn.Module, self.head), hidden, request)
        return logprob.detach(), (logprob * torch.linspace(-1, 1, logprob.shape[-1])).sum() + entropy.sum()


IDS = torch.tensor([[3, 7, 10, 0, 7, 6], [5, 9, 2, 7, 1, 8]])  # both ranks' tokens and the padding row


def _ends_worker(rank: int, tied: bool, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from relayrl.trainer.tp import split_vocabulary

    model = _Ends(tied)
    split_vocabulary(model, init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)))
    logprob, loss = model.loss(IDS)
    loss.backward()
    grads = {n: local_tensor(cast(torch.Tensor, p.grad)) for n, p in model.named_parameters()}
    rows = {n: local_tensor(p).shape[0] for n, p in model.named_parameters()}
    torch.save(
        {"logprob": logprob, "grads": grads, "rows": rows, "tied": model.head.weight is model.embed.weight},
        f"{out}.{rank}",
    )


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_split_vocabulary_trains_the_ends_as_the_whole_ones(tmp_path, tied):
    """``tp.split_vocabulary`` on 2 gloo ranks: each keeps its rows of the embedding and the head (a tied pair
    still one parameter), and the logprobs and each rank's rows of both gradients equal the whole model's (the
    padding row's gradient zero, as ``nn.Embedding`` gives it)."""
    out = str(tmp_path / "ends")
    spawn_ranks(_ends_worker, 2, tmp_path / "store", tied, out)
    whole = _Ends(tied)
    logprob, loss = whole.loss(IDS)
    loss.backward()
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for got in ranks:
        torch.testing.assert_close(got["logprob"], logprob, rtol=RTOL, atol=ATOL)
        assert got["tied"] == tied and set(got["rows"].values()) <= {6, 5}
    for name, p in whole.named_parameters():
        grad = cast(torch.Tensor, p.grad)
        torch.testing.assert_close(
            torch.cat([got["grads"][name] for got in ranks]), grad, rtol=RTOL, atol=ATOL, msg=name
        )
        assert grad.abs().sum() > 0
        if name == "embed.weight" and not tied:
            assert grad[7].abs().max() == 0  # the padding row: no lookup gradient
