"""Deterministic, resumable prompt batches.

Rows are visited in a seeded random order that changes every epoch; batches run straight across
epoch boundaries (a step never comes up short). Each prompt gets
``prompt_id = epoch * len(rows) + row_index``, unique for the whole run, so trajectories, groups and
logged samples can be traced back to their row and epoch. The cursor ``(epoch, position)`` is the
whole state: ``state_dict()`` / ``load_state_dict()`` resume exactly where a run stopped.

Each prompt also carries ``seed = prompt_seed(sampling_seed, prompt_id)``: the rollout seeds its requests
from it (sample ``i`` with ``seed + i``), so what a prompt's completions are depends on the run's seed,
the prompt and the weights only - not on which engine, batch or restart served it - and a resumed run
samples what the uninterrupted one did.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Prompt:
    """One prompt a generate call turns into a ``TrajectoryGroup`` (travels to rollout actors pickled).

    Kept here, torch-free, beside the sampler that makes it (``relayrl.types`` holds the torch records).
    """

    prompt_id: int  # epoch * rows + row index: unique for the run
    prompt: str  # the text sent to the engine (after the chat template)
    columns: dict[str, Any] = field(default_factory=dict)
    """The dataset row (``question``, ``answer``, task fields such as countdown's ``nums``/``target``):
    reward functions receive each column as a keyword argument, environments as ``reset``'s sample."""
    seed: int | None = None  # sample i is seeded seed + i (``prompt_seed``); None: unseeded
    temperature: float | None = None  # overrides rollout.temperature (0: greedy, evaluation uses it)

    def to_json(self) -> dict[str, Any]:
        """The dict a checkpoint's ``driver.json`` holds in ``pending``; ``temperature`` only when set."""
        out = {"prompt_id": self.prompt_id, "prompt": self.prompt, "columns": self.columns, "seed": self.seed}
        return out if self.temperature is None else {**out, "temperature": self.temperature}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Prompt:
        return cls(**d)


PromptBatch = list[Prompt]

SEED_BITS = 62
"""Prompt seeds lie in [0, 2**62): sample indices added to them stay within torch's 64-bit seed range."""


def prompt_seed(sampling_seed: int, prompt_id: int) -> int:
    """The base sampling seed of one prompt: a hash of (run seed, prompt id), so neighbouring prompts'
    seed ranges ``[base, base + G)`` do not overlap (``seed + prompt_id`` would share seeds)."""
    digest = hashlib.sha256(f"relayrl-request/{sampling_seed}/{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % 2**SEED_BITS


def prompt_text(question: str | list[dict[str, str]]) -> str:
    """A prompt as one string (a chat messages list as its JSON): the key that compares, dedups and
    ranks prompts by length."""
    return question if isinstance(question, str) else json.dumps(question, sort_keys=True)


def _identity(text: str) -> str:
    return text


class PromptSampler:
    """Yields batches of ``batch_size`` formatted prompts, forever, in a seeded per-epoch order."""

    def __init__(
        self,
        rows: list[dict[str, Any]],
        batch_size: int,
        seed: int,
        format_prompt: Callable[[str], str] = _identity,
        sampling_seed: int | None = None,
    ):
        """``seed`` orders the rows; ``sampling_seed`` (default: ``seed``) seeds the completions (the run's
        seed belongs here, so that another run seed samples differently on the same data)."""
        if not rows:
            raise ValueError("PromptSampler got no rows; check the data config (data.task / data.path)")
        if batch_size <= 0:
            raise ValueError(f"PromptSampler batch_size={batch_size} must be > 0; set run.prompts_per_step>0")
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.format_prompt = format_prompt
        self.sampling_seed = seed if sampling_seed is None else sampling_seed
        self.epoch, self.position = 0, 0
        self._order_epoch = -1
        self._order: list[int] = []

    def _epoch_order(self) -> list[int]:
        """Row indexes of the current epoch: a permutation seeded by ``(seed, epoch)`` only."""
        if self._order_epoch != self.epoch:
            self._order = list(range(len(self.rows)))
            random.Random(f"relayrl-sampler/{self.seed}/{self.epoch}").shuffle(self._order)
            self._order_epoch = self.epoch
        return self._order

    def next_batch(self) -> PromptBatch:
        """The next ``batch_size`` prompts; advances the cursor (into the next epoch when needed)."""
        batch = []
        for _ in range(self.batch_size):
            index = self._epoch_order()[self.position]
            row = self.rows[index]
            prompt_id = self.epoch * len(self.rows) + index
            batch.append(
                Prompt(
                    prompt_id,
                    self.format_prompt(row["question"]),
                    dict(row),
                    prompt_seed(self.sampling_seed, prompt_id),
                )
            )
            self.position += 1
            if self.position == len(self.rows):
                self.epoch, self.position = self.epoch + 1, 0
        return batch

    def __iter__(self) -> Iterator[PromptBatch]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        """The cursor plus what it is only valid for (seed and dataset size)."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_rows": len(self.rows)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore a cursor saved by ``state_dict``; refuse one taken with other data or another seed."""
        for key, mine in (("seed", self.seed), ("num_rows", len(self.rows))):
            if state[key] != mine:
                raise ValueError(
                    f"sampler state has {key}={state[key]} but this sampler has {key}={mine}; "
                    "resume with the same data config and seed, or start a fresh run"
                )
        if not 0 <= state["position"] < len(self.rows) or state["epoch"] < 0:
            raise ValueError(
                f"sampler state epoch={state['epoch']} position={state['position']} is out of "
                f"range for {len(self.rows)} rows; the state file is corrupt, start a fresh run"
            )
        self.epoch, self.position = state["epoch"], state["position"]


def chat_formatter(tokenizer: Any, use_chat_template: bool) -> Callable[[Any], str]:
    """``format_prompt`` for ``PromptSampler``: wrap the question as one user turn of the chat template
    (a chat ``messages`` list, from ``data.task=hf``, is formatted as it is).

    ``add_generation_prompt=True`` appends the assistant header, so the model answers instead of
    continuing the user's text. With ``use_chat_template=False`` the question is sent as it is.
    """
    if not use_chat_template:
        return _identity
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; "
            "set data.chat_template=false to send raw questions"
        )

    def format_prompt(question: str | list[dict[str, str]]) -> str:
        messages = [{"role": "user", "content": question}] if isinstance(question, str) else question
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    return format_prompt
