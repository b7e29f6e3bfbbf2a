"""CPU engines: the rollout's vLLM client (``AsyncLLM`` and the ``Rollout`` around it) in a process forked from the
preloaded fork server, so the Ray actor never imports vLLM.

    RolloutActor (Ray)  --pipe: (id, method, args)-->  engine host (forked, vLLM imported)  --> engine core, worker
                        <--     (id, ok, result)  --   Rollout(...) owns AsyncLLM

Without it the actor imports vLLM itself after it starts (seconds of CPU, on the path to the first step), while
the driver's server (``forkserver.start_shared``) has had vLLM imported since launch. The host comes
from that server like the engine's own processes (``forkserver.CONTEXT``): it takes the actor's environment and
output, belongs to the actor (registered under its pid, killed when it dies) and forks the engine core from the same
server. Calls run concurrently, each as a task on the host's event loop; a result or exception comes back pickled
(an exception that does not pickle comes back as a ``RuntimeError`` with its type, message and traceback). The
host ends when its pipe closes (the actor's ``close`` or death); a dead host fails every call in flight and every
later one with ``EngineHostDied``, which the controller treats as a dead replica (it no longer answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import pickle
import traceback
from multiprocessing.connection import Connection
from typing import Any

from relayrl.rollout.engine import Rollout
from relayrl.rollout.forkserver import CONTEXT


class EngineHostDied(RuntimeError):
    """The engine host process is gone (killed, crashed, or its engine failed to start and it exited)."""


class HostedRollout:
    """In the Ray actor: a ``Rollout(*args)`` running in a forked engine host. ``__init__`` returns once it is up."""

    def __init__(self, *args: Any) -> None:
        self.conn, child = CONTEXT.Pipe()
        self.process = CONTEXT.Process(target=serve, args=(child, args), name="relayrl-engine-host", daemon=False)
        self.process.start()
        child.close()
        self.pending: dict[int, asyncio.Future] = {}
        self.next_id = 0
        self.dead = ""  # why the host is gone, once it is
        self.reading = False
        try:
            ok, value = self.conn.recv()  # the Rollout's construction: the engine up, or why not
        except (EOFError, OSError):
            raise EngineHostDied(
                f"the engine host (pid {self.process.pid}) exited while its engine started; its output above says why"
            ) from None
        if not ok:
            raise value

    async def call(self, name: str, args: tuple = (), kwargs: dict | None = None) -> Any:
        """``await rollout.<name>(*args, **kwargs)`` in the host."""
        if self.dead:
            raise EngineHostDied(self.dead)
        self._read()
        self.next_id += 1
        future = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = future
        try:
            self.conn.send((self.next_id, name, args, kwargs or {}))
        except (BrokenPipeError, OSError) as exc:  # gone before the reader saw its pipe close
            self._died(exc)
        except BaseException:  # an argument that does not pickle: nothing was sent
            del self.pending[self.next_id]
            raise
        return await future

    def _read(self) -> None:
        """Watch the pipe from the running loop (the actor's ``__init__`` runs before Ray's loop exists)."""
        if not self.reading:
            asyncio.get_running_loop().add_reader(self.conn.fileno(), self._on_reply)
            self.reading = True

    def _on_reply(self) -> None:
        try:
            call_id, ok, value = recv(self.conn)
        except (EOFError, OSError) as exc:
            self._died(exc)
            return
        future = self.pending.pop(call_id, None)
        if future is not None and not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def _died(self, why: BaseException) -> None:
        asyncio.get_running_loop().remove_reader(self.conn.fileno())
        self.process.join(timeout=1.0)
        self.dead = (
            f"the engine host (pid {self.process.pid}) is gone ({type(why).__name__}: {why}; "
            f"exit code {self.process.exitcode})"
        )
        for future in self.pending.values():
            if not future.done():
                future.set_exception(EngineHostDied(self.dead))
        self.pending.clear()

    def close(self) -> None:
        """End the host (it shuts its engine down when the pipe closes) and wait for it. On the actor's loop."""
        if self.reading:
            asyncio.get_running_loop().remove_reader(self.conn.fileno())
        self.conn.close()
        self.process.join(timeout=30.0)
        if self.process.is_alive():
            self.process.kill()


# ---------------------------------------------------------------- in the engine host


def serve(conn: Connection, args: tuple) -> None:
    """The host's entry point (after ``forkserver._run`` set up its environment): build the ``Rollout``, answer
    calls until the pipe closes, then shut the engine down."""
    asyncio.run(_serve(conn, args))
    os._exit(0)


async def _serve(conn: Connection, args: tuple) -> None:
    try:
        rollout = Rollout(*args)
    except BaseException as exc:  # noqa: BLE001 - the actor re-raises it
        conn.send((False, portable(exc)))
        return
    conn.send((True, None))
    closed = asyncio.get_running_loop().create_future()
    tasks: set[asyncio.Task] = set()

    def on_request() -> None:
        try:
            call_id, name, call_args, kwargs = recv(conn)
        except (EOFError, OSError):
            if not closed.done():
                closed.set_result(None)
            return
        task = asyncio.ensure_future(_answer(conn, rollout, call_id, name, call_args, kwargs))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    asyncio.get_running_loop().add_reader(conn.fileno(), on_request)
    await closed
    for task in tasks:
        task.cancel()
    rollout.shutdown()


async def invoke(rollout: Any, name: str, args: tuple, kwargs: dict) -> Any:
    """``rollout.<name>(*args, **kwargs)``, awaited if it is a coroutine (``Rollout`` has both kinds)."""
    value = getattr(rollout, name)(*args, **kwargs)
    return await value if inspect.isawaitable(value) else value


async def _answer(conn: Connection, rollout: Any, call_id: int, name: str, args: tuple, kwargs: dict) -> None:
    try:
        reply = (call_id, True, await invoke(rollout, name, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - the actor re-raises it
        reply = (call_id, False, portable(exc))
    with contextlib.suppress(BrokenPipeError, OSError):  # the actor is gone; the host ends at the pipe's EOF
        _send(conn, reply, name)


def _send(conn: Connection, reply: tuple, name: str) -> None:
    """Send ``reply``. ``send`` pickles before it writes, so a result that does not pickle writes nothing and
    is replaced by an error saying so (the caller learns why instead of waiting forever)."""
    try:
        conn.send(reply)
    except (BrokenPipeError, OSError):
        raise
    except Exception as exc:  # noqa: BLE001 - any pickling failure
        conn.send((reply[0], False, portable(RuntimeError(f"{name}'s result could not be sent: {exc!r}"))))


def recv(conn: Connection) -> Any:
    """One whole message, once the event loop saw the pipe readable. uvloop (Ray's loop; vLLM's in places) makes
    a watched descriptor non-blocking, where a message larger than the pipe's buffer would fail part-way."""
    os.set_blocking(conn.fileno(), True)
    return conn.recv()


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a ``RuntimeError`` naming it; the host's traceback rides along as
    the text of a note (``__notes__``), so the actor's error shows where it was raised."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any pickling failure: send a description instead
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    exc.add_note(f"in the engine host (pid {os.getpid()}):\n{text}")
    return exc
