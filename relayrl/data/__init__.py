"""Prompt datasets: generated tasks and local files, the held-out split, and the sampler that batches them.

Rows are plain dicts with at least ``question`` (a string, or a chat ``messages`` list from ``data.task=hf``)
and, except for an ``hf`` dataset read with ``data.answer_key=null``, ``answer`` (a string); every key of
a row is passed to reward functions as a column (TRL's convention: ``fn(prompts, completions, **columns)``).
``PromptSampler`` turns rows into ``Prompt`` records (id, formatted text, the row as ``columns``, seed).

    generated (GENERATORS)   arith | multiply | countdown | wordproblem | facts | count
                             seeded by data.seed; held out by construction
    files                    jsonl (jsonl.py) | hf (files.py)   minus data.heldout_fraction of the prompts
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from relayrl.config import ConfigError, DataConfig
from relayrl.config.data import OPS_TASKS
from relayrl.data import count, countdown, wordproblem
from relayrl.data.arith import ARITH_QUESTION, make_arith_rows, make_multiply_rows
from relayrl.data.count import make_count_rows
from relayrl.data.countdown import make_countdown_rows
from relayrl.data.facts import make_facts_rows
from relayrl.data.files import load_hf
from relayrl.data.jsonl import JsonlError, load_jsonl
from relayrl.data.sampler import Prompt, PromptSampler, chat_formatter, prompt_text
from relayrl.data.wordproblem import make_wordproblem_rows

__all__ = [
    "ARITH_QUESTION",
    "GENERATORS",
    "JsonlError",
    "Prompt",
    "PromptSampler",
    "chat_formatter",
    "load_heldout",
    "load_hf",
    "load_jsonl",
    "load_task",
    "make_arith_rows",
    "prompt_text",
    "sft_problems",
    "split_heldout",
    "worked_examples",
]

Rows = list[dict[str, Any]]

GENERATORS: dict[str, Callable[[int, int, int | str], Rows]] = {
    "arith": make_arith_rows,
    "multiply": make_multiply_rows,
    "countdown": make_countdown_rows,
    "wordproblem": make_wordproblem_rows,
    "facts": lambda n, _max_operand, seed: make_facts_rows(n, seed),  # a fixed corpus: no operand range
    "count": make_count_rows,
}
"""Generated tasks: ``make(num_prompts, max_operand, seed) -> rows``, the same rows for the same arguments."""

WORKED_ANSWERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "countdown": countdown.worked_answer,
    "wordproblem": wordproblem.worked_answer,
    "count": count.worked_answer,
}
"""Generated tasks whose rows carry a solution: ``row -> the reply`` a supervised warm start teaches (``sft``)."""


def load_task(data_cfg: DataConfig) -> Rows:
    """The training rows of ``data_cfg.task``: generated, or a file's rows less the held-out prompts."""
    if data_cfg.task in GENERATORS:
        return generate(data_cfg, data_cfg.num_prompts, data_cfg.seed)
    rows = _read(data_cfg, data_cfg.path, data_cfg.split)
    return split_heldout(rows, data_cfg.heldout_fraction, data_cfg.seed)[0]


def generate(data_cfg: DataConfig, n: int, seed: int | str) -> Rows:
    """``n`` rows of the generated task ``data_cfg.task`` drawn with ``seed`` (``data.ops`` to the tasks that
    take it)."""
    make = GENERATORS[data_cfg.task]
    if data_cfg.task in OPS_TASKS:
        return make(n, data_cfg.max_operand, seed, tuple(data_cfg.ops))  # type: ignore[call-arg]
    return make(n, data_cfg.max_operand, seed)


def load_heldout(data_cfg: DataConfig, n: int, seed: int) -> tuple[Rows, str] | None:
    """What ``relayrl eval`` scores as held-out for a task other than ``arith`` (which
    ``data.eval_split.heldout_arith_rows`` holds out), with a line saying what it is; None: none named.

    Generated tasks: ``n`` (0: ``num_prompts``) fresh problems drawn with their own seed, any question
    the training rows hold rejected. Files: ``data.eval_path`` / ``data.eval_split`` if set, else the
    prompts ``data.heldout_fraction`` set aside (all of them; the caller cuts to its limit)."""
    if data_cfg.task in GENERATORS:
        return _fresh_problems(data_cfg, n or data_cfg.num_prompts, seed)
    if data_cfg.eval_path or data_cfg.eval_split:
        path, split = data_cfg.eval_path or data_cfg.path, data_cfg.eval_split or data_cfg.split
        where = f"held-out: data.eval_path={path}" + (f" split {split}" if data_cfg.eval_split else "")
        return _read(data_cfg, path, split), where
    if data_cfg.heldout_fraction:
        _, rows = split_heldout(
            _read(data_cfg, data_cfg.path, data_cfg.split), data_cfg.heldout_fraction, data_cfg.seed
        )
        return rows, f"held-out: data.heldout_fraction={data_cfg.heldout_fraction:g} of {data_cfg.path}"
    return None


def worked_examples(data_cfg: DataConfig, n: int) -> Rows:
    """``n`` prompt/completion rows (TRL's prompt-completion format) for a supervised warm start: fresh problems
    of a generated task that no training row holds, each with its worked answer (``WORKED_ANSWERS``)."""
    if data_cfg.task not in WORKED_ANSWERS:
        raise ConfigError(
            f"sft: data.task={data_cfg.task} has no worked solutions to learn from (only "
            f"{', '.join(WORKED_ANSWERS)}); set sft.path to a jsonl of prompt/completion rows or sft.steps=0"
        )
    return [
        {"prompt": row["question"], "completion": WORKED_ANSWERS[data_cfg.task](row)}
        for row in sft_problems(data_cfg, n)
    ]


def sft_problems(data_cfg: DataConfig, n: int) -> Rows:
    """``n`` fresh problems of a generated task for a warm start: drawn with their own seed, none a training row."""
    if data_cfg.task not in GENERATORS:
        raise ConfigError(
            f"sft: data.task={data_cfg.task} is not generated, so there are no fresh problems to warm up on; "
            "set sft.path to a jsonl of prompt/completion rows or sft.steps=0"
        )
    rows, _ = _fresh_problems(data_cfg, n, "sft", "sft")
    if not rows:
        raise ConfigError(
            f"sft: every {data_cfg.task} problem with data.max_operand={data_cfg.max_operand} is already a "
            "training prompt, so none is left to warm up on; raise data.max_operand or lower data.num_prompts"
        )
    return rows


def _fresh_problems(data_cfg: DataConfig, n: int, seed: int | str, use: str = "heldout") -> tuple[Rows, str]:
    """Up to ``n`` distinct generated problems that no training row holds, from ``2 n + 100`` draws seeded by
    ``use`` (what they are for: each use its own draw) and ``seed``."""
    seen = {prompt_text(row["question"]) for row in load_task(data_cfg)}
    drawn = generate(data_cfg, 2 * n + 100, f"{use}/{seed}")
    rows: Rows = []
    for row in drawn:
        key = prompt_text(row["question"])
        if key not in seen and len(rows) < n:
            seen.add(key)
            rows.append(row)
    return rows, f"held-out: {len(rows)} {data_cfg.task} problems no training row holds"


def split_heldout(rows: Rows, fraction: float, seed: int) -> tuple[Rows, Rows]:
    """``(train, heldout)``: ``round(d * fraction)`` of the ``d`` distinct prompts, chosen by a shuffle
    seeded with ``seed``, go to heldout with every row that repeats them; the rest (in file order) train.
    Splitting by prompt, not by row, keeps a repeated prompt from landing on both sides."""
    if not fraction:
        return rows, []
    keys = list(dict.fromkeys(prompt_text(row["question"]) for row in rows))
    k = round(len(keys) * fraction)
    if not 1 <= k < len(keys):
        raise ConfigError(
            f"data.heldout_fraction={fraction:g} of {len(keys)} distinct prompts holds out {k}; "
            "it must leave at least one prompt on each side: change data.heldout_fraction"
        )
    order = list(range(len(keys)))
    random.Random(f"relayrl-heldout-split/{seed}").shuffle(order)
    held = {keys[i] for i in order[:k]}
    return (
        [r for r in rows if prompt_text(r["question"]) not in held],
        [r for r in rows if prompt_text(r["question"]) in held],
    )


def _read(data_cfg: DataConfig, path: str | None, split: str) -> Rows:
    """All rows of one file task's dataset; chat-message prompts only with the chat template on."""
    if path is None:  # DataConfig rejects a file task without data.path; this is for a config built by hand
        raise ConfigError(f"data.task={data_cfg.task} reads a file; set data.path")
    if data_cfg.task == "jsonl":
        rows = load_jsonl(path)
    else:
        rows = load_hf(path, data_cfg.prompt_key, data_cfg.answer_key, split, dict(data_cfg.columns))
    if not data_cfg.chat_template and any(not isinstance(r["question"], str) for r in rows):
        raise ConfigError(
            f"{path}: prompts are chat messages, which the chat template formats; set data.chat_template=true"
        )
    return rows
