"""Remove shared-memory segments and semaphores that killed processes left behind.

vLLM's message queue between the engine client and its EngineCore lives in a POSIX shared-memory segment
(``/dev/shm/psm_<hex>``, Python's ``SharedMemory`` naming, ~160 MB). A clean shutdown unlinks it; a
process killed with SIGKILL cannot, so every replica death used to leave one behind until the host ran
out of ``/dev/shm``. The same holds for ``multiprocessing``'s named semaphores (``/dev/shm/sem.mp-<rand>``,
32 bytes each: every lock or queue made in a process started by forkserver or spawn, such as tqdm's lock in
vLLM's worker). Their resource tracker unlinks both when it outlives their creator
(``forkserver.own_resource_tracker``); these functions remove what was left where it did not.

A segment or semaphore is an orphan when no live process holds it: none maps it (``/proc/<pid>/maps``) and
none has it open (``/proc/<pid>/fd``, which also covers the moment between ``shm_open`` and ``mmap``).
Holders are matched by inode, not name: glibc creates a semaphore under a temporary name, maps it and then
links it to its own name, so its creator's maps show the temporary one. Nothing of ``multiprocessing`` is
meant to outlive its creator: it unlinks a name when it drops the object, so a name nobody maps is garbage.
Only files this user owns are considered: Python creates them with mode 0600, so no other user's process
can hold them, and another user's are not ours to judge. Limits: processes this ``/proc`` does not show
(another PID namespace sharing ``/dev/shm``) are invisible; so are those whose maps the kernel hides even
from their own user (an init process, non-dumpable programs; counted in ``Cleanup.blind``) - vLLM engines
are ordinary Python processes, always readable by the user who started them; and a segment that some
process is about to attach by name while nobody holds it would be removed (vLLM's writer holds its queue
for its lifetime; ``multiprocessing``'s creator holds a semaphore until it unlinks it).

vLLM's ZeroMQ sockets are files too (``VLLM_RPC_BASE_PATH``), left behind even by a clean exit; each engine binds
them in a directory of its own (``use_engine_ipc_dir``), removed at its shutdown or, once its client's pid is
gone, at the next engine start on the host (``remove_orphaned_ipc_dirs``). The same limit holds: a client in
another PID namespace sharing this temp dir looks dead. Its connected sockets do not need their files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
VLLM_PREFIX = "psm_"
"""Python ``SharedMemory`` names its segments ``psm_<hex>``; vLLM's message queues are such segments."""
SEMAPHORE_PREFIX = "sem.mp-"
"""``multiprocessing``'s named semaphores (``/mp-<rand>``; glibc keeps ``/name`` as ``/dev/shm/sem.name``)."""


@dataclass
class Cleanup:
    removed: list[str] = field(default_factory=list)  # file names unlinked
    bytes_freed: int = 0
    blind: int = 0  # processes of this user whose maps/fds the kernel hides from it (reported)


def _process_dirs() -> Iterator[Path]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield Path(entry.path)


def held_by(proc: Path, shm_dir: str) -> set[int]:
    """Inodes of the files under ``shm_dir`` that process ``proc`` maps or has open (raises OSError if it
    can't be read). A mapping of a file unlinked since keeps its inode and is shown ``(deleted)``."""
    held = set()
    with open(proc / "maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)  # address perms offset dev inode path
            if len(fields) == 6 and fields[5].startswith(shm_dir):
                held.add(int(fields[4]))
    for fd in os.scandir(proc / "fd"):
        try:
            if os.readlink(fd.path).startswith(shm_dir):
                held.add(os.stat(fd.path).st_ino)
        except OSError:
            continue  # the fd was closed while we looked
    return held


def segments_in_use(shm_dir: Path = SHM_DIR) -> tuple[set[int], int]:
    """Inodes of files under ``shm_dir`` that some live process maps or has open, and how many of this
    user's processes could not be read (they might hold one). A process that exits during the scan holds
    nothing; another user's process cannot open our 0600 files."""
    prefix, held, blind, uid = f"{shm_dir}/", set(), 0, os.getuid()
    for proc in _process_dirs():
        try:
            held |= held_by(proc, prefix)
        except PermissionError:
            blind += _owner(proc) == uid
        except OSError:
            continue  # exited while we looked
    return held, blind


def _owner(proc: Path) -> int | None:
    try:
        return proc.stat().st_uid
    except OSError:
        return None


def remove_orphaned_segments(
    prefixes: tuple[str, ...] = (VLLM_PREFIX, SEMAPHORE_PREFIX), shm_dir: Path = SHM_DIR
) -> Cleanup:
    """Unlink every file ``shm_dir/<prefix>*`` owned by this user that no live process holds.

    Files are listed *before* the processes are scanned, so a file created after the listing is never a
    candidate, and one created before it is held (mapped or open) by its creator during the scan.
    """
    uid, result = os.getuid(), Cleanup()
    candidates = [(p, st) for prefix in prefixes for p in shm_dir.glob(f"{prefix}*") if (st := _owned_file(p, uid))]
    if not candidates:
        return result
    held, result.blind = segments_in_use(shm_dir)
    for path, st in candidates:
        if st.st_ino in held:
            continue
        try:
            if path.lstat().st_ino != st.st_ino:
                continue  # unlinked and made again under its name since the listing: not the file we judged
            path.unlink()
        except FileNotFoundError:
            continue  # its owner unlinked it meanwhile
        result.removed.append(path.name)
        result.bytes_freed += st.st_size
    return result


def _owned_file(path: Path, uid: int) -> os.stat_result | None:
    """``path``'s stat if it is a regular file (not a link) that ``uid`` owns."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return st if st.st_uid == uid and stat.S_ISREG(st.st_mode) else None


def cleanup_engine_segments() -> Cleanup:
    """Call where a dead replica is replaced and at start-up: removes dead engines' message-queue segments
    and dead processes' ``multiprocessing`` semaphores, and prints one line when it freed any."""
    result = remove_orphaned_segments()
    if result.removed:
        semaphores = sum(name.startswith(SEMAPHORE_PREFIX) for name in result.removed)
        logger.info(
            "relayrl: removed %d shared-memory segment(s) of dead vLLM engines (%.0f MiB) and %d semaphore(s) "
            "of dead processes in %s",
            len(result.removed) - semaphores,
            result.bytes_freed / 2**20,
            semaphores,
            SHM_DIR,
        )
    return result


IPC_PREFIX = "relayrl-ipc-"
"""One engine's ZeroMQ socket files: ``<temp dir>/relayrl-ipc-<pid>-<random>``, pid the engine client's process."""
IPC_PATH_MAX = 107
"""Bytes in a Unix socket's path (``sun_path`` less its NUL); vLLM names each socket ``<dir>/<uuid4>``."""


def engine_ipc_dir() -> str | None:
    """A new directory for the ZeroMQ sockets of the engine this process starts (``VLLM_RPC_BASE_PATH``; vLLM
    otherwise binds them in the temp dir itself and leaves them there: 7 files a one-engine run, on a clean exit
    too). None when a socket's path in it would be too long: vLLM then keeps its default."""
    path = tempfile.mkdtemp(prefix=f"{IPC_PREFIX}{os.getpid()}-")
    if len(os.fsencode(path)) + 1 + 36 > IPC_PATH_MAX:
        os.rmdir(path)
        return None
    return path


def use_engine_ipc_dir() -> tuple[str | None, int]:
    """Before this process starts its engine: remove dead engines' socket directories, then point vLLM
    (``VLLM_RPC_BASE_PATH``, read here and inherited by the engine's processes) at a new one of this engine's
    own. That directory (None: none) and how many were removed; ``remove_ipc_dir`` at its shutdown."""
    removed = len(remove_orphaned_ipc_dirs())
    path = engine_ipc_dir()
    if path:
        os.environ["VLLM_RPC_BASE_PATH"] = path
    return path, removed


def remove_ipc_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def remove_orphaned_ipc_dirs(root: Path | None = None) -> list[str]:
    """Remove every ``relayrl-ipc-<pid>-*`` directory under ``root`` (the temp dir) that this user owns and whose
    pid is gone: an engine whose client was killed before it could remove its own. The names removed."""
    import psutil

    uid, removed = os.getuid(), []
    for path in (root or Path(tempfile.gettempdir())).glob(f"{IPC_PREFIX}*"):
        pid = path.name[len(IPC_PREFIX) :].split("-", 1)[0]
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if not (pid.isdigit() and stat.S_ISDIR(st.st_mode) and st.st_uid == uid) or psutil.pid_exists(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


def owned_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"relayrl-engines-{os.getuid()}"


def register(owner: int, pid: int) -> None:
    """Record that process ``pid`` belongs to ``owner`` though it is not below it in the process tree (an
    engine process forked from the driver's server for rollout actor ``owner``), with its start time, so
    that ``kill_process_tree(owner)`` ends it and never a later process given the same pid."""
    import psutil

    owned_dir().mkdir(mode=0o700, exist_ok=True)
    with open(owned_dir() / str(owner), "a") as f:
        f.write(f"{pid} {psutil.Process(pid).create_time()!r}\n")


def owned(owner: int) -> list:
    """The live processes registered under ``owner`` (``register``)."""
    import psutil

    try:
        lines = (owned_dir() / str(owner)).read_text().splitlines()
    except FileNotFoundError:
        return []
    procs = []
    for pid, created in (line.split() for line in lines if line.strip()):
        try:
            proc = psutil.Process(int(pid))
            if proc.create_time() == float(created):
                procs.append(proc)
        except psutil.NoSuchProcess:
            pass
    return procs


def actor_processes(pid: int) -> list[psutil.Process]:
    """Process ``pid``, every process registered under it (``register``), and every process below any of
    them, each once: all an actor's engines, whether forked below it or by the driver's server."""
    import psutil

    roots = owned(pid)
    with contextlib.suppress(psutil.NoSuchProcess):
        roots.append(psutil.Process(pid))
    found: dict[int, psutil.Process] = {}
    for root in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            found.update((p.pid, p) for p in [root, *root.children(recursive=True)])
    return list(found.values())


def forget_owned(owner: int) -> None:
    (owned_dir() / str(owner)).unlink(missing_ok=True)


def forget_dead_owners() -> None:
    """Drop the registry files of owners that are gone (an actor killed, or killed with its run, leaves one)."""
    import psutil

    for path in owned_dir().glob("[0-9]*"):
        if not psutil.pid_exists(int(path.name)):
            path.unlink(missing_ok=True)


def kill_process_tree(pid: int) -> int:
    """SIGKILL ``pid``, every process below it and every process registered under it; the number killed.
    ``ray.kill`` ends an actor's own process, but a vLLM EngineCore child that is stopped (SIGSTOP, a wedged
    driver) can react to no signal but SIGKILL and would otherwise live on, holding its memory and its
    queue segment."""
    import psutil

    procs = owned(pid)
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        procs += [*root.children(recursive=True), root]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    forget_owned(pid)
    return len(procs)
