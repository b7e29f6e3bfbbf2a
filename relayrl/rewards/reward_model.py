"""Reward from a learned model: an HF sequence-classification model served by one Ray actor.

``RewardModel(path)`` is a reward function (TRL signature, ``async``): it sends ``prompt + completion``
texts to a ``RewardModelServer`` actor, which tokenizes them in batches, runs the model once per batch
and returns one score per text:

    num_labels == 1   score = logits[0]                       (a scalar reward head, e.g. Skywork-RM)
    num_labels  > 1   score = softmax(logits)[label]          (a classifier; ``label`` = the "good" class)

The score is read at the last real token of each text (transformers' sequence-classification heads find
it from ``pad_token_id``), so padding in a batch does not change it. One server per model path is
shared by every reward worker (a named actor); the scorer starts it once (``start``) and owns it.

In a recipe: ``rewards: [{fn: reward_model, kwargs: {path: /models/my-rm}}]``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


class RewardModelServer:
    """Ray actor holding the model; ``score(texts) -> [score]`` in batches of ``batch_size``."""

    def __init__(self, path: str, batch_size: int, max_length: int | None, label: int, num_threads: int) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if num_threads:
            torch.set_num_threads(num_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.max_length, self.label = batch_size, max_length, label

    def ready(self) -> int:
        return int(self.model.config.num_labels)

    def score(self, texts: list[str]) -> list[float]:
        import torch

        scores: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[i : i + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=self.max_length is not None,
                max_length=self.max_length,
            )
            with torch.inference_mode():
                logits = self.model(**enc).logits.float()  # [b, num_labels]
            col = logits[:, 0] if logits.shape[1] == 1 else logits.softmax(-1)[:, self.label]
            scores.extend(col.tolist())
        return scores


class RewardModel:
    """Reward function backed by a ``RewardModelServer``; construct it with the model directory."""

    def __init__(
        self,
        path: str,
        batch_size: int = 16,
        max_length: int | None = None,
        label: int = 1,
        num_cpus: float = 0.0,
        num_threads: int = 0,
    ) -> None:
        if not (Path(path) / "config.json").is_file():
            raise ValueError(
                f"reward_model path={path!r} is not a local HF model directory (no config.json); "
                "point kwargs.path at a saved AutoModelForSequenceClassification"
            )
        self.path = str(Path(path).resolve())
        self.options = dict(batch_size=batch_size, max_length=max_length, label=label, num_threads=num_threads)
        self.num_cpus = num_cpus
        self.server: Any = None
        self.__name__ = "reward_model"

    def start(self) -> None:
        """Start the shared server for this path (or join the running one) and wait until it has loaded."""
        import ray

        name = "relayrl-reward-model-" + hashlib.sha1(self.path.encode()).hexdigest()[:12]
        self.server = (
            ray.remote(RewardModelServer)
            .options(name=name, get_if_exists=True, num_cpus=self.num_cpus)
            .remote(self.path, **self.options)
        )
        ray.get(self.server.ready.remote())

    async def __call__(self, prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        if self.server is None:
            self.start()
        return await self.server.score.remote([p + c for p, c in zip(prompts, completions, strict=True)])
