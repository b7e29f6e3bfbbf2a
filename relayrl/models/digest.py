"""What makes two copies of a model directory interchangeable within one run: its config and its tokenizer.

Every engine and trainer rank loads ``model.path`` from its own node's filesystem. Two nodes whose copies differ
in the architecture or the tokenizer would tokenize the same prompt differently or refuse the trainer's weights,
so an engine whose copy differs from the driver's is refused before it serves (``controller/replicas.py``). The
weights are not hashed: every engine is synced the trainer's weights before it serves, and hashing gigabytes
would lengthen every start.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

DIGESTED = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)
"""The files of a HF model directory that the digest covers, where present."""


def model_digest(path: str | Path) -> str:
    """16 hex digits of sha256 over the ``DIGESTED`` files of the directory ``path`` (name and bytes of each)."""
    h = hashlib.sha256()
    for name in DIGESTED:
        if (file := Path(path) / name).is_file():
            h.update(f"{name}\0{file.stat().st_size}\0".encode())
            h.update(file.read_bytes())
    return h.hexdigest()[:16]
