"""The rollout actor: one vLLM ``AsyncLLM`` engine in a Ray actor, producing version-tagged groups.

    controller --generate(prompts, G)--> RolloutActor --one request per prompt, n=G--> AsyncLLM
    controller --update_weights(handle, v)--> RolloutActor --collective_rpc--> WeightSyncExtension
                                                      \\--> engine weight version := v

Every completion token is tagged with the weight version that sampled it; vLLM itself reports
these as contiguous spans (``CompletionOutput.weight_versions``), so a completion that straddles
an in-flight update carries two spans. Behaviour logprobs are those of the *sampling*
distribution (``logprobs_mode="processed_logprobs"``: after temperature and top-p), which is
what importance ratios pi/mu need.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from relayrl.config import ModelConfig, RolloutConfig, WeightSyncConfig
from relayrl.types import Trajectory, TrajectoryGroup, VersionSpan
from relayrl.weightsync.base import WeightHandle

EXTENSION = "relayrl.weightsync.worker.WeightSyncExtension"
CONTROL_TIMEOUT_S = 60.0            # floor for the label/resume stages of a weight update
INITIAL_VERSION_LABEL = "default"   # vLLM's label for the weights an engine started with (our v0)


def parse_version(label: str) -> int:
    """vLLM weight-version label -> policy version (``"default"`` is the initial model, v0)."""
    return 0 if label == INITIAL_VERSION_LABEL else int(label)


def engine_args(model_path: str, model_cfg: ModelConfig, rollout_cfg: RolloutConfig, seed: int) -> Any:
    """vLLM engine arguments from our configs.

    Prefix caching is off: after a weight update, cached prompt KV computed with old weights
    would be reused by new requests, and vLLM can only reset that cache when nothing runs.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(
        model=model_path, dtype=model_cfg.dtype, max_model_len=model_cfg.max_model_len, seed=seed,
        enforce_eager=rollout_cfg.enforce_eager,
        kv_cache_memory_bytes=int(rollout_cfg.kv_cache_gb * 2**30),
        worker_extension_cls=EXTENSION, logprobs_mode="processed_logprobs",
        enable_prefix_caching=False, disable_log_stats=True,
    )


class RolloutActor:
    """Owns one engine. Run it as a Ray actor (``start_rollout_actor``); methods are async."""

    def __init__(self, model_path: str, model_cfg: ModelConfig, rollout_cfg: RolloutConfig, seed: int,
                 sync_cfg: WeightSyncConfig | None = None):
        from vllm.v1.engine.async_llm import AsyncLLM

        t0 = time.perf_counter()
        self.rollout_cfg = rollout_cfg
        self.sync_cfg = sync_cfg or WeightSyncConfig()
        self.engine = AsyncLLM.from_engine_args(engine_args(model_path, model_cfg, rollout_cfg, seed))
        self._paused = False
        self.start_seconds = time.perf_counter() - t0

    def info(self) -> dict[str, float]:
        """Static facts for logs: engine start time."""
        return {"start_seconds": self.start_seconds}

    async def generate(self, prompts: list[dict[str, Any]], group_size: int) -> list[TrajectoryGroup]:
        """Sample ``group_size`` completions for each ``{"prompt_id", "prompt", "columns"}``, concurrently."""
        if group_size < 1:
            raise ValueError(f"group_size={group_size} must be >= 1; set algorithm.group_size")
        for p in prompts:
            if not {"prompt_id", "prompt"} <= p.keys():
                raise ValueError(f"prompt {p!r} lacks 'prompt_id' or 'prompt'; pass "
                                 "{'prompt_id': int, 'prompt': str, 'columns': dict}")
        return list(await asyncio.gather(*(self._generate_group(p, group_size) for p in prompts)))

    async def _generate_group(self, prompt: dict[str, Any], group_size: int) -> TrajectoryGroup:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        cfg = self.rollout_cfg
        params = SamplingParams(n=group_size, logprobs=0, temperature=cfg.temperature, top_p=cfg.top_p,
                                max_tokens=cfg.max_tokens, output_kind=RequestOutputKind.FINAL_ONLY)
        t0 = time.perf_counter()
        final = await self._final_output(prompt["prompt"], params)
        seconds = time.perf_counter() - t0
        trajs = [_trajectory(prompt["prompt_id"], final.prompt_token_ids, c, seconds)
                 for c in sorted(final.outputs, key=lambda c: c.index)]
        return TrajectoryGroup(prompt["prompt_id"], prompt["prompt"], dict(prompt.get("columns", {})), trajs)

    async def _final_output(self, prompt: Any, params: Any) -> Any:
        final = None
        async for out in self.engine.generate(prompt, params, request_id=uuid.uuid4().hex):
            final = out
        if final is None:
            raise RuntimeError("vLLM returned no output for a request; was the engine paused with mode=abort?")
        return final

    async def update_weights(self, handle: WeightHandle, version: int,
                             timeout_s: float | None = None) -> dict[str, float]:
        """Load ``handle``'s weights into every worker and label the engine's weights ``version``.

        Stages: pause (``keep``: running requests freeze, nothing is lost) -> load -> label ->
        resume. Pausing makes the version tags exact: no token is sampled with new weights under
        the old label. Requests running across the update continue afterwards (an in-flight
        update) with spans for both versions. Pause + load are bounded by ``weightsync.timeout_s``
        (or ``timeout_s``); on timeout or failure the engine keeps its previous weights and label
        (the worker refuses a load that arrives after the deadline).
        Returns timings in seconds.
        """
        if handle.version != version:
            raise ValueError(f"handle carries v{handle.version} but update_weights was asked for v{version}; "
                             "pass the version the handle was sent with")
        timeout = self.sync_cfg.timeout_s if timeout_s is None else timeout_s
        deadline = time.time() + timeout
        t0 = time.perf_counter()
        pause_here = not self._paused
        try:
            if pause_here:
                await _stage("pause", version, self.engine.pause_generation(mode="keep", clear_cache=False),
                             deadline)
            per_worker = await _stage("load", version, self.engine.collective_rpc(
                "relayrl_load_weights", args=(handle.to_dict(), deadline)), deadline)
            # Once weights are in, the label must follow: it gets its own window, not the leftover.
            await _stage("label", version, self.engine.update_weight_version(str(version)),
                         time.time() + max(timeout, CONTROL_TIMEOUT_S))
        finally:
            if pause_here:  # must run even after a timed-out load, so again a window of its own
                await _stage("resume", version, self.engine.resume_generation(),
                             time.time() + max(timeout, CONTROL_TIMEOUT_S))
        return {"sync_s": time.perf_counter() - t0,
                "open_s": max(w["open_s"] for w in per_worker), "load_s": max(w["load_s"] for w in per_worker)}

    async def weight_version(self) -> int:
        """The version label new tokens are tagged with."""
        return parse_version(await self.engine.get_weight_version())

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """``[T-1]``: log p(token_i | tokens_<i) for i = 1..T-1 under the engine's current weights."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = await self._final_output(TokensPrompt(prompt_token_ids=list(token_ids)), params)
        return [pos[tok].logprob for tok, pos in zip(token_ids[1:], list(final.prompt_logprobs)[1:])]

    async def param_digests(self) -> dict[str, str]:
        """sha256 per engine parameter (first worker); tests use it to check syncs are bit-exact."""
        return (await self.engine.collective_rpc("relayrl_param_digests"))[0]

    async def pause(self, mode: str = "keep") -> None:
        """Stop scheduling. ``keep`` freezes running requests (they finish after ``resume``);
        ``abort`` ends them; ``wait`` lets them finish first."""
        await self.engine.pause_generation(mode=mode, clear_cache=mode != "keep")
        self._paused = True

    async def resume(self) -> None:
        await self.engine.resume_generation()
        self._paused = False

    def shutdown(self) -> None:
        self.engine.shutdown()


async def _stage(name: str, version: int, awaitable: Any, deadline: float) -> Any:
    """Await one weight-sync stage until wall-clock ``deadline``; errors become one line naming it."""
    try:
        return await asyncio.wait_for(awaitable, max(deadline - time.time(), 0.0))
    except asyncio.TimeoutError:
        raise TimeoutError(f"weight sync v{version}: stage {name!r} ran past weightsync.timeout_s; "
                           "the engine keeps its previous weights (raise weightsync.timeout_s if "
                           "the weights are large)") from None
    except Exception as exc:
        last = (str(exc).strip().splitlines() or [repr(exc)])[-1]
        raise RuntimeError(f"weight sync v{version}: stage {name!r} failed: {last}") from exc


def _trajectory(prompt_id: int, prompt_token_ids: list[int], completion: Any, seconds: float) -> Trajectory:
    """One vLLM ``CompletionOutput`` -> ``Trajectory`` (sampled-token logprobs, version spans)."""
    tokens = list(completion.token_ids)
    logprobs = [pos[tok].logprob for tok, pos in zip(tokens, completion.logprobs)]
    spans = [VersionSpan(parse_version(s.version), s.start, s.end) for s in completion.weight_versions or []]
    if tokens and not spans:
        raise RuntimeError("vLLM reported no weight_versions for a finished completion; "
                           "relayrl needs vLLM>=0.32 (CompletionOutput.weight_versions)")
    return Trajectory(prompt_id=prompt_id, sample_idx=completion.index, prompt_token_ids=list(prompt_token_ids),
                      completion_token_ids=tokens, behaviour_logprobs=logprobs, completion_text=completion.text,
                      finish_reason=completion.finish_reason or "length", versions=spans, gen_seconds=seconds)


def cpu_thread_env(rollout_cfg: RolloutConfig) -> dict[str, str]:
    """vLLM-CPU thread binding: by default it binds one core and reserves the rest for other work; in
    sync mode the engine runs alone, so bind ``num_threads`` cores (0: all). Empty on CUDA machines."""
    import os

    import torch

    if torch.cuda.is_available():
        return {}
    n = rollout_cfg.num_threads or os.cpu_count() or 1
    return {"VLLM_CPU_OMP_THREADS_BIND": f"0-{n - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def start_rollout_actor(model_path: str, model_cfg: ModelConfig, rollout_cfg: RolloutConfig, seed: int,
                        sync_cfg: WeightSyncConfig | None = None, **options: Any) -> Any:
    """Start a ``RolloutActor`` as a Ray actor asking for ``rollout_cfg.num_cpus`` CPUs.

    ``options`` go to ``ray.remote(...).options`` (e.g. a placement-group scheduling strategy).
    Returns the actor handle; ``ray.get(handle.info.remote())`` waits until the engine is up.
    """
    import ray

    cls = ray.remote(RolloutActor)
    options = {"num_cpus": rollout_cfg.num_cpus, "runtime_env": {"env_vars": cpu_thread_env(rollout_cfg)}, **options}
    return cls.options(**options).remote(
        model_path, model_cfg, rollout_cfg, seed, sync_cfg)
