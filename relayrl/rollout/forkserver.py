"""CPU engines: vLLM's engine-core and worker processes forked from a server that has vLLM imported.

A vLLM engine on CPU is three processes: its client (``AsyncLLM``), the engine core, and its worker
(vLLM's CPU platform needs the multiprocess executor). vLLM starts each child with ``spawn``: a fresh
interpreter that imports torch and vLLM again (``vllm.v1.engine.core`` is one of the heaviest imports a run
makes), twice, one after the other, before the engine loads a weight. (Plain ``fork`` is not an option: vLLM
forces ``spawn`` inside a Ray actor, and a child forked from a process whose OpenMP runtime is already set
up keeps the parent's thread count and never binds the cores vLLM's CPU worker asks for.)

``start_forkserver`` makes them come from one Python ``forkserver`` (started by the actor, or the driver's,
below), which imports vLLM once (``PRELOAD``) and forks a child per request: the client itself, in an engine
host (``relayrl.rollout.host``: the Ray actor then never imports vLLM), and the client's two children
(``patch_vllm``, run in every child; ``use_forkserver`` does both in the calling process). Each child then
behaves as if spawned:

- it takes its parent's environment *as it is at* ``start()`` (``_Process``): vLLM sets the worker's
  ``OMP_NUM_THREADS`` and CPU binding variables around ``start()``, which a spawned child reads at birth;
- it binds itself to the cores vLLM chose for it and sizes torch's OpenMP pool from that
  ``OMP_NUM_THREADS`` before vLLM runs (``omp_cpus``: a spawned child's OpenMP runtime reads both from
  the environment when it loads, but the server loaded it under the actor's environment; sizing a pool
  nobody has used yet is safe, running one is not - the server never computes). The pool's threads share
  the worker's cores rather than each being pinned to one;
- its own children come from the same server (``adopt_server``; Python would start a second one);
- the engine's first process (its host) starts the resource tracker the engine's processes share, which
  unlinks what they leave in /dev/shm when they are killed (``own_resource_tracker``);
- its vLLM queue readers sleep between checks instead of spinning (``queuepoll``, ``rollout.queue_poll_us``).

The server is single-threaded and computes nothing; it exits when the actor and every child it made have
closed their end of its "alive" pipe. The children stay in the actor's process tree (actor -> server ->
engine host, engine core, worker), so ``cleanup.kill_process_tree(actor pid)`` still reaches them.

**The driver's server.** ``relayrl train`` starts a server at launch (``start_shared``), so that its vLLM
import runs on the core the driver's single-threaded start (config, tokenizer, ``ray.init``) leaves idle,
seconds before any actor exists. A rollout actor on the driver's host whose environment matches the one the
server was started with (what glibc and the imports read: ``SharedServer.env``) adopts it (``adopt_shared``)
instead of starting its own. Its engine processes are then the driver server's children, outside the actor's
process tree, so each one (``_run``, ``OWNER_ENV``):

- writes to the actor's stdout and stderr (passed as file descriptors, as a spawned child inherits them);
- leaves the driver's process group (a Ctrl-C at the terminal reaches the driver, not the engine);
- is listed under the actor's pid (``cleanup.register``), where ``kill_process_tree(actor pid)`` finds it;
- kills itself when the actor dies (a thread waiting on the actor's pidfd), as a child in the actor's tree is
  taken down with it.

The driver's server ends with ``relayrl train`` (``stop_shared``), or at once when the run's engines would
not adopt it (``rollout.actor.keep_driver_forkserver``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing import context as mp_context
from multiprocessing import forkserver, reduction, resource_tracker
from typing import Any, Protocol, cast

from relayrl.rollout.queuepoll import sleep_between_polls_if_asked
from relayrl.vllm_import import import_vllm

PRELOAD = ["relayrl.rollout.preload"]
"""Imported once by the server: everything the engine core and its worker import before they work."""
SHARED_ENV = "RELAYRL_FORKSERVER"
"""Set on rollout actors (``shared_actor_env``) while the driver's server runs: its ``SharedServer`` as JSON."""
OWNER_ENV = "RELAYRL_ENGINE_OWNER"
"""In the environment of engine processes forked from the driver's server: the pid of their rollout actor."""
TRACKER_ENV = "RELAYRL_ENGINE_TRACKER"
"""In the environment of an engine's processes once the first of them runs its own resource tracker: its pid."""


def _run(env: dict[str, str], streams: _StdStreams, target: Callable, args: tuple, kwargs: dict) -> Any:
    """The child's entry point: the parent's environment and output, its owner, thread count and server, then
    vLLM."""
    title_ready()
    os.environ.clear()
    os.environ.update(env)
    streams.install()
    if owner := env.get(OWNER_ENV):
        belong_to(int(owner))
    own_resource_tracker()
    adopt_server()
    patch_vllm()
    sleep_between_polls_if_asked()
    if cpus := omp_cpus(env):
        os.sched_setaffinity(0, cpus)  # the OpenMP threads torch starts later inherit it
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


def belong_to(owner: int) -> None:
    """In a child of the driver's server: live as if in rollout actor ``owner``'s process tree (module doc)."""
    from relayrl.rollout.cleanup import register

    os.setpgid(0, 0)
    register(owner, os.getpid())
    try:
        pidfd = os.pidfd_open(owner)
    except ProcessLookupError:  # it died while this process started
        os._exit(1)
    threading.Thread(target=_die_with, args=(pidfd,), name="relayrl-owner", daemon=True).start()


def own_resource_tracker() -> None:
    """In the first process of an engine (its host): start a resource tracker of its own, which the engine's
    later processes inherit (``TRACKER_ENV``), instead of the one of the process that asked for it.

    In a process started by forkserver (or spawn) every ``multiprocessing`` lock or queue is a named POSIX
    semaphore, ``/dev/shm/sem.mp-*`` (the vLLM worker's is tqdm's write lock, made by the weight-loading bar
    and kept for the process's life), and vLLM's queues are ``SharedMemory`` segments, ``/dev/shm/psm_*``.
    Their creator unlinks them when it exits cleanly; when it is killed, its resource tracker unlinks them,
    once every process that writes to that tracker is gone. A forkserver child writes to the tracker of the
    process that asked for it: the rollout actor's, the actor's child. That tracker dies with the actor (Ray
    SIGKILLs a worker's children when the worker exits: a run killed, a driver gone; ``kill_process_tree``
    kills the actor's tree), so a killed engine's names stayed in /dev/shm. The host's own tracker is outside
    the actor's tree and process group (``belong_to``) and unlinks them once the host, the engine core and
    the worker are all gone, then exits; it ignores SIGINT and SIGTERM. (Under an actor's own server the
    engine, tracker included, is in the actor's tree, which ``kill_process_tree`` kills whole; an engine's
    start removes what that leaves: ``cleanup.cleanup_engine_segments``.)"""
    if os.environ.get(TRACKER_ENV):
        return
    tracker = cast(_TrackerState, resource_tracker._resource_tracker)
    if tracker._fd is not None:
        os.close(tracker._fd)  # the asking process's tracker: it lives and dies with that process
    tracker._fd = tracker._pid = None
    tracker.ensure_running()
    os.environ[TRACKER_ENV] = str(tracker._pid)  # copied into the children this process starts (_Process)


class _TrackerState(Protocol):
    """The private state of CPython's ``multiprocessing.resource_tracker.ResourceTracker`` (3.10-3.13) that
    ``own_resource_tracker`` resets: a forkserver child starts with the asking process's pipe in ``_fd``."""

    _fd: int | None
    _pid: int | None

    def ensure_running(self) -> None: ...


def _die_with(pidfd: int) -> None:
    select.select([pidfd], [], [])  # readable once the owner has exited
    os.kill(os.getpid(), signal.SIGKILL)


class _StdStreams:
    """The parent's stdout and stderr, sent to the child as file descriptors (a spawned child inherits them;
    a forkserver child would otherwise write wherever its server does)."""

    def __init__(self, fds: tuple = ()) -> None:
        self.fds = fds

    def __reduce__(self) -> tuple:
        return _StdStreams, ((reduction.DupFd(1), reduction.DupFd(2)),)  # pickled while the child starts

    def install(self) -> None:
        _redirect_std(tuple(dup.detach() for dup in self.fds))


class _Process(mp_context.ForkServerProcess):
    """A forkserver child that receives its parent's environment as it is when ``start()`` runs."""

    _args: tuple[Any, ...]  # BaseProcess keeps ``args`` here (private: typeshed does not declare it)

    def __init__(
        self,
        group: Any = None,
        target: Callable | None = None,
        name: str | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
        *,
        daemon: bool | None = None,
    ) -> None:
        super().__init__(group, _run, name, ({}, _StdStreams(), target, tuple(args), dict(kwargs or {})), daemon=daemon)

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
    import_vllm()  # first import here (the actor's): without Inductor
    import vllm.v1.engine.utils as engine_utils
    import vllm.v1.executor.multiproc_executor as executor

    engine_utils.get_mp_context = executor.get_mp_context = engine_context


class _ServerState(Protocol):
    """The private state of CPython's ``multiprocessing.forkserver.ForkServer`` (3.10-3.13) that this module
    reads and sets: typeshed declares none of it, so it is spelled out here, in one place."""

    _forkserver_pid: int | None
    _forkserver_address: str | None
    _forkserver_alive_fd: int | None
    ensure_running: Callable[[], None]

    def _stop(self) -> None: ...


def _server() -> _ServerState:
    """This process's forkserver state (``forkserver._forkserver``, the module's singleton)."""
    return cast(_ServerState, forkserver._forkserver)


def adopt_server() -> None:
    """In a child of the server (or an actor adopting the driver's, ``adopt_shared``): connect to that server
    for children of its own, instead of starting one.

    Python's server hands each child its address and "alive" pipe end, but only the process that started
    the server knows its pid, and ``ensure_running`` starts a new server when it has none."""
    server = _server()
    if server._forkserver_pid is None and server._forkserver_address is not None:
        server.ensure_running = resource_tracker.ensure_running


def use_forkserver() -> None:
    """In the rollout actor, first thing: start vLLM's processes from a preloaded server, the driver's when
    it can be adopted, else its own. Its own starts now and imports ``PRELOAD`` while the actor imports vLLM
    itself (two single-threaded imports side by side, instead of the server's after the actor's when
    ``AsyncLLM`` forks its first child)."""
    start_forkserver()
    patch_vllm()


def start_forkserver() -> None:
    """Adopt the driver's server (``adopt_shared``), else start this process's own, preloading ``PRELOAD``."""
    if not adopt_shared():
        CONTEXT.set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()


@dataclass(frozen=True)
class SharedServer:
    """The driver's server, as rollout actors see it (``SHARED_ENV``)."""

    address: str  # its Unix socket
    boot_id: str  # the host's boot: a socket path on another host means nothing here
    env: dict[str, str]  # the variables it was started with; an actor adopts it if its own match

    def started_with(self, env: Any) -> bool:
        """Does ``env`` (a mapping) hold the values this server was started with?"""
        return all(env.get(k) == v for k, v in self.env.items())


_shared: SharedServer | None = None
"""In the driver: the server ``start_shared`` started, until ``stop_shared``."""


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def start_shared(env: dict[str, str]) -> None:
    """In the driver, at launch, single-threaded: start a server under ``os.environ`` updated with ``env``
    (what the rollout actors will have), its output discarded and Ctrl-C ignored (the driver handles it)."""
    global _shared
    if _server()._forkserver_pid is not None:
        return  # this process runs one already, started otherwise
    saved, streams = dict(os.environ), _silence_output()
    sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited through exec
    try:
        os.environ.update(env)
        CONTEXT.set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, sigint)
        _redirect_std(streams)
        os.environ.clear()
        os.environ.update(saved)
    address = _server()._forkserver_address
    assert address is not None  # ensure_running just started it
    _shared = SharedServer(address, boot_id(), dict(env))


def _silence_output() -> tuple[int, int]:
    """Point stdout and stderr at /dev/null; returns the old ones for ``_redirect_std``."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = (os.dup(1), os.dup(2))
    _redirect_std((os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY)))
    return saved


def _redirect_std(fds: tuple[int, int]) -> None:
    """Make ``fds`` this process's stdout and stderr (fd 1 and 2); closes the originals."""
    for target, fd in enumerate(fds, start=1):
        os.dup2(fd, target)
        os.close(fd)


def stop_shared() -> None:
    """In the driver: end its server (if one runs); engines it forked live on until their actors end."""
    global _shared
    if _shared is not None:
        _shared = None
        server = _server()
        if server._forkserver_pid is not None:  # set by start_shared's ensure_running
            os.kill(server._forkserver_pid, signal.SIGTERM)  # it may still be importing PRELOAD
        server._stop()


def shared_actor_env(env: dict[str, str]) -> dict[str, str]:
    """``SHARED_ENV`` for a rollout actor that will run with ``env`` set, when the driver's server runs and
    was started with the same values; empty otherwise (the actor then starts its own)."""
    if _shared is None or not _shared.started_with(env):
        return {}
    return {SHARED_ENV: json.dumps(asdict(_shared))}


def adopt_shared() -> bool:
    """In a rollout actor: use the driver's server if ``SHARED_ENV`` names one on this host, started with
    this process's values of its variables. Its children are told this process is their owner."""
    if not (spec := os.environ.get(SHARED_ENV)):
        return False
    server = SharedServer(**json.loads(spec))
    if server.boot_id != boot_id() or not os.path.exists(server.address) or not server.started_with(os.environ):
        return False
    from relayrl.rollout.cleanup import forget_dead_owners, forget_owned

    forget_owned(os.getpid())  # what an earlier process with this pid registered
    forget_dead_owners()
    state = _server()
    state._forkserver_address = server.address
    state._forkserver_alive_fd = os.open(os.devnull, os.O_RDONLY)  # the driver keeps the server alive
    adopt_server()
    os.environ[OWNER_ENV] = str(os.getpid())
    return True
