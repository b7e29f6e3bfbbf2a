"""The rollout actor: one vLLM engine behind a Ray actor, producing version-tagged groups.

    controller --generate(prompts, G)--> RolloutActor --one request per prompt, n=G--> AsyncLLM
    trainer rank 0 --start/update/finish_weight_update(v)--> RolloutActor --> vLLM weight-transfer engine
                                                               \\--> engine weight version := v

``Rollout`` (``relayrl.rollout.engine``) holds the ``AsyncLLM`` and does the work; ``RolloutActor`` (the Ray
actor) runs it in its own process (``LocalRollout``), or for a CPU engine with ``rollout.forkserver`` (the
default) in an engine host forked from the server that has vLLM imported since launch (``HostedRollout``,
``relayrl.rollout.host``), so the actor never imports vLLM. Every public method of ``Rollout`` is one of
the actor's. This module also holds the environment the actor and its engine processes start with.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from relayrl.rollout.cleanup import forget_owned
from relayrl.rollout.engine import Rollout
from relayrl.rollout.forkserver import shared_actor_env, start_forkserver, start_shared, stop_shared
from relayrl.rollout.host import HostedRollout, invoke


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


for _name, _fn in list(vars(Rollout).items()):
    if callable(_fn) and not _name.startswith("_") and _name not in vars(RolloutActor):
        setattr(RolloutActor, _name, _forward(_name))


def cpu_thread_env(rollout_cfg: RolloutConfig) -> dict[str, str]:
    """vLLM-CPU thread binding: by default it binds one core and reserves the rest for other work; in
    sync mode the engine runs alone, so bind ``num_threads`` cores (0: all). They are the *last* cores,
    so that with fewer threads (async: rollout and trainer side by side) the trainer keeps core 0 up.
    An engine of several workers (``rollout.workers``) splits them, one run of cores a worker ("|" between
    them, vLLM's syntax); with fewer cores than workers, workers share one. Empty on CUDA machines."""
    if has_cuda():
        return {}
    cores = os.cpu_count() or 1
    n = min(rollout_cfg.num_threads or cores, cores)
    binds = core_binds(cores - n, n, rollout_cfg.workers)
    return {"VLLM_CPU_OMP_THREADS_BIND": binds, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def core_binds(first: int, n: int, workers: int) -> str:
    """Cores first .. first + n − 1 split into ``workers`` runs as vLLM's bind list: (0, 4, 2) -> "0-1|2-3",
    (1, 1, 1) -> "1-1", (0, 1, 2) -> "0-0|0-0"."""
    runs = []
    for w in range(workers):
        lo, hi = w * n // workers, (w + 1) * n // workers - 1
        lo, hi = (lo, hi) if hi >= lo else (w % n, w % n)
        runs.append(f"{first + lo}-{first + hi}")
    return "|".join(runs)


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
