"""vLLM (CPU, float32) and transformers agree on greedy decoding for every built-in model.

This is what lets the trainer (transformers/FSDP2) score tokens that vLLM sampled: same weights, same
tokenizer, same math. Each engine runs inside the test process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
it starts in ~3-10 s there instead of ~20 s for a spawned EngineCore process. The module fixture
then undoes what the engine did to this process (its torch.distributed group, os.environ) so later
tests start clean.
"""

from __future__ import annotations

import contextlib
import os
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation import GenerateDecoderOnlyOutput

NEW_TOKENS = 16
QUESTION = "What is 12 + 7?"
KV_CACHE_BYTES = {"tiny_llama": 256 << 20, "tiny_qwen2": 256 << 20, "smollm2_dir": 512 << 20}


@contextlib.contextmanager
def _restored_environ():
    """An in-process engine writes os.environ (LD_PRELOAD, LOCAL_WORLD_SIZE, VLLM_*); undo that so
    processes that later tests start (Ray workers, trainer ranks) do not inherit it."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_qwen2", "smollm2_dir"])
def engine(request):
    """(model dir, vLLM LLM) — one engine per model, started once for this module."""
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    model_dir = request.getfixturevalue(request.param)
    with _restored_environ():
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        start = time.perf_counter()
        llm = LLM(
            str(model_dir),
            dtype="float32",
            enforce_eager=True,
            max_model_len=256,
            seed=0,
            kv_cache_memory_bytes=KV_CACHE_BYTES[request.param],
        )
        print(f"\nvLLM engine for {model_dir.name} started in {time.perf_counter() - start:.1f} s")
        yield model_dir, llm
        llm.llm_engine.engine_core.shutdown()
        del llm
        cleanup_dist_env_and_memory()
    assert not torch.distributed.is_initialized(), "the in-process engine left its process group behind"


def _prompt(tokenizer) -> str:
    """The question in the model's own chat template (the tiny models have a ChatML one too)."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
    )


def _hf_greedy(model_dir, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    """Greedy continuation with transformers, and the logprob of each chosen token."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        # misc: transformers 5.19 types from_pretrained's model as a class its own generate's `self` rejects
        out = model.generate(  # type: ignore[misc]
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=model.config.pad_token_id,
        )
    assert isinstance(out, GenerateDecoderOnlyOutput) and out.logits is not None  # return_dict, output_logits
    tokens = out.sequences[0, len(prompt_ids) :].tolist()
    # raw logits, not `scores`: min_new_tokens masks eos in the scores, which shifts their normaliser
    logprobs = [torch.log_softmax(logits[0], -1)[t].item() for logits, t in zip(out.logits, tokens)]
    return tokens, logprobs


def test_greedy_continuation_matches_transformers(engine, record_property):
    from vllm import SamplingParams

    model_dir, llm = engine
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = _prompt(tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert out.prompt_token_ids == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    vllm_tokens = list(out.outputs[0].token_ids)
    vllm_logprobs = [lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, vllm_tokens)]

    hf_tokens, hf_logprobs = _hf_greedy(model_dir, out.prompt_token_ids)
    record_property("greedy_text", tokenizer.decode(vllm_tokens))
    print(f"{model_dir.name}: {prompt!r} -> {tokenizer.decode(vllm_tokens)!r}")
    print(f"max |logprob diff| = {max(abs(a - b) for a, b in zip(vllm_logprobs, hf_logprobs)):.2e}")
    assert vllm_tokens == hf_tokens
    assert vllm_logprobs == pytest.approx(hf_logprobs, abs=1e-4)  # measured: 5e-7 (tiny), 1e-5 (SmolLM2, 30 layers)
