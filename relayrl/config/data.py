"""The ``data`` section: where prompts come from (a generated task or a local dataset) and how they
are split."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, get_args

from relayrl.config.base import ConfigError, one_of

FileTask = Literal["jsonl", "hf"]
GeneratedTask = Literal["arith", "multiply", "countdown", "wordproblem", "facts", "count"]
Task = Literal[GeneratedTask, FileTask]
"""Values of ``data.task``, a ``str`` field checked against them (``base`` says why)."""

FILE_TASKS: tuple[str, ...] = get_args(FileTask)
"""``data.task`` values that read a local dataset (``data.path``); the others generate their rows."""
OPS_TASKS: tuple[str, ...] = ("countdown", "wordproblem")
"""Generated tasks whose problems take a number of operations (``data.ops``)."""
GENERATED_TASKS: tuple[str, ...] = get_args(GeneratedTask)
"""``data.task`` values whose rows are generated, seeded, from ``num_prompts``/``max_operand``/``seed``."""


@dataclass
class DataConfig:
    task: str = "arith"
    """Prompt source: generated ``arith`` (addition), ``multiply`` (products, the calculator agent's task),
    ``countdown`` (TinyZero's: reach a target with + - * /), ``wordproblem`` (2-4 step word problems,
    ``<think>/<answer>`` format), ``facts`` (questions about fictional towns, the retrieval agent's task),
    ``count`` (count from 1 to N: long completions, ``recipes/grpo_count.yaml``); or a local file: ``jsonl``
    (GSM8K-style rows) | ``hf`` (json/jsonl/parquet/csv or a save_to_disk directory through HF ``datasets``,
    never the hub; see ``data/files.py``)."""
    path: str | None = None
    """The local dataset of a file task (``jsonl``: a .jsonl file; ``hf``: a file or a save_to_disk dir)."""
    prompt_key: str = "question"
    """``hf`` only: the column holding the prompt, a string or a chat ``messages`` list
    (``[{role, content}, ...]`` ending with the user's turn); rows carry it as ``question``."""
    answer_key: str | None = "answer"
    """``hf`` only: the column holding the reference answer, carried as ``answer``; null: rows have none
    (rewards that need no reference, e.g. a reward model)."""
    columns: dict[str, str] = field(default_factory=dict)
    """``hf`` only: row field -> the dataset's column, copied into each row for the rewards, e.g. HumanEval
    for ``code_exec``: ``{tests: test, test_setup: prompt, code_prefix: prompt, entry_point: entry_point}``;
    MBPP: ``{tests: test_list, test_setup: test_setup_code}``; APPS: ``{stdio: input_output}``."""
    split: str = "train"
    """``hf`` with a save_to_disk DatasetDict directory: the split training reads (a file has one split)."""
    heldout_fraction: float = 0.0
    """File tasks: this fraction of distinct prompts (seeded by ``seed``) is held out: training never
    draws them and ``relayrl eval`` (``eval.split=heldout``) scores them. 0: train on every row."""
    eval_path: str | None = None
    """File tasks: a separate local dataset (same layout and keys) that ``relayrl eval`` scores as the
    held-out split, e.g. GSM8K's test.jsonl."""
    eval_split: str | None = None
    """``hf`` with a save_to_disk DatasetDict: the split ``relayrl eval`` scores as held-out (e.g. test),
    read from ``eval_path`` if set, else from ``path``."""
    num_prompts: int = 4096
    """How many problems a generated task makes."""
    max_operand: int = 9
    """Generated tasks: ``arith`` operands are drawn from [0, max_operand]; ``countdown`` numbers and
    ``wordproblem`` quantities from [1, max_operand]; ``count`` counts to N log-uniform in [150, max_operand].
    ``facts`` ignores it (its corpus is fixed)."""
    ops: list[int] = field(default_factory=list)
    """``wordproblem`` and ``countdown``: how many operations a problem takes, each problem drawing one of these
    (wordproblem: its steps; countdown: its numbers less one). Empty: the task's own mix (wordproblem 2-4
    steps; countdown 3 or 4 numbers, TinyZero's). E.g. ``data.ops=[1]``: one-step problems, two-number
    Countdown."""
    chat_template: bool = True
    """Wrap each prompt in the tokenizer's chat template (instruct models); ``messages`` prompts need it."""
    seed: int = 0
    """Seed for generating and shuffling prompts, and for the held-out draw of ``heldout_fraction``."""

    def __post_init__(self) -> None:
        one_of("data.task", self.task, Task)
        if self.task in FILE_TASKS and not self.path:
            raise ConfigError(f"data.task={self.task} needs data.path; set data.path=/path/to/train.jsonl")
        for key in ("path", "eval_path"):
            value = getattr(self, key)
            if value and not os.path.exists(value):
                raise ConfigError(
                    f"data.{key}={value} does not exist; point data.{key} at a local dataset "
                    "(.jsonl/.json/.parquet/.csv file or save_to_disk directory)"
                )
        self._check_file_fields()
        self._check_ops()

    def _check_ops(self) -> None:
        if self.ops and self.task not in OPS_TASKS:
            raise ConfigError(
                f"data.ops applies to {' and '.join(OPS_TASKS)}, not data.task={self.task}; drop data.ops"
            )
        if any(k < 1 for k in self.ops):
            raise ConfigError(f"data.ops={list(self.ops)} must hold counts >= 1; e.g. data.ops=[1,2]")

    def _check_file_fields(self) -> None:
        """Fields that only a file task (or only ``hf``) reads must not be set for another task."""
        if self.task != "hf":
            for key, default in (
                ("prompt_key", "question"),
                ("answer_key", "answer"),
                ("split", "train"),
                ("eval_split", None),
                ("columns", {}),
            ):
                if getattr(self, key) != default:
                    raise ConfigError(f"data.{key} applies to data.task=hf; set data.task=hf or drop data.{key}")
        if self.task not in FILE_TASKS and (self.heldout_fraction or self.eval_path):
            raise ConfigError(
                f"data.heldout_fraction / data.eval_path apply to file tasks (jsonl, hf); "
                f"data.task={self.task} holds problems out by construction: drop them"
            )
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ConfigError(
                f"data.heldout_fraction={self.heldout_fraction} must be in [0, 1); e.g. data.heldout_fraction=0.1"
            )
        if self.heldout_fraction and (self.eval_path or self.eval_split):
            raise ConfigError(
                "data.heldout_fraction and data.eval_path/eval_split both name a held-out split; set only one"
            )
