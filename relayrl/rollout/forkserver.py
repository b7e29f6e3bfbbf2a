"""CPU engines: vLLM's engine-core and worker processes forked from a server that has vLLM imported.

A vLLM engine on CPU is three processes: the rollout actor (``AsyncLLM``), the engine core, and its worker
(vLLM's CPU platform needs the multiprocess executor). vLLM starts each child with ``spawn``: a fresh
interpreter that imports torch and vLLM again, 7.6 s per import of ``vllm.v1.engine.core`` on this 2-core
box, twice, one after the other, before the engine loads a weight. (Plain ``fork`` is not an option: vLLM
forces ``spawn`` inside a Ray actor, and a child forked from a process whose OpenMP runtime is already set
up keeps the parent's thread count and never binds the cores vLLM's CPU worker asks for.)

``use_forkserver`` makes both children come from one Python ``forkserver`` started by the actor, which
imports vLLM once (``PRELOAD``) and forks a child per request. Each child then behaves as if spawned:

- it takes its parent's environment *as it is at* ``start()`` (``_Process``): vLLM sets the worker's
  ``OMP_NUM_THREADS`` and CPU binding variables around ``start()``, which a spawned child reads at birth;
- it binds itself to the cores vLLM chose for it and sizes torch's OpenMP pool from that
  ``OMP_NUM_THREADS`` before vLLM runs (``omp_cpus``: a spawned child's OpenMP runtime reads both from
  the environment when it loads, but the server loaded it under the actor's environment; sizing a pool
  nobody has used yet is safe, running one is not - the server never computes). The pool's threads share
  the worker's cores rather than each being pinned to one;
- its own children come from the same server (``adopt_server``; Python would start a second one);
- its vLLM queue readers sleep between checks instead of spinning (``queuepoll``, ``rollout.queue_poll_us``).

The server is single-threaded and computes nothing; it exits when the actor and every child it made have
closed their end of its "alive" pipe. The children stay in the actor's process tree (actor -> server ->
engine core, worker), so ``cleanup.kill_process_tree(actor pid)`` still reaches them.
"""

from __future__ import annotations

import os
from multiprocessing import context as mp_context
from multiprocessing import forkserver, resource_tracker
from typing import Any, Callable

from relayrl.rollout.queuepoll import sleep_between_polls_if_asked

PRELOAD = ["vllm.v1.engine.core", "vllm.v1.executor.multiproc_executor", "vllm.v1.worker.cpu_worker",
           "relayrl.rollout.forkserver"]
"""Imported once by the server: everything the engine core and its worker import before they work."""


def _run(env: dict[str, str], target: Callable, args: tuple, kwargs: dict) -> Any:
    """The child's entry point: the parent's environment, its thread count, the shared server, then vLLM."""
    title_ready()
    os.environ.clear()
    os.environ.update(env)
    adopt_server()
    patch_vllm()
    sleep_between_polls_if_asked()
    if cpus := omp_cpus(env):
        os.sched_setaffinity(0, cpus)      # the OpenMP threads torch starts later inherit it
    if threads := env.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(int(threads))
    return target(*args, **kwargs)


def title_ready() -> None:
    """Let ``setproctitle`` find this process's argv while ``environ`` is still where exec put it (it walks
    back from there, once, on first use); vLLM names its processes with it (``VLLM::EngineCore``,
    ``VLLM::Worker``: what ``ps``, operators and the chaos tests look for)."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.getproctitle()


def omp_cpus(env: dict[str, str]) -> set[int]:
    """The cores vLLM binds a CPU worker's OpenMP threads to, from the variables it sets for the worker
    (``GOMP_CPU_AFFINITY="0 1"`` with GNU OpenMP, else ``OMP_PLACES="{0,1}"``); empty when it sets none.
    A spawned worker's OpenMP runtime reads them when it loads; a forked one loaded it already."""
    if spec := env.get("GOMP_CPU_AFFINITY"):
        return {int(c) for c in spec.split()}
    if spec := env.get("OMP_PLACES"):
        return {int(c) for c in spec.strip("{}").split(",") if c}
    return set()


class _Process(mp_context.ForkServerProcess):
    """A forkserver child that receives its parent's environment as it is when ``start()`` runs."""

    def __init__(self, group: Any = None, target: Callable | None = None, name: str | None = None,
                 args: tuple = (), kwargs: dict | None = None, *, daemon: bool | None = None) -> None:
        super().__init__(group, _run, name, ({}, target, tuple(args), dict(kwargs or {})), daemon=daemon)

    def start(self) -> None:
        self._args = (dict(os.environ), *self._args[1:])
        super().start()


class EngineContext(mp_context.ForkServerContext):
    """``multiprocessing`` context whose processes are ``_Process``es."""

    Process = _Process


CONTEXT = EngineContext()


def engine_context() -> EngineContext:
    """Stands in for vLLM's ``get_mp_context`` (same signature)."""
    return CONTEXT


def patch_vllm() -> None:
    """Make vLLM's engine-core launcher and multiprocess executor take their processes from ``CONTEXT``."""
    import vllm.v1.engine.utils as engine_utils
    import vllm.v1.executor.multiproc_executor as executor

    engine_utils.get_mp_context = executor.get_mp_context = engine_context


def adopt_server() -> None:
    """In a child of the server: connect to that server for children of its own, instead of starting one.

    Python's server hands each child its address and "alive" pipe end, but only the process that started
    the server knows its pid, and ``ensure_running`` starts a new server when it has none."""
    server = forkserver._forkserver
    if server._forkserver_pid is None and server._forkserver_address is not None:
        server.ensure_running = resource_tracker.ensure_running


def use_forkserver() -> None:
    """In the rollout actor, first thing: start vLLM's processes from a preloaded server. The server starts
    now and imports ``PRELOAD`` while the actor imports vLLM itself (two single-threaded imports side by
    side, instead of the server's after the actor's when ``AsyncLLM`` forks its first child)."""
    CONTEXT.set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()
    patch_vllm()
