"""vLLM's outputs read once: a finished ``CompletionOutput`` -> ``ModelTurn`` (tokens, sampled-token
logprobs, text, finish reason, weight-version spans). The single-turn actor and the multi-turn episode
runner both build their records from this, so vLLM's output format is known in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relayrl.types import VersionSpan

INITIAL_VERSION_LABEL = "default"  # vLLM's label for the weights an engine started with (our v0)


@dataclass
class ModelTurn:
    """One model turn as the engine returned it; ``versions`` are relative to the turn's first token."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    versions: list[VersionSpan]


def parse_version(label: str) -> int:
    """vLLM weight-version label -> policy version (``"default"`` is the initial model, v0)."""
    return 0 if label == INITIAL_VERSION_LABEL else int(label)


def model_turn(completion: Any) -> ModelTurn:
    """A finished vLLM ``CompletionOutput`` -> ``ModelTurn``. Every sampled token must be covered by a
    version span: vLLM >= 0.32 reports them (``CompletionOutput.weight_versions``)."""
    tokens = list(completion.token_ids)
    spans = [VersionSpan(parse_version(s.version), s.start, s.end) for s in completion.weight_versions or []]
    if tokens and not spans:
        raise RuntimeError(
            "vLLM reported no weight_versions for a finished completion; "
            "relayrl needs vLLM>=0.32 (CompletionOutput.weight_versions)"
        )
    logprobs = [pos[tok].logprob for tok, pos in zip(tokens, completion.logprobs)]
    return ModelTurn(
        token_ids=tokens,
        logprobs=logprobs,
        text=completion.text,
        finish_reason=completion.finish_reason or "length",
        versions=spans,
    )
