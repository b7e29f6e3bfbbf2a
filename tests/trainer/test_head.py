"""The chunked LM head equals the whole-logits computation (fp32, 1e-6), values and gradients, and never
keeps a [K, V] tensor for the backward."""

from __future__ import annotations

import pytest
import torch

from relayrl.algorithms.logprobs import logits_entropy, target_logprobs
from relayrl.trainer import head

K, H, V, TAU = 7, 6, 11, 0.8


def _inputs():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, K, H, generator=g, requires_grad=True)
    weight = torch.randn(V, H, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (1, K), generator=g)
    return hidden, weight, targets


def _dense(hidden, weight, targets):
    logits = hidden @ weight.T  # [1, K, V]
    lp = target_logprobs(logits, targets, TAU)
    z = logits / TAU
    ent = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)  # differentiable
    return lp, ent


@pytest.mark.parametrize("chunk", [1, 3, K, 100])
def test_chunked_scores_and_gradients_equal_the_dense_head(chunk):
    hidden, weight, targets = _inputs()
    lp_d, ent_d = _dense(hidden, weight, targets)
    gd = torch.autograd.grad((lp_d * 2 + ent_d * 0.5).sum(), (hidden, weight))
    lp, ent = head.score(hidden, weight, None, head.Request(targets, TAU, chunk, entropy_grad=True))
    g = torch.autograd.grad((lp * 2 + ent * 0.5).sum(), (hidden, weight))
    torch.testing.assert_close(lp, lp_d, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, ent_d, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent.detach(), logits_entropy(hidden @ weight.T, TAU), atol=1e-6, rtol=0)
    for a, b in zip(g, gd):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_entropy_without_grad_is_a_statistic_only():
    hidden, weight, targets = _inputs()
    lp_d, _ = _dense(hidden, weight, targets)
    gd = torch.autograd.grad(lp_d.sum(), (hidden, weight))
    lp, ent = head.score(hidden, weight, None, head.Request(targets, TAU, 2))
    assert not ent.requires_grad
    for a, b in zip(torch.autograd.grad(lp.sum(), (hidden, weight)), gd):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_no_tensor_of_k_by_v_is_kept_for_the_backward():
    """Structural: every tensor autograd saves in the forward is under [K, V] (the chunk's logits are
    recomputed in the backward); the dense head saves several that size."""
    hidden, weight, targets = _inputs()
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        head.score(hidden, weight, None, head.Request(targets, TAU, 2))
    assert saved and max(saved) < K * V
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _dense(hidden, weight, targets)
    assert max(saved) >= K * V  # the check would see the logits


def test_the_head_scores_inside_the_model_forward(tiny_llama):
    """``ScoringHead`` under ``scoring``: the model's forward returns (logprob, entropy) of the targets at
    the kept positions, equal to its full logits; without a request it is the plain head again."""
    from tests.trainer.test_packing import plain_model

    model, ref = plain_model(tiny_llama), plain_model(tiny_llama)
    head.install(model.get_output_embeddings())
    ids = torch.tensor([[5, 9, 3, 7, 8, 2]])
    keep = torch.arange(1, 5)
    with torch.no_grad():
        logits = ref(input_ids=ids).logits[:, 1:5]
        with head.scoring(model, head.Request(ids[:, 2:6], TAU, 3)):
            out = model(input_ids=ids, logits_to_keep=keep).logits
        plain = model(input_ids=ids).logits
    torch.testing.assert_close(out[..., 0], target_logprobs(logits, ids[:, 2:6], TAU), atol=1e-6, rtol=0)
    torch.testing.assert_close(out[..., 1], logits_entropy(logits, TAU), atol=1e-6, rtol=0)
    torch.testing.assert_close(plain, ref(input_ids=ids).logits, atol=0, rtol=0)


def test_bad_chunk_and_a_head_that_is_not_linear():
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match=r"trainer\.logits_chunk"):
        head.score(hidden, weight, None, head.Request(targets, TAU, 0))
    with pytest.raises(ValueError, match=r"nn\.Linear"):
        head.install(torch.nn.Embedding(3, 2))


def test_lora_on_the_head_scores_with_the_adapted_weight(tiny_qwen2):
    """LoRA on lm_head (PEFT wraps the ScoringHead): scoring equals the adapted model's full logits, with
    the adapters' gradients; with adapters off it is the base head's. Regression: the scoring forward once
    refused a LoRA-wrapped head."""
    from relayrl.config import LoraConfig
    from relayrl.trainer import lora
    from tests.trainer.test_packing import plain_model

    model = plain_model(tiny_qwen2)
    head.install(model.get_output_embeddings())
    model = lora.wrap(model, LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)  # B starts at 0; non-zero so the adapters matter
    ids = torch.tensor([[5, 9, 3, 7, 8, 2]])
    keep, targets = torch.arange(0, 5), ids[:, 1:6]
    b_head = next(p for n, p in model.named_parameters() if "lm_head.lora_B" in n)

    dense = target_logprobs(model(input_ids=ids).logits[:, :5], targets, TAU)
    g_dense = torch.autograd.grad(dense.sum(), b_head)[0]
    with head.scoring(model, head.Request(targets, TAU, 2)):
        out = model(input_ids=ids, logits_to_keep=keep).logits
    g = torch.autograd.grad(out[..., 0].sum(), b_head)[0]
    torch.testing.assert_close(out[..., 0], dense, atol=1e-6, rtol=0)
    torch.testing.assert_close(g, g_dense, atol=1e-6, rtol=1e-6)
    assert g.abs().sum() > 0
    with torch.no_grad(), lora.adapters_off(model):
        base = target_logprobs(model(input_ids=ids).logits[:, :5], targets, TAU)
        with head.scoring(model, head.Request(targets, TAU, 2)):
            off = model(input_ids=ids, logits_to_keep=keep).logits[..., 0]
    torch.testing.assert_close(off, base, atol=1e-6, rtol=0)
    assert not torch.allclose(base, dense)
