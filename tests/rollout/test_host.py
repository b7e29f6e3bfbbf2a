"""The engine host's replies, in process (no fork, no vLLM): results, errors that pickle and ones that do not."""

from __future__ import annotations

import asyncio
import pickle
from multiprocessing import Pipe

import pytest

from relayrl.rollout.host import _answer, portable


class Fake:
    def add(self, a: int, b: int = 0) -> int:
        return a + b

    async def later(self, a: int) -> int:
        await asyncio.sleep(0)
        return a * 2

    def boom(self) -> None:
        raise ValueError("calculator env: cannot parse '2 +'")

    def unpicklable(self):
        return lambda: None


def reply(name: str, *args, **kwargs):
    ours, theirs = Pipe()
    asyncio.run(_answer(theirs, Fake(), 7, name, args, kwargs))
    return ours.recv()


def test_results_of_plain_and_async_methods_come_back_with_their_call_id():
    assert reply("add", 2, b=3) == (7, True, 5)
    assert reply("later", 4) == (7, True, 8)


def test_an_error_comes_back_as_itself_with_the_hosts_traceback_as_a_note():
    call_id, ok, error = reply("boom")
    assert (call_id, ok, type(error), str(error)) == (7, False, ValueError, "calculator env: cannot parse '2 +'")
    assert "in the engine host" in error.__notes__[0]
    assert "raise ValueError" in error.__notes__[0]


def test_a_result_that_does_not_pickle_is_an_error_not_a_hang():
    call_id, ok, error = reply("unpicklable")
    assert (call_id, ok, type(error)) == (7, False, RuntimeError)
    assert "unpicklable's result could not be sent" in str(error)


def test_an_exception_that_does_not_pickle_is_sent_as_a_runtime_error_naming_it():
    class Local(Exception):  # a class pickle cannot find by name
        pass

    sent = portable(Local("engine core died"))
    assert type(sent) is RuntimeError and str(sent) == "Local: engine core died"
    assert type(pickle.loads(pickle.dumps(sent))) is RuntimeError


@pytest.mark.parametrize("exc", [KeyError("k"), TimeoutError("slow")])
def test_exceptions_that_pickle_keep_their_type(exc):
    assert type(portable(exc)) is type(exc)
