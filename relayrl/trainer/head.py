"""The LM head evaluated in chunks: per-token logprobs and entropies without ever holding [N, V] logits.

The loss needs, at each scored position, ``log softmax(z / tau)[target]`` and (for the entropy bonus or
its statistic) ``H = logsumexp(z / tau) - sum_v p_v z_v / tau``, with ``z = W h + b`` over a vocabulary
of V (49k for SmolLM2, 152k for Qwen). Materialising z costs ``K x V x 4`` bytes for K positions, several
times over (the scaled copy, the softmax, their gradients): at 8k tokens and V = 49k that is 1.6 GB a copy.

``score`` computes them ``chunk`` positions at a time; with gradients on, each chunk runs under torch's
activation checkpoint (``torch.utils.checkpoint``), so autograd keeps only the chunk's hidden states and
recomputes its [chunk, V] logits in the backward. Memory: O(chunk x V) for logits, O(K) for the outputs;
time: one extra head matmul per chunk. Exact: the same float32 arithmetic per position as the whole-batch
computation (``algorithms/logprobs.py``), checked in ``tests/trainer/test_head.py``.

``ScoringHead`` puts this inside the model's own forward: it is the model's ``lm_head`` (its class swapped
in place, so the parameter names and a tied embedding stay as they are), and while ``scoring(head, ...)``
is active it returns ``[..., 2]`` = (logprob, entropy) of the given targets instead of logits. Running in
the model's forward keeps FSDP2's gather of the root's parameters (a tied lm_head lives there) and its
gradient reduce exactly as they are for any module.

Under tensor parallelism the head is split by vocabulary rows (``tp.split_vocabulary``); each chunk's
statistics then come from the rank's own rows and all-reduces of a float a position
(``vocab_parallel.py``), so a rank holds, computes and keeps V / t of the head.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard
from torch.utils.checkpoint import checkpoint

from relayrl.trainer import vocab_parallel


@dataclass(frozen=True)
class Request:
    """What a scoring forward asks of the head: the targets of the positions it is given, and how."""

    targets: torch.Tensor  # [R, K] the token each kept position scores
    temperature: float
    chunk: int
    entropy_grad: bool = False
    """Whether the entropy needs a gradient (an entropy bonus in the loss); else it is a statistic."""


def _chunk_stats(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, tau: float, ent: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob [c], entropy [c]) of ``c`` positions: hidden [c, H], weight [V, H], targets [c]."""
    z = F.linear(hidden.float(), weight.float(), None if bias is None else bias.float()) / tau  # [c, V]
    lse = torch.logsumexp(z, dim=-1)
    logprob = z.gather(-1, targets[:, None])[:, 0] - lse
    with torch.set_grad_enabled(ent and torch.is_grad_enabled()):
        zs = z if ent else z.detach()
        entropy = lse if ent else lse.detach()
        entropy = entropy - (torch.softmax(zs, dim=-1) * zs).sum(-1)
    return logprob, entropy


def score(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, request: Request
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob, entropy), each shaped like ``request.targets`` [R, K], from hidden [R, K, H]."""
    if request.chunk <= 0:
        raise ValueError(f"trainer.logits_chunk={request.chunk} must be > 0; set e.g. trainer.logits_chunk=1024")
    if request.temperature <= 0:
        raise ValueError(f"temperature={request.temperature} must be > 0 (it divides the logits)")
    shape = request.targets.shape
    if hidden.shape[:-1] != shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be [R, K, H] with [R, K] = targets {tuple(shape)}")
    flat, targets = hidden.reshape(-1, hidden.shape[-1]), request.targets.reshape(-1)
    stats, args = _stats_of(weight, bias)
    tail = (request.temperature, request.entropy_grad)
    lps, ents = [], []
    for s in range(0, flat.shape[0], request.chunk):
        h, t = flat[s : s + request.chunk], targets[s : s + request.chunk]
        if torch.is_grad_enabled():
            lp, ent = checkpoint(stats, h, *args, t, *tail, use_reentrant=False)
        else:
            lp, ent = stats(h, *args, t, *tail)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps).view(shape), torch.cat(ents).view(shape)


def _stats_of(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """(a chunk's statistics, its weight and bias): ``_chunk_stats`` of a whole head, or of a head split by
    vocabulary rows over tensor-parallel ranks (a ``Shard(0)`` DTensor, ``tp.split_vocabulary``) its local rows'
    vocab-parallel statistics (``vocab_parallel.chunk_stats``)."""
    if not isinstance(weight, DTensor):
        return _chunk_stats, (weight, bias)
    mesh = weight.device_mesh
    if mesh.ndim != 1 or tuple(weight.placements) != (Shard(0),):
        raise ValueError(f"a DTensor LM head must be split by vocabulary rows over tp, got {weight.placements}")
    offset = vocab_parallel.row_offset(weight.shape[0], mesh.size(), mesh.get_local_rank())
    stats = functools.partial(vocab_parallel.chunk_stats, group=mesh.get_group(), offset=offset)
    return stats, (weight.to_local(), bias.to_local() if isinstance(bias, DTensor) else bias)


class ScoringHead(torch.nn.Linear):
    """An ``nn.Linear`` LM head that scores targets while a ``Request`` is set (module docstring)."""

    request: Request | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.request is not None:
            return self.scores(hidden, self.weight)
        if isinstance(self.weight, DTensor):  # split by vocabulary (tp): each rank's logits, gathered
            bias = self.bias.to_local() if isinstance(self.bias, DTensor) else self.bias
            local = torch.nn.functional.linear(hidden, self.weight.to_local(), bias)
            return DTensor.from_local(local, self.weight.device_mesh, [Shard(-1)]).full_tensor()
        return super().forward(hidden)

    def scores(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """[R, K, 2] = (logprob, entropy) of the request's targets with ``weight`` as the projection: the
        head's own, or with LoRA on the head its merged ``W + scale B A`` (``lora.ScoringLoraHead``)."""
        assert self.request is not None, "scores is called only while a request is set (scoring)"
        logprob, entropy = score(hidden, weight, self.bias, self.request)
        return torch.stack([logprob, entropy], dim=-1)


def head_scores(head: torch.nn.Module, hidden: torch.Tensor, request: Request) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob, entropy) [R, K] of ``request``'s targets from hidden [R, K, H], through the ``ScoringHead``
    module's own forward: its hooks run as for any module (FSDP2 gathers a sharded head before and reduces its
    gradient after; ``keep_head_fp32`` keeps it float32 under autocast)."""
    if not isinstance(head, ScoringHead):
        raise ValueError(f"head_scores needs a ScoringHead (head.install), got {type(head).__name__}")
    with _requesting(head, request):
        out = head(hidden)
    return out[..., 0].contiguous(), out[..., 1].contiguous()  # contiguous: callers send them (dist.broadcast)


def install(head: torch.nn.Module) -> ScoringHead:
    """Make ``head`` (the model's ``nn.Linear`` lm_head) a ``ScoringHead`` in place; returns it."""
    if type(head) is not torch.nn.Linear and not isinstance(head, ScoringHead):
        raise ValueError(
            f"the chunked LM head needs an nn.Linear lm_head, the model has {type(head).__name__}; "
            "relayrl trains HF causal LMs with a linear output projection"
        )
    head.__class__ = ScoringHead
    return head  # type: ignore[return-value]  # its class is ScoringHead now


def lm_head(model: torch.nn.Module) -> torch.nn.Module:
    """An HF model's output projection (``get_output_embeddings``; torch types module attributes loosely)."""
    return cast(Any, model).get_output_embeddings()


def scoring_head(model: torch.nn.Module) -> ScoringHead:
    """``model``'s ``ScoringHead``: its lm_head, or the base layer of a LoRA layer wrapped around it."""
    found = lm_head(model)
    found = getattr(found, "base_layer", found)
    if not isinstance(found, ScoringHead):
        raise ValueError("the model's lm_head is not a ScoringHead; load it with head.install (hf.load_sharded)")
    return found


@contextlib.contextmanager
def scoring(model: torch.nn.Module, request: Request) -> Iterator[None]:
    """While active, ``model``'s forward returns ``logits`` [R, K, 2] = (logprob, entropy) of
    ``request.targets`` at the positions it keeps (``logits_to_keep``)."""
    with _requesting(scoring_head(model), request):
        yield


@contextlib.contextmanager
def _requesting(head: ScoringHead, request: Request) -> Iterator[None]:
    """``head`` scores ``request`` while active."""
    head.request = request
    try:
        yield
    finally:
        head.request = None
