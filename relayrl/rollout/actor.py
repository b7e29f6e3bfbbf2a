"""The rollout actor: one vLLM ``AsyncLLM`` engine behind a Ray actor, producing version-tagged groups.

    controller --generate(prompts, G)--> RolloutActor --one request per prompt, n=G--> AsyncLLM
    trainer rank 0 --start/update/finish_weight_update(v)--> RolloutActor --> vLLM weight-transfer engine
                                                               \\--> engine weight version := v

``Rollout`` holds the ``AsyncLLM`` and does the work; ``RolloutActor`` (the Ray actor) runs it in its own
process, or for a CPU engine with ``rollout.forkserver`` (the default) in an engine host forked from the
server that has vLLM imported since launch (``relayrl.rollout.host``), so the actor never imports vLLM.

Every completion token is tagged with the weight version that sampled it; vLLM itself reports
these as contiguous spans (``CompletionOutput.weight_versions``), so a completion that straddles
an in-flight update carries two spans. Behaviour logprobs are those of the *sampling*
distribution (``logprobs_mode="processed_logprobs"``: after temperature and top-p), which is
what importance ratios pi/mu need.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from relayrl.config import (
    CPU_MALLOC_ENV,
    WORKER_ENV,
    Config,
    ModelConfig,
    RolloutConfig,
    WeightSyncConfig,
    has_cuda,
    malloc_env,
    with_env,
)
from relayrl.data.sampler import Prompt
from relayrl.envs import env_factory
from relayrl.rollout.cleanup import forget_owned
from relayrl.rollout.episode import EpisodeRunner, check_prompts, vllm_sample_turn
from relayrl.rollout.forkserver import shared_actor_env, start_forkserver, start_shared, stop_shared
from relayrl.rollout.host import HostedRollout, invoke
from relayrl.rollout.outputs import model_turn, parse_version
from relayrl.rollout.queuepoll import POLL_ENV
from relayrl.types import Trajectory, TrajectoryGroup
from relayrl.vllm_import import import_vllm
from relayrl.weightsync import KEEP_ENV

EXTENSION = "relayrl.weightsync.worker.WeightSyncExtension"
WATCHDOG_STAGES = 3  # an open weight update is aborted after this many stage timeouts
DEATH_POLL_S = 0.1  # how often an engine call in flight checks that its engine is alive
T = TypeVar("T")


CPU_SHARED_BLOCK = 32
"""KV block size of CPU engines that share prompts: only full blocks are cached, vLLM's CPU default of 128
tokens would share nothing of a shorter prompt, and its CPU attention takes multiples of 32."""


def engine_args(
    model_path: str, model_cfg: ModelConfig, rollout_cfg: RolloutConfig, seed: int, sync_cfg: WeightSyncConfig
) -> Any:
    """vLLM engine arguments from our configs.

    Prefix caching is on only with ``rollout.prefix_sharing`` (sync runs): after a weight update, cached
    prompt KV computed with old weights would be reused by new requests, and vLLM can only reset that
    cache when nothing runs, which in a sync run is every commit (``finish_weight_update`` resets it).
    ``rollout.tp_size > 1`` (GPU): the engine's workers are this actor's own processes ("mp"), on the
    ``tp_size`` GPUs Ray gave the actor; left to itself vLLM would see the placement group and start Ray
    workers that ask for GPUs the actor already holds. Each worker receives the full weights at a sync
    and its ``load_weights`` keeps its own shard.
    Chunked prefill is off on CPU: with more prompt tokens waiting than one step schedules, vLLM splits a
    prompt across steps and, for a seeded request, rewinds its generator, which a CPU generator cannot do
    (the engine dies: "CPU Generator does not use offset"). Unsplit, every prompt is prefilled whole in one
    step (at most ``max_model_len`` tokens, so the step budget is raised to that where it is lower).
    """
    from vllm.engine.arg_utils import AsyncEngineArgs

    from relayrl.weightsync import engine_config

    # Keys passed only on some boxes; typed Any so each value is not checked against every keyword.
    box: dict[str, Any] = {}
    if rollout_cfg.prefix_sharing and not has_cuda():
        box["block_size"] = CPU_SHARED_BLOCK
    if not has_cuda():
        box.update(enable_chunked_prefill=False, max_num_batched_tokens=max(2048, model_cfg.max_model_len))
    return AsyncEngineArgs(
        model=model_path,
        dtype=model_cfg.dtype,  # type: ignore[arg-type]  # a str that ModelConfig checks is float32 | bfloat16
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
        distributed_executor_backend="mp" if rollout_cfg.tp_size > 1 else None,
        **box,
    )


def gpu_actor() -> bool:
    """Ray gave this actor GPUs. Inside a Ray actor the same answer as ``has_cuda`` (Ray hides the GPUs it did
    not assign), without importing torch: a CPU engine's fork server starts before the actor's first heavy
    import, so the server's vLLM import and the actor's run side by side from the start."""
    import ray

    return bool(ray.get_gpu_ids()) if ray.is_initialized() else has_cuda()


class RolloutActor:
    """Owns one engine. Run it as a Ray actor (``start_rollout_actor``); methods are async.

    The engine's client (``Rollout``) runs in this process, or for a CPU engine with ``rollout.forkserver`` in
    an engine host forked from the preloaded server (``relayrl.rollout.host``), so that this process never
    imports vLLM. Every public method of ``Rollout`` is one of this class's (``_forward``)."""

    def __init__(
        self,
        model_path: str,
        model_cfg: ModelConfig,
        rollout_cfg: RolloutConfig,
        seed: int,
        sync_cfg: WeightSyncConfig | None = None,
    ):
        t0 = time.perf_counter()
        args = (model_path, model_cfg, rollout_cfg, seed, sync_cfg)
        if rollout_cfg.forkserver and not gpu_actor():
            start_forkserver()
            self.core: HostedRollout | LocalRollout = HostedRollout(*args)
        else:
            self.core = LocalRollout(*args)
        self.start_seconds = time.perf_counter() - t0

    async def info(self) -> dict[str, Any]:
        """Static facts: engine start time, vLLM workers in this engine (group ranks a sync needs), dead
        engines' shared-memory segments removed before it started, and where this actor runs (node, pid),
        so that a replica hung beyond answering can still have its engine processes killed."""
        import ray

        return {
            **await self.core.call("info"),
            "start_seconds": self.start_seconds,
            "node": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }

    async def modules_loaded(self, names: list[str]) -> dict[str, list[bool]]:
        """Which of ``names`` are imported in this actor's process, the engine's client and its first worker;
        for tests."""
        return {"actor": [name in sys.modules for name in names], **await self.core.call("modules_loaded", (names,))}

    async def shutdown(self) -> None:
        """Shut the engine down (and its host), then forget the processes registered under this actor."""
        self.core.close()
        forget_owned(os.getpid())


def _forward(name: str) -> Callable:
    """``RolloutActor.<name>``: ``Rollout.<name>`` on this actor's core, with its docstring."""

    async def method(self: RolloutActor, *args: Any, **kwargs: Any) -> Any:
        return await self.core.call(name, args, kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = getattr(Rollout, name).__doc__
    return method


class LocalRollout:
    """A ``Rollout`` in this process, called as ``HostedRollout`` calls its host's."""

    def __init__(self, *args: Any) -> None:
        self.rollout = Rollout(*args)

    async def call(self, name: str, args: tuple = (), kwargs: dict | None = None) -> Any:
        return await invoke(self.rollout, name, args, kwargs or {})

    def close(self) -> None:
        self.rollout.shutdown()


class Rollout:
    """One vLLM ``AsyncLLM`` and the calls the controller and trainers make on it (``RolloutActor`` runs it in
    its own process or in an engine host)."""

    def __init__(
        self,
        model_path: str,
        model_cfg: ModelConfig,
        rollout_cfg: RolloutConfig,
        seed: int,
        sync_cfg: WeightSyncConfig | None = None,
    ):
        from relayrl.rollout.cleanup import cleanup_engine_segments

        # On this engine's host, before it starts: the message-queue segments of engines that died here
        # (a replica this one replaces, earlier runs killed with SIGKILL) go; live engines' stay.
        self.shm_removed = len(cleanup_engine_segments().removed)
        self.rollout_cfg = rollout_cfg
        self.sync_cfg = sync_cfg or WeightSyncConfig()
        os.environ[KEEP_ENV] = str(int(self.sync_cfg.commit == "inplace"))  # read by the engine's processes
        if rollout_cfg.forkserver:
            os.environ[POLL_ENV] = str(rollout_cfg.queue_poll_us)  # read by the processes the server forks
        import_vllm()
        from vllm.v1.engine.async_llm import AsyncLLM

        self.engine = AsyncLLM.from_engine_args(engine_args(model_path, model_cfg, rollout_cfg, seed, self.sync_cfg))
        self._paused = False
        self._pause_here = False
        self._update: tuple[int, float] | None = None  # (version, start time) of the open weight update
        self._watchdog: asyncio.Task | None = None
        self.aborts = 0  # updates aborted by anyone: trainer, driver or watchdog
        self.last_abort = ""  # the latest one: "v<version>: <reason>"

    async def _call(self, call: Awaitable[T]) -> T:
        return await unless_dead(self.engine, call)

    def info(self) -> dict[str, int]:
        """vLLM workers in this engine, dead engines' shared-memory segments removed before it started, and the
        pid of this process (the engine's client: the actor's or its engine host's)."""
        return {
            "workers": self.engine.vllm_config.parallel_config.world_size,
            "shm_segments_removed": self.shm_removed,
            "client_pid": os.getpid(),
        }

    async def generate(self, prompts: list[Prompt], group_size: int) -> list[TrajectoryGroup]:
        """Sample ``group_size`` completions for each prompt, concurrently.

        With ``seed`` (the sampler sets it), sample ``i`` is drawn with its own generator seeded ``seed + i``
        (vLLM gives each of a request's ``n`` children ``seed + index``), independent of the engine's seed,
        its other requests and its history: a restarted replica or a resumed run samples the same tokens
        from the same weights. Without it, the engine's random state is used. A prompt's ``temperature``
        overrides ``rollout.temperature`` for it (0: greedy; evaluation during training uses it)."""
        check_prompts(prompts, group_size)
        return list(await asyncio.gather(*(self._generate_group(p, group_size) for p in prompts)))

    async def _generate_group(self, prompt: Prompt, group_size: int) -> TrajectoryGroup:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        cfg = self.rollout_cfg
        temperature = cfg.temperature if prompt.temperature is None else prompt.temperature
        params = SamplingParams(
            n=group_size,
            logprobs=0,
            temperature=temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            output_kind=RequestOutputKind.FINAL_ONLY,
            seed=prompt.seed,
        )
        t0 = time.perf_counter()
        if cfg.prefix_sharing and group_size > 1:  # the prompt's KV, computed once, cached for the group
            warm = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY)
            await self._final_output(prompt.prompt, warm)
        final = await self._final_output(prompt.prompt, params)
        seconds = time.perf_counter() - t0
        trajs = [
            _trajectory(prompt.prompt_id, final.prompt_token_ids, c, seconds)
            for c in sorted(final.outputs, key=lambda c: c.index)
        ]
        return TrajectoryGroup(prompt.prompt_id, prompt.prompt, dict(prompt.columns), trajs)

    async def generate_episodes(
        self,
        prompts: list[Prompt],
        group_size: int,
        env_name: str,
        max_turns: int,
        env_kwargs: dict[str, Any] | None = None,
    ) -> list[TrajectoryGroup]:
        """Multi-turn: ``group_size`` episodes per prompt of environment ``env_name`` (``relayrl.envs``: a
        built-in name or ``module:Class``, built with ``env_kwargs``), model and environment turns alternating
        for up to ``max_turns`` model turns. Environment tokens are masked (``relayrl.rollout.episode``)."""
        runner = EpisodeRunner(
            vllm_sample_turn(self._final_output, self.rollout_cfg),
            self.engine.tokenizer,
            max_turns,
            self.rollout_cfg.max_tokens,
            self.engine.model_config.max_model_len,
        )
        make_env = env_factory(env_name, env_kwargs)
        return list(await asyncio.gather(*(runner.run_group(p, group_size, make_env) for p in prompts)))

    async def _final_output(self, prompt: Any, params: Any) -> Any:
        final = None
        async for out in self.engine.generate(prompt, params, request_id=uuid.uuid4().hex):
            final = out
        if final is None:
            raise RuntimeError("vLLM returned no output for a request; was the engine paused with mode=abort?")
        return final

    # ---- weight sync: the engine side of the transaction (see relayrl.weightsync.base) ---------
    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        """Set up (or re-set up, after an abort broke it) the transfer channel on every worker."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        request = WeightTransferInitRequest(init_info=init_info)
        await self._call(self.engine.init_weight_transfer_engine(request))

    async def start_weight_update(self, version: int, timeout_s: float) -> None:
        """Pause (``keep``: running requests freeze, nothing is lost) and open an update of ``version``.

        Pausing makes version tags exact: no token is sampled with new weights under the old label.
        A watchdog aborts the update if neither commit nor abort arrives within ``WATCHDOG_STAGES *
        timeout_s`` (the trainer and the driver may both be gone), so the engine never stays paused.
        """
        if self._update is not None:
            await self.abort_weight_update(f"v{self._update[0]} was still open when v{version} started")
        self._pause_here = not self._paused
        if self._pause_here:
            # The engine-core call behind ``pause_generation``: the wrapper then sleeps 20 ms only so that
            # outputs already sampled reach their callers first ("not required for correctness", says
            # vLLM), and a sync's fixed cost is a few ms, so the sleep would dominate small models.
            await self._call(self.engine.engine_core.pause_scheduler_async(mode="keep", clear_cache=False))
        self._update = (version, time.perf_counter())
        self._watchdog = asyncio.create_task(self._expire(self._update, WATCHDOG_STAGES * timeout_s))
        await self._call(self.engine.start_weight_update())

    async def update_weights(self, update_info: dict[str, Any]) -> None:
        """Transfer + verify on every worker; the model is not touched until ``finish_weight_update``."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        await self._call(self.engine.update_weights(WeightTransferUpdateRequest(update_info=update_info)))

    async def finish_weight_update(self, version: int) -> float:
        """Commit: load the verified payload, label new tokens ``version``, resume. Returns the stall (s)."""
        if self._update is None or self._update[0] != version:
            raise RuntimeError(
                f"commit of v{version} without an open update of it (open: {self._update}); "
                "it was aborted, possibly by the watchdog"
            )
        await self._drop_prefix_cache(f"commit of v{version}")
        await self._call(self.engine.finish_weight_update(weight_version=str(version)))
        return await self._close_update()

    async def _drop_prefix_cache(self, why: str) -> None:
        """Empty vLLM's prefix cache (``rollout.prefix_sharing``) before the weights change: raises, and so
        fails the commit with the old weights kept, if a running request holds cached blocks."""
        if self.rollout_cfg.prefix_sharing and not await self._call(self.engine.reset_prefix_cache()):
            raise RuntimeError(
                f"{why}: vLLM could not empty its prefix cache (requests are running); "
                "set rollout.prefix_sharing=false for runs that update weights mid-generation"
            )

    async def abort_weight_update(self, reason: str = "") -> float:
        """Drop the staged payload and resume on the previous weights and label. Idempotent."""
        if self._update is None:
            return 0.0
        self.aborts += 1
        self.last_abort = f"v{self._update[0]}: {reason}"
        try:
            await self._call(self.engine.collective_rpc("relayrl_abort_weight_update"))
        finally:
            stall = await self._close_update()
        return stall

    async def _close_update(self) -> float:
        if self._update is None:  # a commit and an abort overlapped across an await: the first one closed it
            raise RuntimeError("weight update closed twice")
        _, t0 = self._update
        self._update = None
        if self._watchdog is not None and self._watchdog is not asyncio.current_task():
            self._watchdog.cancel()
        if self._pause_here:
            await self._call(self.engine.resume_generation())
        return time.perf_counter() - t0

    async def _expire(self, update: tuple[int, float], after_s: float) -> None:
        await asyncio.sleep(after_s)
        if self._update is update:
            await self.abort_weight_update(f"no commit within {after_s:g}s (watchdog)")

    def weight_update_state(self) -> dict[str, Any]:
        """The open update's version (None: none open), how many updates were aborted, and the latest
        abort (``v<version>: <reason>``; the watchdog's ends in "(watchdog)"): what tells who ended an
        update whose trainer died, in tests and for an engine whose version did not move."""
        return {"open": self._update[0] if self._update else None, "aborts": self.aborts, "last_abort": self.last_abort}

    async def weight_version(self) -> int:
        """The version label new tokens are tagged with."""
        return parse_version(await self._call(self.engine.get_weight_version()))

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """``[T-1]``: log p(token_i | tokens_<i) for i = 1..T-1 under the engine's current weights."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=1, prompt_logprobs=0, temperature=1.0, output_kind=RequestOutputKind.FINAL_ONLY
        )
        final = await self._final_output(TokensPrompt(prompt_token_ids=list(token_ids)), params)
        return [pos[tok].logprob for tok, pos in zip(token_ids[1:], list(final.prompt_logprobs)[1:])]

    async def cpu_binding(self) -> dict[str, Any]:
        """CPU engines: the first worker's cores, torch threads and pid (``relayrl_cpu_binding``); for tests."""
        return (await self._call(self.engine.collective_rpc("relayrl_cpu_binding")))[0]

    async def modules_loaded(self, names: list[str]) -> dict[str, list[bool]]:
        """Which of ``names`` are imported here (the engine's client) and in the engine's first worker
        (``relayrl_modules_loaded``); for tests."""
        worker = (await self._call(self.engine.collective_rpc("relayrl_modules_loaded", args=(names,))))[0]
        return {"client": [name in sys.modules for name in names], "worker": worker}

    async def param_digests(self) -> dict[str, str]:
        """sha256 per engine parameter (first worker); tests use it to check syncs are bit-exact."""
        return (await self._call(self.engine.collective_rpc("relayrl_param_digests")))[0]

    async def pause(self, mode: Literal["abort", "wait", "keep"] = "keep") -> None:
        """Stop scheduling. ``keep`` freezes running requests (they finish after ``resume``);
        ``abort`` ends them; ``wait`` lets them finish first."""
        await self._call(self.engine.pause_generation(mode=mode, clear_cache=mode != "keep"))
        self._paused = True

    async def resume(self) -> None:
        await self._call(self.engine.resume_generation())
        self._paused = False

    async def sleep(self) -> None:
        """Colocated mode, before training: free the engine's memory (vLLM sleep level 1: weights offloaded,
        KV cache dropped). On CPU vLLM ignores it (with a warning): the bundle's cores are simply idle."""
        await self._call(self.engine.sleep(level=1, mode="wait"))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self._call(self.engine.wake_up(tags))
        await self._drop_prefix_cache("wake-up")  # sleep dropped the KV memory the cache points into

    def shutdown(self) -> None:
        self.engine.shutdown()


for _name, _fn in list(vars(Rollout).items()):
    if callable(_fn) and not _name.startswith("_") and _name not in vars(RolloutActor):
        setattr(RolloutActor, _name, _forward(_name))


async def unless_dead(engine: Any, call: Awaitable[T]) -> T:
    """Await an ``AsyncLLM`` control call (pause, weight transfer, ``collective_rpc``...), raising vLLM's
    ``EngineDeadError`` as soon as ``engine`` is dead. vLLM fails the requests in flight when its engine
    core dies but leaves such a call waiting forever: a sync caught by an engine's death would hold the
    run for ``weightsync.timeout_s``, and a caller without a deadline for good."""
    task = asyncio.ensure_future(call)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DEATH_POLL_S)
            if not task.done() and engine.errored:
                raise engine.dead_error
        return task.result()
    finally:
        task.cancel()


def _trajectory(prompt_id: int, prompt_token_ids: list[int], completion: Any, seconds: float) -> Trajectory:
    """One vLLM ``CompletionOutput`` -> ``Trajectory`` (parsed by ``outputs.model_turn``)."""
    turn = model_turn(completion)
    return Trajectory(
        prompt_id=prompt_id,
        sample_idx=completion.index,
        prompt_token_ids=list(prompt_token_ids),
        completion_token_ids=turn.token_ids,
        behaviour_logprobs=turn.logprobs,
        completion_text=turn.text,
        finish_reason=turn.finish_reason,
        versions=turn.versions,
        gen_seconds=seconds,
    )


def cpu_thread_env(rollout_cfg: RolloutConfig) -> dict[str, str]:
    """vLLM-CPU thread binding: by default it binds one core and reserves the rest for other work; in
    sync mode the engine runs alone, so bind ``num_threads`` cores (0: all). They are the *last* cores,
    so that with fewer threads (async: rollout and trainer side by side) the trainer keeps core 0 up.
    Empty on CUDA machines."""
    if has_cuda():
        return {}
    cores = os.cpu_count() or 1
    n = min(rollout_cfg.num_threads or cores, cores)
    return {"VLLM_CPU_OMP_THREADS_BIND": f"{cores - n}-{cores - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def eager_env(rollout_cfg: RolloutConfig) -> dict[str, str]:
    """``TORCHDYNAMO_DISABLE=1`` for a CPU engine that runs eagerly (``rollout.enforce_eager``, the default):
    vLLM still wraps sampler helpers in ``torch.compile``, and the first generate that asks for logprobs (every
    one here: behaviour logprobs) compiled the rank count (``batched_count_greater_than``) with Inductor, a
    C++ build inside the first generate, on the path to the first step. Eager, that helper is one comparison
    and a sum over the vocabulary, which needs no compiler. Empty on CUDA machines and for compiled engines."""
    return {} if has_cuda() or not rollout_cfg.enforce_eager else dict(EAGER_ENV)


EAGER_ENV = {"TORCHDYNAMO_DISABLE": "1"}


def engine_env(rollout_cfg: RolloutConfig) -> dict[str, str]:
    """The variables a rollout actor's runtime env sets (its engine's processes inherit them)."""
    return {**cpu_thread_env(rollout_cfg), **malloc_env(), **eager_env(rollout_cfg)}


LAUNCH_ENV = {**WORKER_ENV, **CPU_MALLOC_ENV, **EAGER_ENV}
"""What a default CPU rollout actor's process has set (Ray's and its own runtime env): the driver's server
starts with it, before the run's config is read."""


def start_driver_forkserver() -> None:
    """In ``relayrl train``, at launch: start the fork server for CPU engines with ``LAUNCH_ENV``, its vLLM
    import beside the driver's start (``forkserver.start_shared``). Not on hosts with NVIDIA devices
    (checked without importing torch)."""
    if not list(Path("/dev").glob("nvidia[0-9]*")):
        start_shared(LAUNCH_ENV)


def keep_driver_forkserver(cfg: Config) -> None:
    """Stop the driver's fork server unless this run's rollout actors will adopt it: CPU engines on this
    host (no ``run.ray_address``) with ``rollout.forkserver`` and the variables it was started with."""
    adopts = cfg.rollout.forkserver and not cfg.run.ray_address and not has_cuda()
    if not (adopts and shared_actor_env({**WORKER_ENV, **engine_env(cfg.rollout)})):
        stop_shared()


def start_rollout_actor(
    model_path: str,
    model_cfg: ModelConfig,
    rollout_cfg: RolloutConfig,
    seed: int,
    sync_cfg: WeightSyncConfig | None = None,
    **options: Any,
) -> Any:
    """Start a ``RolloutActor`` as a Ray actor asking for ``rollout_cfg.num_cpus`` CPUs.

    ``options`` go to ``ray.remote(...).options`` (e.g. a placement-group scheduling strategy).
    Returns the actor handle; ``ray.get(handle.info.remote())`` waits until the engine is up.
    """
    import ray

    cls = ray.remote(RolloutActor)
    env = engine_env(rollout_cfg)
    if rollout_cfg.forkserver:
        env |= shared_actor_env({**WORKER_ENV, **env})
    options = with_env({"num_cpus": rollout_cfg.num_cpus, **options}, env)
    return cls.options(**options).remote(model_path, model_cfg, rollout_cfg, seed, sync_cfg)
