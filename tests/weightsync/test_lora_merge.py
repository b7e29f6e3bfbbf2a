"""LoRA's merged weights, by hand and over a real PEFT model: W + alpha / r * B @ A under the base names.

No FSDP and no Ray here (plain tensors pass through ``materialize_full_tensor`` unchanged); the sharded
path is on the line in ``tests/trainer/test_lora.py`` and ``tests/weightsync/test_lora_engine_sync.py``.
"""

from __future__ import annotations

import pytest
import torch

from relayrl.config import LoraConfig
from relayrl.trainer.lora import merge_stream, merge_weight, scales, wrap
from relayrl.weightsync.lora import MergedLoraSource

W = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # [out=2, in=2]
A = torch.tensor([[1.0, -1.0]])  # [r=1, in=2]
B = torch.tensor([[2.0], [0.5]])  # [out=2, r=1]
# alpha = 4, r = 1: scale 4.  B @ A = [[2, -2], [0.5, -0.5]];  W + 4 B@A = [[9, -6], [5, 2]]
MERGED = torch.tensor([[9.0, -6.0], [5.0, 2.0]])


def test_merge_weight_is_base_plus_scaled_b_a_and_leaves_w_alone():
    w = W.clone()
    assert torch.equal(merge_weight(w, A, B, 4.0 / 1), MERGED)
    assert torch.equal(w, W)


def test_merge_stream_renames_merges_and_keeps_order():
    p = "base_model.model.layer.proj"
    named = [
        ("base_model.model.embed.weight", torch.ones(3)),
        (f"{p}.base_layer.weight", W),
        (f"{p}.base_layer.bias", torch.zeros(2)),
        (f"{p}.lora_A.default.weight", A),
        (f"{p}.lora_B.default.weight", B),
        ("base_model.model.norm.weight", torch.full((2,), 7.0)),
    ]
    out = list(merge_stream(named, {"layer.proj": 4.0}))
    assert [n for n, _ in out] == ["embed.weight", "layer.proj.bias", "layer.proj.weight", "norm.weight"]
    assert torch.equal(dict(out)["layer.proj.weight"], MERGED)
    with pytest.raises(ValueError, match=r"layer\.proj"):
        list(merge_stream(named[:4], {"layer.proj": 4.0}))


@pytest.fixture(scope="module")
def lora_pair(tiny_llama):
    """(the base HF model, the same weights wrapped with r=4 alpha=8 adapters whose B is nonzero)."""
    from transformers import AutoModelForCausalLM

    load = lambda: AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()  # noqa: E731
    peft_model = wrap(load(), LoraConfig(r=4, alpha=8.0))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # PEFT starts B at zero (no change); give the adapters something to merge
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return load(), peft_model.eval()


def test_scale_is_alpha_over_r(lora_pair):
    _, peft_model = lora_pair
    s = scales(peft_model)
    assert len(s) == 2 * 7 and set(s.values()) == {8.0 / 4}  # 2 layers x 7 Llama linears


def test_merged_source_is_the_base_layout_with_the_adapted_model(lora_pair):
    """Names, shapes and order are the base model's (``named_parameters``, what ``ModuleSource`` sends);
    each adapted weight is W + 2 * B @ A; the merged model scores tokens as the PEFT model does; the
    PEFT model's own weights are unchanged by the merge."""
    base, peft_model = lora_pair
    source = MergedLoraSource(peft_model)
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    merged = dict(iter(source))
    base_layout = [(n, tuple(p.shape)) for n, p in base.named_parameters()]
    assert [(m.name, m.shape) for m in source.metadata()] == base_layout
    assert list(merged) == [n for n, _ in base.named_parameters()]
    q = "model.layers.1.self_attn.q_proj"
    mod = peft_model.base_model.model.model.layers[1].self_attn.q_proj
    want = mod.base_layer.weight + 2.0 * mod.lora_B["default"].weight @ mod.lora_A["default"].weight
    assert torch.allclose(merged[f"{q}.weight"], want, atol=1e-6)
    assert not torch.allclose(merged[f"{q}.weight"], base.state_dict()[f"{q}.weight"], atol=1e-3)
    assert torch.equal(merged["model.norm.weight"], base.state_dict()["model.norm.weight"])
    assert all(torch.equal(p, before[n]) for n, p in peft_model.named_parameters())
    base.load_state_dict(merged, strict=False)
    ids = torch.tensor([[1, 40, 41, 42, 43, 44, 45]])
    with torch.no_grad():
        assert torch.allclose(base(input_ids=ids).logits, peft_model(input_ids=ids).logits, atol=1e-5)
