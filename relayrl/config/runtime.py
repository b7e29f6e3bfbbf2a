"""Process settings that follow from the host rather than from a recipe: whether CUDA is there, and
the environment variables every Ray worker of a run gets."""

from __future__ import annotations

from typing import Any


def has_cuda() -> bool:
    """Does this process see a CUDA device? (Config checks and the rollout's engine settings ask this.)"""
    import torch

    return torch.cuda.is_available()


WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "WARNING"}
"""Set in every Ray worker of a run (``cluster.start_ray``): tokenizers' own thread pool off (the actors size
their threads), vLLM's INFO lines off."""


CPU_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
    "MALLOC_TOP_PAD_": str(256 << 20),
}
"""glibc malloc settings for CPU engines and trainer ranks, which allocate the same large tensors again at
every step (a trainer's vocab-wide logits chunks and their gradients, AdamW's temporaries; an engine's GEMM
copies at every commit). By default glibc serves blocks over its dynamic mmap threshold (at most 32 MiB) with
fresh ``mmap``s and unmaps them on free, so each re-allocation faults in fresh zeroed pages. A fixed 1 GiB
threshold and no trimming keep freed memory in the heap for reuse (RSS stays at its peak).

Why it pays: without them every step faults in its large temporaries again, and an engine's commit copies into
freshly mapped pages; with them both reuse their heap. ``bench/trainer_step.py --system-malloc`` and
``bench/weight_sync.py`` show the gap (figures: docs/benchmarks.md).

What it costs: a heap that keeps every freed block grows with the activations of a long row. In a checkpointed
forward each layer's kept output lands above that layer's freed temporaries, and the heap ratchets up layer by
layer. A trainer rank whose micro-batches are long (``trainer.recompute.long_rows``) therefore starts with
``LONG_ROWS_MALLOC_ENV`` instead (``malloc_env(long_rows=True)``); ``bench/long_context.py`` runs each case under
the setting its rank would get.

Read by glibc when a process starts, so they go in each actor's runtime env (inherited by vLLM's processes)."""


LONG_ROWS_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(4 << 20)}
"""glibc malloc settings for a CPU trainer rank whose micro-batches are long: every block of 4 MiB or more is
mapped on its own and returned to the system when freed, so a long row's per-layer tensors cannot ratchet the
heap. glibc's default threshold is not enough: it climbs to 32 MiB as mapped blocks are freed, and a layer's
tensors below that (the hidden states, 19 MB at 8k tokens of a 576-wide model) then stay in the heap. The price
is a page fault per 4 KiB of each such block at each use; figures in docs/benchmarks.md (bench.long_context)."""


def malloc_env(long_rows: bool = False) -> dict[str, str]:
    """``CPU_MALLOC_ENV`` on a CPU host, ``LONG_ROWS_MALLOC_ENV`` for a trainer rank whose micro-batches are long;
    nothing on CUDA machines, where the big tensors live on the GPU."""
    if has_cuda():
        return {}
    return dict(LONG_ROWS_MALLOC_ENV if long_rows else CPU_MALLOC_ENV)


def with_env(options: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Ray actor ``options`` whose runtime env also sets ``env`` (the options' own variables win)."""
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**env, **runtime_env.get("env_vars", {})}
    return {**options, "runtime_env": runtime_env}
