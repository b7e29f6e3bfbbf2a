"""``unless_dead``: an engine control call in flight when the engine core dies raises at once instead of
waiting forever (vLLM fails the requests in flight, not its utility calls)."""

from __future__ import annotations

import asyncio

import pytest
from vllm.v1.engine.exceptions import EngineDeadError

from relayrl.rollout.engine import DEATH_POLL_S, unless_dead


class Engine:
    """The two attributes of ``AsyncLLM`` that ``unless_dead`` reads."""

    def __init__(self) -> None:
        self.errored = False

    @property
    def dead_error(self) -> BaseException:
        return EngineDeadError()


async def never_answers(started: asyncio.Event, cancelled: list[bool]) -> None:
    started.set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        cancelled.append(True)
        raise


def test_a_call_in_flight_raises_when_the_engine_dies_and_is_cancelled():
    async def scenario() -> None:
        engine, started, cancelled = Engine(), asyncio.Event(), []
        call = asyncio.ensure_future(unless_dead(engine, never_answers(started, cancelled)))
        await started.wait()
        await asyncio.sleep(3 * DEATH_POLL_S)
        assert not call.done()  # alive engine: the call keeps waiting
        engine.errored = True
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(call, timeout=60)
        assert cancelled == [True]  # the orphaned vLLM call does not linger

    asyncio.run(scenario())


def test_answers_and_errors_of_a_live_engine_pass_through():
    async def answer() -> int:
        await asyncio.sleep(2 * DEATH_POLL_S)
        return 7

    async def fail() -> None:
        raise ValueError("from the engine")

    async def scenario() -> None:
        assert await unless_dead(Engine(), answer()) == 7
        with pytest.raises(ValueError, match="from the engine"):
            await unless_dead(Engine(), fail())

    asyncio.run(scenario())
