"""A quiet console: relayrl's own lines on it, actor and engine output in ``<run dir>/logs/``.

relayrl's modules log through ``logging`` (``logging.getLogger(__name__)``, under the ``relayrl``
logger); ``show_on_console`` puts those records on the console as bare lines, as the program's
entry points want them: the CLI, ``relayrl.train`` and the actors whose output Ray streams to the
driver call it. INFO goes to stdout (``relayrl eval``: stderr, beside its progress), WARNING and
above to stderr.

Ray's log monitor tails every worker process's stdout and stderr and streams the lines to the driver
(vLLM's EngineCore and its workers inherit their actor's fds, so their lines arrive as the actor's);
Ray's own handler prints them with a ``(RolloutActor pid=...)`` prefix. ``capture`` adds a
``WorkerLogRouter`` beside it, which writes each line to a file (one per actor process, named by
role and pid, so a restarted actor gets a new file and the dead one's stays for the post-mortem)::

    RolloutActor -> rollout-<pid>.log            TrainerActor -> trainer-<pid>.log
    RewardWorker, RewardScorer -> rewards.log    the rest (Ray tasks, raylet, driver log) -> ray.log

and, unless ``logging.verbose``, takes Ray's printer off the console: there only relayrl's own lines
(``relayrl...``), ERROR / CRITICAL lines and the raylet's and autoscaler's messages (out-of-memory
kills, unschedulable resources) are shown. A run that fails prints the dead actor's last lines
(``crash_tail``). Ray's log stream, dispatcher and printer are private APIs of the pinned
ray==2.60.0.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

ROLES = {"RolloutActor": "rollout", "TrainerActor": "trainer", "RewardWorker": "rewards", "RewardScorer": "rewards"}
"""Actor class -> file role; ``PER_PROCESS`` roles get a file per process, the others share one."""
PER_PROCESS = ("rollout", "trainer")
HANDLER = "relayrl_logs"  # our handler's name in Ray's dispatcher
RAY_PRINTER = "ray_print_logs"  # Ray's console printer's name there
_NEEDS_USER = re.compile(r"^\s*relayrl|\b(ERROR|CRITICAL)\b")


class ConsoleHandler(logging.Handler):
    """relayrl's records as bare lines: INFO and below to ``info_stream`` (``stdout`` or
    ``stderr``), WARNING and above to stderr. The stream is looked up per record, so a redirected
    ``sys.stdout`` (pytest's capture, ``contextlib.redirect_stdout``) gets the lines."""

    def __init__(self, info_stream: str = "stdout") -> None:
        super().__init__()
        self.info_stream = info_stream
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            name = "stderr" if record.levelno >= logging.WARNING else self.info_stream
            stream = getattr(sys, name)
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


def show_on_console(info_stream: str = "stdout") -> ConsoleHandler:
    """Show relayrl's INFO lines on this process's console (once: a second call returns the handler
    the first installed). The level is set to INFO only where nobody set one on the ``relayrl``
    logger."""
    log = logging.getLogger("relayrl")
    handler = next((h for h in log.handlers if isinstance(h, ConsoleHandler)), None)
    if handler is None:
        handler = ConsoleHandler(info_stream)
        log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    return handler


class WorkerLogRouter:
    """Ray's log-stream handler: each batch of a worker's lines into its file; the lines that need a
    user on the console (all of them, Ray's way, when ``verbose``: Ray's printer stays on then)."""

    def __init__(self, log_dir: Path, verbose: bool = False) -> None:
        self.log_dir, self.verbose = Path(log_dir), verbose
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, IO[str]] = {}
        self.last_batch = time.monotonic()
        self.took_printer = False  # it took Ray's printer off the console (release: back)
        self._lock = threading.Lock()

    def __call__(self, data: dict[str, Any]) -> None:
        from ray._private.worker import filter_autoscaler_events

        lines = list(data.get("lines") or [])
        if data.get("pid") == "autoscaler":  # its events as Ray prints them, not status dumps
            lines = list(filter_autoscaler_events(lines))
        if not lines:
            return
        name = file_name(data)
        shared = not name.startswith(PER_PROCESS)
        who = data.get("actor_name") or data.get("task_name") or "worker"
        tag = f"({who} pid={data.get('pid')}) "
        with self._lock:
            out = self._file(name)
            out.writelines(f"{tag if shared else ''}{line}\n" for line in lines)
            out.flush()
            self.last_batch = time.monotonic()
        if not self.verbose:
            self._to_console(data, lines)

    def _to_console(self, data: dict[str, Any], lines: list[str]) -> None:
        from ray._private.worker import print_to_stdstream

        if data.get("pid") in ("raylet", "autoscaler"):
            print_to_stdstream(data, ignore_prefix=False)
            return
        role = file_name(data).removesuffix(".log")
        for line in lines:
            if _NEEDS_USER.search(line):
                sink = sys.stderr if data.get("is_err") else sys.stdout
                print(f"({role}) {line}", file=sink, flush=True)

    def _file(self, name: str) -> IO[str]:
        if name not in self.files:
            # Kept open across batches (one file per process, appended to often); close() closes them all.
            self.files[name] = open(self.log_dir / name, "a", encoding="utf-8")  # noqa: SIM115
        return self.files[name]

    def write(self, name: str, text: str) -> None:
        """One line from the driver itself (Ray's driver log records) into ``name``."""
        with self._lock:
            self._file(name).write(text + "\n")
            self._file(name).flush()

    def settle(self, quiet_s: float = 0.5, max_s: float = 3.0) -> None:
        """Wait (at most ``max_s``) until no batch arrived for ``quiet_s``: the log monitor streams
        a dying worker's last lines a moment after its death reaches the driver."""
        deadline = time.monotonic() + max_s
        while time.monotonic() < deadline and time.monotonic() - self.last_batch < quiet_s:
            time.sleep(0.1)

    def tail(self, pid: int, n: int = 20) -> tuple[Path, list[str]] | None:
        """The last ``n`` lines process ``pid`` wrote and their file; None if it wrote none."""
        for path in sorted(self.log_dir.glob("*.log")):
            own = path.name.endswith(f"-{pid}.log")
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            mine = lines if own else [x for x in lines if f" pid={pid}) " in x]
            if mine:
                return path, mine[-n:]
        return None

    def close(self) -> None:
        with self._lock:
            for f in self.files.values():
                f.close()
            self.files.clear()


def file_name(data: dict[str, Any]) -> str:
    """``rollout-<pid>.log``, ``trainer-<pid>.log``, ``rewards.log`` or ``ray.log`` for a batch."""
    role = ROLES.get(str(data.get("actor_name") or "").split("(")[0], "ray")
    return f"{role}-{data.get('pid')}.log" if role in PER_PROCESS else f"{role}.log"


def capture(log_dir: Path, verbose: bool = False) -> WorkerLogRouter:
    """Route this driver's Ray worker output into ``log_dir`` from now on (replacing an earlier
    run's router); quiet console unless ``verbose``. Call before or after ``ray.init``:
    ``start_ray`` calls ``attach`` once Ray is up. It stays installed after the run (output of
    actors still shutting down belongs to it) until the next ``capture`` or ``release``."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    old = installed()
    if old is not None:
        old.close()
    dispatcher.remove_handler(HANDLER)
    router = WorkerLogRouter(log_dir, verbose)
    router.took_printer = old is not None and old.took_printer
    dispatcher.add_handler(HANDLER, router)
    _filter_ray_logger(router)
    attach()
    return router


def release() -> None:
    """Undo ``capture``: no router, Ray's driver log unfiltered, Ray's printer back if taken."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    router = installed()
    if router is None:
        return
    router.close()
    dispatcher.remove_handler(HANDLER)
    for handler in logging.getLogger("ray").handlers:
        for f in [f for f in handler.filters if isinstance(f, _QuietRay)]:
            handler.removeFilter(f)
    if router.took_printer:
        dispatcher.add_handler(RAY_PRINTER, _ray_printer())


def installed() -> WorkerLogRouter | None:
    """The router ``capture`` installed (kept in Ray's dispatcher, the registry of log sinks)."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    return next((h for name, h in dispatcher.handlers if name == HANDLER), None)


def attach() -> None:
    """Once Ray is up and a router is installed: make sure worker lines stream to this driver (a Ray
    started with ``log_to_driver=False`` has the subscriber but no thread polling it), and put Ray's
    printer on the console only in verbose mode."""
    import ray
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    router = installed()
    if router is None or not ray.is_initialized():
        return
    # Any: Ray's Worker class does not declare logger_thread; ray.init's connect() sets it on the instance.
    w: Any = ray._private.worker.global_worker
    thread = getattr(w, "logger_thread", None)
    if (thread is None or not thread.is_alive()) and hasattr(w, "gcs_log_subscriber"):
        w.logger_thread = threading.Thread(target=w.print_logs, name=RAY_PRINTER, daemon=True)
        w.logger_thread.start()  # ray.shutdown stops and joins it as its own
    printing = any(name == RAY_PRINTER for name, _ in dispatcher.handlers)
    if router.verbose and not printing and router.took_printer:
        dispatcher.add_handler(RAY_PRINTER, _ray_printer())
        router.took_printer = False
    elif not router.verbose and printing:
        dispatcher.remove_handler(RAY_PRINTER)
        router.took_printer = True


class _QuietRay(logging.Filter):
    """On Ray's console handler: records below ERROR go to ``ray.log`` instead (quiet mode)."""

    def __init__(self, router: WorkerLogRouter) -> None:
        super().__init__()
        self.router = router

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or self.router.verbose:
            return True
        line = f"(driver) {record.levelname} {record.name}: {record.getMessage()}"
        self.router.write("ray.log", line)
        return False


def _ray_printer() -> Any:
    """Ray's console printer, as ``ray.init(log_to_driver=True)`` installs it."""
    from ray._private import worker as ray_worker

    return functools.partial(ray_worker.print_to_stdstream, ignore_prefix=False)


def _filter_ray_logger(router: WorkerLogRouter) -> None:
    for handler in logging.getLogger("ray").handlers:
        for old in [f for f in handler.filters if isinstance(f, _QuietRay)]:
            handler.removeFilter(old)
        handler.addFilter(_QuietRay(router))


def crash_tail(exc: BaseException, n: int = 20) -> list[str]:
    """The last ``n`` lines of each process the error names (``pid`` of a Ray task error, ``pid: N``
    in an actor-died message, down the cause chain), from the installed router's files, each with a
    heading."""
    router, pids = installed(), list(dict.fromkeys(error_pids(exc)))
    if router is None or not pids:
        return []
    router.settle()
    out: list[str] = []
    for pid in pids:
        found = router.tail(pid, n)
        if found:
            path, lines = found
            out += [f"relayrl: last {len(lines)} lines of pid {pid} ({path}):", *(f"  {x}" for x in lines)]
    return out


def error_pids(exc: BaseException) -> Iterator[int]:
    """Process ids an error and its causes name."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        pid = getattr(cur, "pid", None)
        if isinstance(pid, int):
            yield pid
        yield from (int(m) for m in re.findall(r"\bpid[=:]\s*(\d+)", str(cur)))
        cur = getattr(cur, "cause", None) or cur.__cause__ or cur.__context__
