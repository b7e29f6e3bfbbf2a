"""A trainer rank's set-up runs in the background of the engines' start.

On a CPU box the engines and the trainer ranks start on the same cores, all CPU-bound (imports, weight
loads) until the first step. The engines are the long pole: the first step starts when they are up,
while a rank is needed only at the first update, a generate later. So a rank raises its niceness for
``setup`` and puts every thread back afterwards: the engines get the cores first and the rank takes the
rest (``trainer.setup_nice``). Lowering niceness back needs root or
``RLIMIT_NICE``; a rank that could not undo it does not raise it.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator


def may_lower_to(nice: int) -> bool:
    """This process may set a thread's niceness back down to ``nice`` (root, or ``RLIMIT_NICE`` allows it:
    the floor it grants is ``20 - limit``)."""
    if os.geteuid() == 0:
        return True
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or 20 - soft <= nice


@contextlib.contextmanager
def in_background(increment: int) -> Iterator[None]:
    """Run the block ``increment`` nicer (Linux niceness is per thread: this thread and the threads it
    starts, e.g. torch's pool); afterwards every thread of the process is back at this thread's niceness."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if increment <= 0 or not may_lower_to(base):
        yield
        return
    os.setpriority(os.PRIO_PROCESS, 0, min(19, base + increment))
    try:
        yield
    finally:
        restore(base)


def restore(nice: int) -> None:
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
