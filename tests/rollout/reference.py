"""Reference logprobs from transformers, to check what the vLLM engine reports."""

from __future__ import annotations

from pathlib import Path

import torch


def perturbed(model_dir: Path, scale: float, seed: int) -> dict[str, torch.Tensor]:
    """The model's checkpoint tensors, each plus N(0, scale^2) noise (a stand-in for a train step)."""
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed)
    return {
        k: v + scale * torch.randn(v.shape, generator=g, dtype=v.dtype)
        for k, v in load_file(str(Path(model_dir) / "model.safetensors")).items()
    }


def hf_logprobs(
    model_dir: Path, token_ids: list[int], state_dict: dict[str, torch.Tensor] | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """``[T-1]``: log softmax(logits / temperature)[token_i] given tokens_<i, in float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    if state_dict is not None:
        _, unexpected = model.load_state_dict(state_dict, strict=False)
        assert not unexpected, unexpected
        model.tie_weights()
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float() / temperature  # [T-1, V]
    return logits.log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
