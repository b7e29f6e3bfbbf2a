"""Load GSM8K-style ``.jsonl`` rows from a local file (one JSON object per line).

Each row needs ``question`` and ``answer``. GSM8K answers are worked solutions ending in
``#### 42``; the final number becomes ``answer`` (commas dropped: ``#### 1,200`` -> ``"1200"``) and
the full text is kept as ``solution``, so reward functions can compare numbers while the worked
solution stays available as a column. Other keys pass through unchanged as extra columns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REQUIRED_KEYS = ("question", "answer")
GSM8K_MARKER = "####"


class JsonlError(ValueError):
    """A problem with a data file, in one line: ``file:line``, what is wrong, the fix."""


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read every non-blank line of ``path`` as a row; raise ``JsonlError`` on the first bad one."""
    path = Path(path)
    if not path.is_file():
        raise JsonlError(f"{path}: no such file; point data.path at a local .jsonl file")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                rows.append(_parse_row(line, f"{path}:{lineno}"))
    if not rows:
        raise JsonlError(
            f"{path}: file has no rows; add lines like "
            '{"question": "...", "answer": "#### 42"} or use another data.path'
        )
    return rows


def _parse_row(line: str, where: str) -> dict[str, Any]:
    """Decode one line, check the required keys, split a GSM8K answer into answer + solution."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise JsonlError(
            f"{where}: invalid JSON ({exc.msg} at column {exc.colno}); write one JSON object per line"
        ) from None
    if not isinstance(row, dict):
        raise JsonlError(
            f"{where}: expected a JSON object, got {type(row).__name__}; "
            'write rows like {"question": "...", "answer": "..."}'
        )
    missing = [k for k in REQUIRED_KEYS if k not in row]
    if missing:
        raise JsonlError(
            f"{where}: missing key(s) {', '.join(missing)} (has: {', '.join(row) or 'none'}); "
            "add them or rename the columns to question/answer"
        )
    row["question"], row["answer"] = str(row["question"]), str(row["answer"])
    if GSM8K_MARKER in row["answer"]:
        row["solution"] = row["answer"]
        row["answer"] = final_answer(row["solution"], where)
    return row


def final_answer(solution: str, where: str) -> str:
    """The text after the last ``####``, stripped, with thousands separators removed."""
    final = solution.rsplit(GSM8K_MARKER, 1)[1].strip().replace(",", "")
    if not final:
        raise JsonlError(f"{where}: answer has '####' but nothing after it; end it with '#### <number>'")
    return final
