"""Model assets: resolve ``model.path`` to a local HF directory that vLLM and the trainer both load.

Built-in names (one registry, below) are built into the cache on first use; anything else must be a
local HF model directory. Nothing is ever downloaded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from relayrl.models._cache import models_dir
from relayrl.models.smollm2 import ensure_smollm2
from relayrl.models.tiny import build_tiny_model

if TYPE_CHECKING:  # transformers is imported where it is used: it takes seconds
    from transformers import PreTrainedTokenizerBase


class ModelNotFoundError(ValueError):
    """``model.path`` names neither a built-in model nor a local HF model directory."""


BUILTIN_MODELS: dict[str, Callable[[str | Path | None], Path]] = {
    "smollm2": ensure_smollm2,  # SmolLM2-135M-Instruct, the default: a real instruct model (~135M params)
    "tiny-llama": lambda cache: build_tiny_model("tiny-llama", models_dir(cache) / "tiny-llama"),
    "tiny-qwen2": lambda cache: build_tiny_model("tiny-qwen2", models_dir(cache) / "tiny-qwen2"),
}
"""name -> builder(cache_dir) returning the model's directory (built once, then reused)."""


def resolve_model(path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The local HF directory for ``path``: a built-in name, or a directory holding config.json."""
    if str(path) in BUILTIN_MODELS:
        return BUILTIN_MODELS[str(path)](cache_dir)
    local = Path(path).expanduser()
    if (local / "config.json").is_file():
        return local.resolve()
    raise ModelNotFoundError(
        f"model.path={str(path)!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor a local HF "
        f"directory with config.json; set model.path to one of those"
    )


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str | Path, cache_dir: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of ``resolve_model(path)``, loaded the way vLLM loads it (``AutoTokenizer``), once per
    process and path: the driver's prompt check (before Ray) and its prompt sampler (as the actors start)
    share one load instead of paying for two on the driver's single-threaded start. Callers only read it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(path, cache_dir))


__all__ = [
    "BUILTIN_MODELS",
    "ModelNotFoundError",
    "build_tiny_model",
    "ensure_smollm2",
    "load_tokenizer",
    "resolve_model",
]
