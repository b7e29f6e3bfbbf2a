"""Prompt datasets: built-in generated tasks and local files, plus the sampler that batches them.

Rows are plain dicts with at least ``question`` and ``answer`` (strings); every key of a row is passed
to reward functions as a column (TRL's convention: ``fn(prompts, completions, **columns)``).
"""

from __future__ import annotations

from typing import Any

from relayrl.config import DataConfig
from relayrl.data.arith import ARITH_QUESTION, make_arith_rows
from relayrl.data.jsonl import JsonlError, load_jsonl
from relayrl.data.sampler import PromptSampler, chat_formatter

__all__ = ["ARITH_QUESTION", "JsonlError", "PromptSampler", "chat_formatter", "load_jsonl", "load_task",
           "make_arith_rows"]


def load_task(data_cfg: DataConfig) -> list[dict[str, Any]]:
    """The rows for ``data_cfg.task``: ``arith`` generates them, ``jsonl`` reads ``data_cfg.path``."""
    if data_cfg.task == "arith":
        return make_arith_rows(data_cfg.num_prompts, data_cfg.max_operand, data_cfg.seed)
    if data_cfg.task == "jsonl":
        if not data_cfg.path:
            raise ValueError("data.task=jsonl needs data.path; set data.path=/path/to/train.jsonl")
        return load_jsonl(data_cfg.path)
    raise ValueError(f"data.task={data_cfg.task!r} is not supported; use arith or jsonl")
