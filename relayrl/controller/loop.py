"""The training loop itself, written once: the Ray scheduler (``controller/scheduler.py``) and the simulator
(``plan/simulate.py``) are two subclasses that differ only in how a call is made and how the loop waits.

::

    while policy.version < steps:
        _launch()            policy.launches(idle slots): take each slot, _submit(flight)
        _start_training()    policy.take_step(): _train(step)
        nothing in flight:   stalled (the buffer cannot fill a step)
        _wait() ->  generated: _score(call)      a generate call ended: start scoring it
                    scored:    _finish_scoring   a failed call replaces its replica (``_replace_replica``),
                                                 else the slot is free again and ``policy.on_scored``
                    trained:   _finish_training  sync, ``policy.on_trained``, log, checkpoint
                    overdue:   _expire_overdue   a generate call ran past its deadline

Every decision is ``StepPolicy``'s; what a subclass supplies is the effects: submitting calls, waiting on
them (``ray.wait`` or a simulated clock), a replica's replacement.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal

from relayrl.controller.policy import Flight, Step, StepPolicy

Event = Literal["generated", "scored", "trained", "overdue"]


class Loop(ABC):
    """The loop over one ``StepPolicy``; ``idle`` lists the free generate slots by replica (a replica appears
    once per slot)."""

    policy: StepPolicy
    idle: list[int]

    def run_loop(self, steps: int) -> None:
        """Run until the policy's version reaches ``steps`` (module docstring)."""
        while self.policy.version < steps:
            self._launch()
            self._start_training()
            if not self._in_flight():
                raise RuntimeError(
                    f"scheduler stalled at v{self.policy.version}: nothing generating or "
                    "training and the buffer cannot fill a step; check buffer.capacity and "
                    "run.prompts_per_step"
                )
            event, call = self._wait()
            if event == "generated":
                self._score(call)
            elif event == "scored":
                self._finish_scoring(call)
            elif event == "trained":
                self._finish_training()
            else:
                self._expire_overdue()
            self._cancel_losers()

    def _launch(self) -> None:
        """Apply joins and leaves, then start every chunk the policy allows on the idle slots (slots of replicas
        that left are dropped)."""
        self._membership()
        live = self.policy.replicas.live
        self.idle = [r for r in self.idle if r in live]
        for flight in self.policy.launches(self.idle, self._now()):
            self.idle.remove(flight.replica)
            self._submit(flight)

    def _cancel_losers(self) -> None:
        """Calls the policy no longer needs (a copy lost, a chunk handed back): cancel them, free their slots."""
        for flight in self.policy.take_cancelled(self._now()):
            self._cancel(flight)
            self.idle.append(flight.replica)

    def _start_training(self) -> None:
        if (step := self.policy.take_step()) is not None:  # None while a step trains
            self._train(step)

    def _replace_replica(self, flight: Flight, error: BaseException | None = None) -> None:
        """A replica died mid-generation: a new one (with the current weights) replaces it, once however many of
        its calls fail, and the chunk is generated again under the same seq, so data order and accounting are
        unchanged."""
        serving = self.policy.replicas.takes_work(flight.replica)  # a leaving replica is not replaced
        if serving and self._is_current(flight):  # not yet replaced (e.g. during a sync)
            self._restart(flight, error)
        self.policy.on_failed(flight.seq, flight, self._now())
        self.idle.append(flight.replica)

    # ---- the effects --------------------------------------------------------------------------------------
    @abstractmethod
    def _now(self) -> float:
        """The loop's clock (seconds): wall time, or the simulation's."""

    @abstractmethod
    def _cancel(self, flight: Flight) -> None:
        """Stop ``flight``'s generate call: its result is no longer needed (its slot is freed by the caller)."""

    @abstractmethod
    def _submit(self, flight: Flight) -> None:
        """Start ``flight``'s generate call on its replica."""

    @abstractmethod
    def _train(self, step: Step) -> None:
        """Start training ``step`` (after a colocated hand-over or pausing the engines, as configured)."""

    @abstractmethod
    def _in_flight(self) -> bool:
        """Some generate, score or train call is under way."""

    @abstractmethod
    def _wait(self) -> tuple[Event, Any]:
        """Block until one call ends; which kind, and the call (the subclass's handle)."""

    @abstractmethod
    def _score(self, call: Any) -> None: ...

    @abstractmethod
    def _finish_scoring(self, call: Any) -> None: ...

    @abstractmethod
    def _finish_training(self) -> None: ...

    def _membership(self) -> None:  # noqa: B027 - a hook: only a loop whose replicas join and leave has one
        """Replicas joining or leaving the run, applied before the launches."""

    def _expire_overdue(self) -> None:  # noqa: B027 - a hook: only a loop whose _wait reports overdue has one
        """Generate calls past their deadline."""

    @abstractmethod
    def _is_current(self, flight: Flight) -> bool:
        """``flight``'s replica still runs the engine the call went to (it was not replaced since)."""

    @abstractmethod
    def _restart(self, flight: Flight, error: BaseException | None) -> None:
        """Replace the engine of ``flight``'s replica (the call failed there) with a new one at the policy's
        version."""
