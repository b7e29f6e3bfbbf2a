"""CPU engines: vLLM's shared-memory queue readers sleep between checks instead of spinning.

A CPU engine's engine core and worker talk through vLLM's ``MessageQueue`` (``shm_broadcast.py``). After
each message a reader keeps checking the queue's shared-memory flag in a ``sched_yield`` loop for
``busy_loop_s`` (1 s) before it falls back to waiting on a zmq notification. On a box with a core or two that
loop is a busy process: the engine core spins while its worker runs every forward pass and every weight
commit, and the worker spins for a second after each call, while the trainer computes. On two cores a
commit then has three busy threads (the worker's two OpenMP threads and the spinning engine core), so its
copies wait for scheduler slices.

``sleep_between_polls`` keeps vLLM's protocol as it is (the same flag, the same 1 s window, the same zmq
fallback after it) and only replaces the ``sched_yield`` in the window with a ``poll_us`` sleep: a
message is seen at most ``poll_us`` (plus the kernel's timer slack) later, and an idle reader costs a
wake-up per ``poll_us`` instead of a core. Turning the window off altogether (``busy_loop_s = 0``) was
tried and stalled syncs on missed zmq wake-ups; this change never waits on zmq where vLLM would not.
"""

from __future__ import annotations

import os
import time
from typing import Any

POLL_ENV = "RELAYRL_QUEUE_POLL_US"
"""Set by the rollout actor (``rollout.queue_poll_us``); read in each engine process it forks."""


def sleep_between_polls(poll_us: int) -> None:
    """Make every ``SpinCondition`` reader in this process sleep ``poll_us`` between checks inside its busy
    window (idempotent; ``poll_us <= 0`` leaves vLLM's spin in place)."""
    import vllm.distributed.device_communicators.shm_broadcast as shm

    # Patching vLLM's class is the point (hence the method-assign ignores). The wrapper carries the method it
    # wraps, so a second call replaces the wrapper instead of wrapping it, and its poll_us, for tests.
    spin = getattr(shm.SpinCondition.wait, "relayrl_original", shm.SpinCondition.wait)
    if poll_us <= 0:
        shm.SpinCondition.wait = spin  # type: ignore[method-assign]
        return
    pause = poll_us / 1e6

    def wait(self: Any, timeout_ms: int | None = None) -> None:
        if time.monotonic() <= self.last_read + self.busy_loop_s:
            time.sleep(pause)
        else:
            spin(self, timeout_ms)

    wait.__dict__.update(relayrl_original=spin, relayrl_poll_us=poll_us)
    shm.SpinCondition.wait = wait  # type: ignore[method-assign]


def sleep_between_polls_if_asked() -> None:
    """``sleep_between_polls`` in an engine process whose rollout actor asked for it (``POLL_ENV``)."""
    if (value := os.environ.get(POLL_ENV)) is not None:
        sleep_between_polls(int(value))
