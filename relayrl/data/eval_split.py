"""Which rows an evaluation scores (``eval.split``): ``relayrl eval``, evaluation during training
(``eval.every``) and the pre-start check of those rows (``preflight.check_data``) all draw them here.

``heldout`` is, for the generated ``arith`` task, problems no training row contains (``heldout_arith_rows``:
disjoint by construction, whatever the seeds); for the other generated tasks, fresh problems no training row
holds (``data.load_heldout``); for a file task, ``data.eval_path`` / ``data.eval_split`` or the prompts
``data.heldout_fraction`` kept out of training, else its ``data.path`` (and the description says so).
``data`` is the first rows as training loads them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from relayrl.config import Config, ConfigError, DataConfig
from relayrl.data import ARITH_QUESTION, load_heldout, load_task, make_arith_rows


def eval_rows(cfg: Config, limit: int) -> tuple[list[dict[str, Any]], str]:
    """At most ``limit`` rows (0: all) of ``cfg.eval.split``, and a line saying what they are."""
    held_out = cfg.eval.split == "heldout"
    heldout = load_heldout(cfg.data, limit, cfg.eval.seed) if held_out and cfg.data.task != "arith" else None
    if held_out and cfg.data.task == "arith":
        rows = heldout_arith_rows(cfg.data, limit or cfg.data.num_prompts, cfg.eval.seed)
        where = f"held-out: {len(rows)} arith problems no training row holds"
    elif heldout is not None:
        rows, where = heldout[0][: limit or None], heldout[1]
    else:
        rows = load_task(cfg.data)[: limit or None]
        where = f"data.task={cfg.data.task}" + (f" data.path={cfg.data.path}" if cfg.data.path else "")
        if cfg.eval.split == "heldout":
            where += (
                " (this task has no held-out split here: set data.heldout_fraction or data.eval_path, "
                "or point data.path at a test file)"
            )
    if not rows:
        raise ConfigError(
            f"eval.split={cfg.eval.split} of data.task={cfg.data.task} gave no prompts; "
            "check data.path, eval.num_prompts or --limit"
        )
    return rows, where


def heldout_arith_rows(data_cfg: DataConfig, n: int, seed: int) -> list[dict[str, str]]:
    """``n`` distinct ``arith`` problems that ``make_arith_rows(data_cfg...)`` (training's rows) never holds.

    Held-out by construction, not by seed: pairs ``(a, b)`` are drawn with their own seed and any pair
    the training rows contain is rejected. Pairs of training's range ``[0, M]`` (M = max_operand) come
    first; when that range is used up (4096 training rows hold all 100 pairs of single-digit
    addition) the draw continues in ``[0, 2M + 1]`` with an operand above M, which no
    training row can hold (harder: those sums test generalisation beyond the trained digits).
    """
    m = data_cfg.max_operand
    seen = {row["question"] for row in make_arith_rows(data_cfg.num_prompts, m, data_cfg.seed)}
    rng = random.Random(f"relayrl-heldout/{seed}")
    inside = _draw_pairs(rng, m, lambda a, b: True, seen, n)
    outside = _draw_pairs(rng, 2 * m + 1, lambda a, b: max(a, b) > m, seen, n - len(inside))
    return [_arith_row(a, b) for a, b in inside + outside]


def _draw_pairs(
    rng: random.Random, hi: int, keep: Callable[[int, int], bool], seen: set[str], n: int
) -> list[tuple[int, int]]:
    """Up to ``n`` distinct pairs in ``[0, hi]^2`` with ``keep(a, b)`` whose question is not in ``seen``,
    from at most ``20 n + 100`` draws (a range with few unseen pairs is given up, not searched forever)."""
    out: list[tuple[int, int]] = []
    for _ in range(20 * n + 100 if n > 0 else 0):
        if len(out) == n:
            break
        a, b = rng.randint(0, hi), rng.randint(0, hi)
        if keep(a, b) and (a, b) not in out and _arith_row(a, b)["question"] not in seen:
            out.append((a, b))
    return out


def _arith_row(a: int, b: int) -> dict[str, str]:
    return {"question": ARITH_QUESTION.format(a=a, b=b), "answer": str(a + b)}
