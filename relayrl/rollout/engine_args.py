"""The vLLM engine arguments a ``Rollout`` (``relayrl.rollout.engine``) starts its ``AsyncLLM`` with, built
from relayrl's configs: ``engine_args``, and the parts of them that depend on the box and on
``rollout.stream``, typed so that spreading them into vLLM's ``AsyncEngineArgs`` is checked key by key.
vLLM itself is imported only when ``engine_args`` is called.
"""

from __future__ import annotations

from typing import Any, TypedDict, cast

from relayrl.config import ModelConfig, RolloutConfig, WeightSyncConfig, has_cuda
from relayrl.config.model import ModelDtype

EXTENSION = "relayrl.weightsync.worker.WeightSyncExtension"

CPU_SHARED_BLOCK = 32
"""KV block size of CPU engines that share prompts: only full blocks are cached, vLLM's CPU default of 128
tokens would share nothing of a shorter prompt, and its CPU attention takes multiples of 32."""


class BoxEngineArgs(TypedDict, total=False):
    """The engine arguments that depend on the box (CPU or GPU) and on prefix sharing, typed so that
    spreading them into ``AsyncEngineArgs`` is checked key by key."""

    block_size: int
    enable_chunked_prefill: bool
    max_num_batched_tokens: int


def box_engine_args(model_cfg: ModelConfig, rollout_cfg: RolloutConfig) -> BoxEngineArgs:
    """CPU engines only: the shared-prompt block size, and chunked prefill off (``engine_args`` says why)."""
    if has_cuda():
        return {}
    box: BoxEngineArgs = {"enable_chunked_prefill": False, "max_num_batched_tokens": max(2048, model_cfg.max_model_len)}
    if rollout_cfg.prefix_sharing:
        box["block_size"] = CPU_SHARED_BLOCK
    return box


class StreamEngineArgs(TypedDict, total=False):
    """The engine arguments of ``rollout.stream``, typed for the same check as ``BoxEngineArgs``."""

    max_num_seqs: int


def stream_engine_args(rollout_cfg: RolloutConfig) -> StreamEngineArgs:
    """``rollout.stream``: the engine runs at most ``in_flight`` sequences (vLLM's ``max_num_seqs``). The
    driver keeps twice that many submitted, so a sequence that ends is replaced at the next engine step by a
    waiting one (vLLM's continuous batching), never by a round trip to the driver."""
    return {"max_num_seqs": rollout_cfg.in_flight} if rollout_cfg.stream and rollout_cfg.in_flight else {}


def engine_args(
    model_path: str, model_cfg: ModelConfig, rollout_cfg: RolloutConfig, seed: int, sync_cfg: WeightSyncConfig
) -> Any:
    """vLLM engine arguments from our configs.

    Prefix caching is on only with ``rollout.prefix_sharing`` (sync runs): after a weight update, cached
    prompt KV computed with old weights would be reused by new requests, and vLLM can only reset that
    cache when nothing runs, which in a sync run is every commit (``finish_weight_update`` resets it).
    ``rollout.tp_size`` or ``rollout.pp_size`` > 1: the engine's workers are this actor's own processes
    ("mp"), on the tp x pp GPUs Ray gave the actor (on CPU, on cores of their own: ``cpu_thread_env``); left
    to itself vLLM would see the placement group and start Ray workers that ask for GPUs the actor already
    holds. Each worker receives the full weights at a sync and its ``load_weights`` keeps its own shard of
    its own layers.
    Chunked prefill is off on CPU: with more prompt tokens waiting than one step schedules, vLLM splits a
    prompt across steps and, for a seeded request, rewinds its generator, which a CPU generator cannot do
    (the engine dies: "CPU Generator does not use offset"). Unsplit, every prompt is prefilled whole in one
    step (at most ``max_model_len`` tokens, so the step budget is raised to that where it is lower).
    """
    from vllm.engine.arg_utils import AsyncEngineArgs

    from relayrl.weightsync import engine_config

    return AsyncEngineArgs(
        model=model_path,
        dtype=cast(ModelDtype, model_cfg.dtype),  # ModelConfig.__post_init__ checked it is one of these
        max_model_len=model_cfg.max_model_len,
        seed=seed,
        enforce_eager=rollout_cfg.enforce_eager,
        kv_cache_memory_bytes=int(rollout_cfg.kv_cache_gb * 2**30),
        worker_extension_cls=EXTENSION,
        logprobs_mode="processed_logprobs",
        weight_transfer_config=engine_config(sync_cfg),
        enable_prefix_caching=rollout_cfg.prefix_sharing,
        disable_log_stats=True,
        tensor_parallel_size=rollout_cfg.tp_size,
        pipeline_parallel_size=rollout_cfg.pp_size,
        distributed_executor_backend="mp" if rollout_cfg.workers > 1 else None,
        **stream_engine_args(rollout_cfg),
        **box_engine_args(model_cfg, rollout_cfg),
    )
