"""Users' own datasets, read through HF ``datasets`` from local files only (``data.task=hf``).

    .jsonl / .json  -> load_dataset("json", data_files=path)      one split ("train")
    .parquet        -> load_dataset("parquet", data_files=path)
    .csv            -> load_dataset("csv", data_files=path)
    a directory     -> load_from_disk(path)                        written by save_to_disk; a DatasetDict's
                                                                   split is chosen by ``data.split``

Only the packaged builders above are named, so nothing is resolved on the hub; ``HF_DATASETS_OFFLINE=1``
is set (unless the user set it) before ``datasets`` is imported, so a lookup would fail rather than
download. The prompt column (``data.prompt_key``)
becomes the row's ``question`` - a string, or a chat ``messages`` list ending with the user's turn - and
the answer column (``data.answer_key``) its ``answer`` (a string; GSM8K's ``... #### 72`` is split as
``data.task=jsonl`` splits it). Other columns pass through to reward functions unchanged; a column
named ``question``/``answer`` that is not the mapped one is replaced by the mapped one.

``jsonl`` stays as it is beside this: it reads a hand-written file line by line and names the bad
line (``train.jsonl:3``), which a columnar loader cannot; ``hf`` is the general path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from relayrl.config import ConfigError
from relayrl.data.jsonl import GSM8K_MARKER, JsonlError, final_answer

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""File suffix -> packaged ``datasets`` builder (local, no hub lookup)."""
ROLES = ("system", "user", "assistant")


def load_hf(
    path: str | Path,
    prompt_key: str = "question",
    answer_key: str | None = "answer",
    split: str = "train",
    columns: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every row of the local dataset at ``path`` as ``{"question", "answer", **other columns}``, plus
    ``columns`` (field -> column) copied under their field names; raise ``ConfigError`` (one line: the
    cause and the fix) for a missing file, split or column."""
    table = _load_table(Path(path), split)
    columns = columns or {}
    missing = [k for k in (prompt_key, answer_key, *columns.values()) if k is not None and k not in table.column_names]
    if missing:
        raise ConfigError(
            f"{path}: no column {', '.join(map(repr, missing))} (has: {', '.join(table.column_names)}"
            "); set data.prompt_key / data.answer_key / data.columns to the dataset's column "
            "names"
        )
    if table.num_rows == 0:
        raise ConfigError(f"{path}: the dataset has no rows; point data.path at a non-empty dataset")
    return [
        {**_row(raw, i, path, prompt_key, answer_key), **{f: raw[c] for f, c in columns.items()}}
        for i, raw in enumerate(table)
    ]


def _load_table(path: Path, split: str) -> Any:
    """A ``datasets.Dataset`` from a data file or a save_to_disk directory, never from the hub."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # read by datasets at import: no hub, ever
    import datasets

    if path.is_dir():
        return _load_saved(path, split, datasets)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file or directory; point data.path at a local dataset")
    builder = BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ConfigError(
            f"{path}: unknown file type {path.suffix!r}; use one of {', '.join(BUILDERS)} or a save_to_disk directory"
        )
    if split != "train":
        raise ConfigError(
            f"{path}: data.split={split} applies to save_to_disk directories (a file has one split); drop data.split"
        )
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:  # noqa: BLE001 - pyarrow / pandas parse errors have many types
        raise ConfigError(
            f"{path}: cannot read as {builder} ({_first_line(exc)}); fix the file or its suffix"
        ) from None


def _load_saved(path: Path, split: str, datasets: Any) -> Any:
    """A save_to_disk directory: a Dataset as it is, a DatasetDict's ``split``."""
    try:
        saved = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: a directory not written by save_to_disk; point data.path at a "
            f"{'/'.join(BUILDERS)} file or a save_to_disk directory"
        ) from None
    if isinstance(saved, datasets.DatasetDict):
        if split not in saved:
            raise ConfigError(
                f"{path}: no split {split!r} (has: {', '.join(saved)}); set data.split / data.eval_split to one of them"
            )
        return saved[split]
    return saved


def _row(raw: dict[str, Any], i: int, path: str | Path, prompt_key: str, answer_key: str | None) -> dict[str, Any]:
    """One dataset row mapped onto ``question`` / ``answer``; ``where`` names it in errors."""
    where = f"{path} row {i}"
    row = {k: v for k, v in raw.items() if k not in (prompt_key, answer_key, "question", "answer")}
    row["question"] = _prompt(raw[prompt_key], where, prompt_key)
    if answer_key is not None:
        if raw[answer_key] is None:
            raise ConfigError(f"{where}: column {answer_key!r} is empty; fill it or drop the row")
        row["answer"] = str(raw[answer_key])
        if GSM8K_MARKER in row["answer"]:
            row["solution"] = row["answer"]
            try:
                row["answer"] = final_answer(row["solution"], where)
            except JsonlError as exc:
                raise ConfigError(str(exc)) from None
    return row


def _prompt(value: Any, where: str, key: str) -> str | list[dict[str, str]]:
    """A prompt string, or a chat messages list checked for shape (the chat template formats it)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(_is_message(m) for m in value):
        if value[-1]["role"] != "user":
            raise ConfigError(
                f"{where}: the {key!r} messages end with a {value[-1]['role']!r} turn; end "
                "each prompt with the user's turn (keep references in data.answer_key)"
            )
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise ConfigError(
        f"{where}: column {key!r} holds {type(value).__name__} {str(value)[:40]!r}; a prompt "
        "is a non-empty string or a messages list [{role, content}, ...]"
    )


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
