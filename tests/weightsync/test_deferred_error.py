"""``DeferredError``: a step's first error kept while the ranks meet, then raised without anything holding it."""

from __future__ import annotations

import gc
import weakref

from relayrl.weightsync.base import DeferredError


class _Engine:
    """Stands in for what a failing step's frame holds (an engine, its process group)."""

    def step(self, failures: list[str]) -> None:
        error = DeferredError()
        for message in failures:  # each raised here, so only ``error`` could hold one
            with error.catch():
                raise ValueError(message)
        assert bool(error) == bool(failures)
        error.reraise()


def test_the_first_error_is_raised_once_the_ranks_meet_and_nothing_holds_the_frame():
    gc.disable()  # a cycle would survive until a gc: none may run here
    try:
        engine = _Engine()
        held = weakref.ref(engine)
        message = ""
        try:  # not pytest.raises: its ExceptionInfo would keep the traceback, and the frame, alive
            engine.step(["first", "second"])
        except ValueError as exc:
            message = str(exc)
        assert message == "first"
        del engine
        assert held() is None
    finally:
        gc.enable()


def test_no_error_raises_nothing():
    _Engine().step([])
