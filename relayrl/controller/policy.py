"""The step policy: every decision of the training loop, as a plain object with no Ray in it.

``controller/scheduler.py`` waits on Ray and calls this; the property tests in
``tests/controller/test_buffer.py`` drive the same object with simulated timings. It owns:

- admission (``buffer.Admission``): may a replica start another chunk without the chunk going stale;
- the replay buffer (``buffer.ReplayBuffer``, in process: the driver its only user), steps' entries in start order;
- the chunks in flight, to regenerate (a replica died: same seq, same prompts) or pending (a resume);
- the prompt accounting: issued = trained + dropped + in flight, checked at the end of the run.

One cycle, as the scheduler calls it::

    launches(idle) ──▶ [generate] ──▶ on_scored(entry) | on_failed(seq)
    take_step() ──▶ [train, sync] ──▶ on_trained() ──▶ version + 1

Work in flight has one record each, held here and shared with the scheduler: a ``Flight`` per chunk
from its launch until it is scored or fails (``generating``, by seq), a ``Step`` from ``take_step`` to
``on_trained`` (``training``). The scheduler writes the calls it waits on into them; the policy never
reads those fields, so a simulation can leave them unset.

``mode=sync`` is k = 0. ``placement=colocated`` never generates and trains at once (no launch while a step trains).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from relayrl.config import Config
from relayrl.controller.buffer import Admission, Entry, ReplayBuffer
from relayrl.controller.swarm import ReplicaSet
from relayrl.data.sampler import Prompt

Prompts = list[Prompt]


class ShortStep(RuntimeError):
    """Dynamic sampling drew ``drawn`` groups (the cap) for a step and only ``useful`` of the B needed
    had rewards that vary: the run stops rather than train on a short batch."""

    def __init__(self, message: str, useful: int, drawn: int):
        super().__init__(message)
        self.useful, self.drawn = useful, drawn


class Resumable(Protocol):
    """The data source's cursor, saved and restored with the policy (``PromptSampler`` is one)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Flight:
    """A chunk in flight, from its launch until it is scored or its replica fails: generate ``prompts`` on
    ``replica`` as chunk ``seq`` (the start order the buffer keeps).

    The policy decides on the first three fields; the scheduler fills in the rest as the calls progress
    (Ray handles, opaque here)."""

    seq: int
    replica: int
    prompts: Prompts
    t0: float = 0.0  # when its generate call started
    actor: Any = None  # the rollout actor it runs on (the replica's slot may get a new one)
    generated: Any = None  # its generate call's ref, once that finished and went to the scorer
    scored: Any = None  # the scored groups' ref
    generate_s: float = 0.0  # how long the generate call took
    score_t0: float = 0.0  # when its scoring started
    copy: bool = False  # a straggler's second copy on another replica (the policy's; first result wins)
    finished: bool = False  # its generate call ended (``on_generated``; the policy's)
    launched: float = 0.0  # the loop's clock at its launch; ``load``: calls then running on its replica
    load: int = 0

    @property
    def prompt_ids(self) -> list[int]:
        return [p.prompt_id for p in self.prompts]


@dataclass
class Step:
    """The step in training, from ``take_step`` until ``on_trained``: the buffer's entries for it, and the
    train call the scheduler started on them (one ref per trainer rank, opaque here)."""

    entries: list[Entry]
    refs: list[Any] = field(default_factory=list)
    t0: float = 0.0  # when the train call started


@dataclass
class PolicyConfig:
    """What the policy decides with; ``from_config`` reads it off the run's config."""

    max_staleness: int  # k (0: sync mode)
    prompts_per_step: int  # B groups per train step
    replicas: int  # chunks of B / replicas prompts, one per generate call
    capacity: int | None = None
    drop_stale: bool = False
    colocated: bool = False
    refill: bool = False  # DAPO dynamic sampling: only groups with reward spread fill a step
    max_sampling_batches: int = 0  # refill: a step draws at most this many x B groups (0: no cap)
    stream: bool = False  # chunks of one group, ``slots`` of them in flight per replica
    slots: int = 1  # chunks submitted to a replica at once (streaming: twice the groups its engine runs)

    @property
    def chunk(self) -> int:
        """Groups per generate call: one when streaming, else B / replicas."""
        return 1 if self.stream else self.prompts_per_step // self.replicas

    @classmethod
    def from_config(cls, cfg: Config, replicas: int) -> PolicyConfig:
        algo, chunk = cfg.algorithm, cfg.run.prompts_per_step // replicas
        stream = cfg.rollout.stream
        return cls(
            cfg.buffer.max_staleness if cfg.mode == "async" else 0,
            cfg.run.prompts_per_step,
            replicas,
            cfg.buffer.capacity,
            cfg.buffer.drop_stale,
            cfg.placement.mode == "colocated",
            algo.dynamic_sampling,
            algo.max_sampling_batches,
            stream,
            2 * max(1, (cfg.rollout.in_flight or chunk * algo.group_size) // algo.group_size) if stream else 1,
        )


class StepPolicy:
    """Admission, buffer, chunks and counts of one run. ``draw()`` returns the next chunk of prompts
    (the sampler's ``next_batch``); ``sampler``, when given, is saved and restored with the policy."""

    def __init__(self, pc: PolicyConfig, draw: Callable[[], Prompts], sampler: Resumable | None = None):
        self.pc, self.draw, self.sampler = pc, draw, sampler
        self.B, self.chunk = pc.prompts_per_step, pc.chunk
        self.admission = Admission(pc.max_staleness, self.B)
        self.buffer = ReplayBuffer(pc.max_staleness, pc.capacity, pc.drop_stale)
        self.max_groups = pc.max_sampling_batches * self.B if pc.refill and pc.max_sampling_batches else None
        self.version = 0  # optimizer steps taken = engines' weight version
        self.outstanding: dict[int, Prompts] = {}  # seq -> prompts issued, not yet taken by a step
        self.generating: dict[int, Flight] = {}  # seq -> chunk launched, not yet scored or failed
        self.retry: list[int] = []  # seqs whose replica died: generate again first
        self.pending: Prompts = []  # drawn, not yet issued (a resume's unfinished prompts): issued first
        self.training: Step | None = None  # the step being trained
        self.counts = {"issued": 0, "trained": 0, "dropped": 0}
        self.dropped_before_resume = 0  # restored drops: the buffer's own count starts at 0
        self.next_seq = 0
        self.replicas = ReplicaSet.of(pc.replicas)  # live and draining replicas, their throughput
        self.copies: dict[int, Flight] = {}  # seq -> a straggler's copy on another replica
        self.reissued = 0  # results discarded because the chunk's other copy came back first
        self.cancelled: list[Flight] = []  # losing copies still generating: the loop cancels them

    # ---- rollout side ----------------------------------------------------------------------------
    def launches(self, idle: list[int], now: float = 0.0) -> list[Flight]:
        """Chunks to start now on the ``idle`` slots (replica ids; a streaming replica is listed once per free
        slot; draining replicas' slots are passed over): chunks to regenerate first (already admitted), then new
        ones while admission and the buffer's capacity allow, each on the slot whose replica would finish it
        first (``swarm.ReplicaSet.pick``), then copies of stragglers (``_reissues``)."""
        if self.pc.colocated and self.training is not None:
            return []
        out, placed, serving = list[Flight](), Counter[int](), set(self.replicas.serving())
        free = [r for r in idle if r in serving]
        while free and self.retry:
            seq = self.retry.pop(0)
            out.append(Flight(seq, self._place(free, placed), self.outstanding[seq]))
        while free and self.admission.allows(self.version, self.chunk) and self._room():
            seq = self._issue()
            out.append(Flight(seq, self._place(free, placed), self.outstanding[seq]))
        self.generating.update((flight.seq, flight) for flight in out)
        copies = self._reissues(free, out)
        self.copies.update((flight.seq, flight) for flight in copies)
        for flight in out + copies:
            self.replicas.started(flight.replica, now)
        for flight in out + copies:  # the round starts together: each call's load is the round's end state
            flight.launched, flight.load = now, self.replicas.running[flight.replica]
        return out + copies

    def _place(self, free: list[int], placed: Counter[int]) -> int:  # placed: chunks each replica got this round
        placed[r := free.pop(self.replicas.pick(free, placed))] += 1
        return r

    def _reissues(self, free: list[int], placed: list[Flight]) -> list[Flight]:
        """Copies of stragglers for replicas that would sit idle while the next step waits on them
        (``swarm.ReplicaSet.copies``); a chunk placed in this round is no straggler yet; not colocated."""
        if self.pc.colocated or not free or self.buffer.ready(self.version, self.B, self.max_groups):
            return []
        new = {f.seq for f in placed}
        running = [f for seq, f in sorted(self.generating.items()) if not f.finished and seq not in new]
        copying = {f.replica for f in self.copies.values() if not f.finished}  # one copy at a time a replica
        busy = {f.replica for f in running} | {f.replica for f in placed} | copying
        stragglers = [(f.seq, f.replica) for f in running if f.seq not in self.copies]
        pairs = self.replicas.copies(list(dict.fromkeys(r for r in free if r not in busy)), stragglers)
        return [Flight(seq, r, self.generating[seq].prompts, copy=True) for seq, r in pairs]

    def _issue(self) -> int:
        """The next chunk: ``pending`` prompts first, topped up from ``draw`` (whose surplus waits there when a
        resume's unfinished prompts do not fill whole chunks of this run's size)."""
        while len(self.pending) < self.chunk:
            self.pending += self.draw()
        prompts, self.pending = self.pending[: self.chunk], self.pending[self.chunk :]
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        self.admission.start(len(prompts))
        self.outstanding[seq] = prompts
        self.counts["issued"] += len(prompts)
        return seq

    def _room(self) -> bool:
        """Buffer capacity counts what is buffered plus this chunk; in-flight chunks are not counted."""
        return self.buffer.has_room(self.chunk)

    def on_generated(self, flight: Flight, now: float = 0.0) -> None:
        """``flight``'s generate call ended (scoring starts): its replica's throughput counts it."""
        if not flight.finished and self.is_live(flight):
            self.replicas.stopped(flight.replica, now, len(flight.prompts))
            self.replicas.observe(flight.replica, flight.load, now - flight.launched)
        flight.finished = True

    def is_live(self, flight: Flight) -> bool:
        """``flight`` is its chunk's call (or its copy) still: not superseded by the other copy's result."""
        return self.generating.get(flight.seq) is flight or self.copies.get(flight.seq) is flight

    def on_scored(self, entry: Entry, flight: Flight | None = None) -> bool:
        """Chunk ``entry.seq`` came back scored (from ``flight``, when the loop says which). ``entry.useful``
        holds its groups with reward spread; with dynamic sampling only those count towards a step, the rest
        free their admission budget (so more prompts are drawn); without it every group counts.
        False: the chunk's other copy came back first, and this result is discarded."""
        if flight is not None and not self._resolve(flight):
            return False
        self.generating.pop(entry.seq, None)
        if self.pc.refill:
            self.admission.waste(entry.num_groups - entry.counted)
        else:
            entry.useful = None
        self.buffer.put(entry)
        return True

    def _resolve(self, flight: Flight) -> bool:
        """``flight`` won its seq: the other copy, if any, is cancelled (still generating) or discarded."""
        if not self.is_live(flight):
            return False
        primary, copy = self.generating.pop(flight.seq, None), self.copies.pop(flight.seq, None)
        other = copy if flight is primary else primary
        if other is not None:
            self.reissued += 1
            if not other.finished:
                self.cancelled.append(other)
        return True

    def take_cancelled(self, now: float = 0.0) -> list[Flight]:
        """Losing copies (and handed-back chunks) still generating: the loop cancels their calls and frees
        their slots."""
        out, self.cancelled = self.cancelled, []
        for flight in out:
            if not flight.finished:
                self.replicas.stopped(flight.replica, now, lost_s=now - flight.t0 if flight.copy else 0.0)
            flight.finished = True
        return out

    def on_failed(self, seq: int, flight: Flight | None = None, now: float = 0.0) -> None:
        """Chunk ``seq``'s replica died: generate the same prompts again under the same seq, so data
        order and accounting are as if nothing happened (it stays admitted and issued). With ``flight`` given:
        a copy that failed, or a result already superseded, changes nothing; a failed original whose copy
        still runs leaves the copy as the chunk's one call."""
        if flight is not None:
            if not self.is_live(flight):
                return
            if not flight.finished:
                self.replicas.stopped(flight.replica, now)
            flight.finished = True
            if self.copies.get(seq) is flight:
                del self.copies[seq]
                return
            if self._promote(seq):
                return
        self.generating.pop(seq, None)
        self.retry.append(seq)

    # ---- joins and leaves ------------------------------------------------------------------------
    def retire(self, replica: int, hand_back: bool = False) -> None:
        """``replica`` takes no new chunk from now on; with ``hand_back`` its chunks still generating are
        cancelled and generated again elsewhere under their seqs (a copy elsewhere carries on instead), so
        nothing is lost and data order holds. Its chunks being scored finish as usual."""
        self.replicas.retire(replica)
        if not hand_back:
            return
        for seq, copy in list(self.copies.items()):
            if copy.replica == replica and not copy.finished:
                del self.copies[seq]
                self.cancelled.append(copy)
        for seq, flight in sorted(self.generating.items()):
            if flight.replica == replica and not flight.finished:
                self.cancelled.append(flight)
                if not self._promote(seq):
                    del self.generating[seq]
                    self.retry.append(seq)

    def _promote(self, seq: int) -> bool:
        """The copy of chunk ``seq``, if one runs, becomes the chunk's one call."""
        if (twin := self.copies.pop(seq, None)) is None:
            return False
        twin.copy, self.generating[seq] = False, twin
        return True

    def drained(self, replica: int) -> bool:
        """No chunk of ``replica``'s is generating or being scored: a retired replica can be ended."""
        flights = [*self.generating.values(), *self.copies.values()]
        return not any(f.replica == replica for f in flights)

    # ---- trainer side ----------------------------------------------------------------------------
    def take_step(self) -> Step | None:
        """The next step, with its entries, if the buffer can fill it now (and nothing trains; colocated:
        nothing generates), else None. Chunks before the last one taken leave ``outstanding`` (dropped-stale
        ones included: the buffer counted them)."""
        if self.training is not None or (self.pc.colocated and self.generating):
            return None
        if not self.buffer.ready(self.version, self.B, self.max_groups):
            return None
        entries = self.buffer.take(self.version, self.B, self.max_groups)
        self.counts["dropped"] = self.dropped_before_resume + sum(self.buffer.dropped.values())
        if self.pc.refill:
            self._took(entries)
        for seq in range(min(self.outstanding), max(e.seq for e in entries) + 1):
            self.outstanding.pop(seq, None)
        self.training = Step(entries)
        return self.training

    def _took(self, entries: list[Entry]) -> None:
        """Dynamic sampling: a step short of B useful groups within the cap would break the staleness
        plan (each step must consume >= B), so the run stops there with the fix."""
        useful, drawn = sum(e.counted for e in entries), sum(e.num_groups for e in entries)
        if useful < self.B:
            raise ShortStep(
                f"dynamic sampling drew {drawn} groups for step {self.version + 1} and only {useful} of the "
                f"{self.B} needed had rewards that vary (algorithm.max_sampling_batches="
                f"{self.pc.max_sampling_batches}): the prompts are too easy or too hard for this model; "
                "filter the dataset or raise algorithm.max_sampling_batches (0: no limit)",
                useful,
                drawn,
            )
        self.admission.took(useful)

    def on_trained(self) -> list[int]:
        """The step was trained and its weights synced: count its prompts trained (groups the trainer
        filtered out reached a step and count as trained; ``take_step`` counted the buffer's drops), bump
        the version.
        Returns the step's prompt ids in order (the prompt log's line)."""
        assert self.training is not None, "on_trained follows take_step"
        trained = [p for e in self.training.entries for p in e.prompt_ids]
        self.counts["trained"] += len(trained)
        self.training = None
        self.version += 1
        return trained

    # ---- accounting and checkpoints --------------------------------------------------------------
    def in_flight(self) -> int:
        """Prompts issued and not yet trained or dropped: outstanding chunks and the step in training."""
        training = sum(e.num_groups for e in self.training.entries) if self.training else 0
        return sum(len(p) for p in self.outstanding.values()) + training

    def check_accounting(self) -> str:
        """issued == trained + dropped + still in flight; holds after every call, checked at the end."""
        c, in_flight = self.counts, self.in_flight()
        if c["issued"] != c["trained"] + c["dropped"] + in_flight:
            raise RuntimeError(
                f"prompt accounting broke: issued {c['issued']} != trained {c['trained']} + "
                f"dropped {c['dropped']} + in flight {in_flight}"
            )
        return (
            f"prompts: issued {c['issued']} = trained {c['trained']} + dropped {c['dropped']} "
            f"+ in flight at the end {in_flight}"
        )

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs (JSON): the data cursor, the unfinished chunks (regenerated first) and the
        prompts drawn but not yet issued after them, counts. Taken between steps (nothing training)."""
        unfinished = [self.outstanding[s] for s in sorted(self.outstanding)] + [self.pending]
        return {
            "sampler": self.sampler.state_dict() if self.sampler is not None else {},
            "counts": dict(self.counts),
            "seq": min(self.outstanding, default=self.next_seq),
            "pending": [[p.to_json() for p in chunk] for chunk in unfinished if chunk],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state["step"]``: admission as if every earlier step's chunks were started, the
        buffer expecting the first unfinished seq, the pending prompts issued again, first, in this run's
        chunks (the checkpoint's may differ: ``rollout.stream`` switched)."""
        self.version = state["step"]
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])
        self.pending = [Prompt.from_json(p) for chunk in state["pending"] for p in chunk]
        self.admission.started = self.version * self.B
        self.next_seq = state.get("seq", self.version * self.pc.replicas)  # before refills: n calls a step
        self.buffer.skip_to(self.next_seq)
        self.counts = dict(state["counts"])
        # issued = trained + dropped + in flight, and what was in flight is pending: counted when re-issued
        self.counts["issued"] = self.counts["trained"] + self.counts["dropped"]
        self.dropped_before_resume = self.counts["dropped"]
