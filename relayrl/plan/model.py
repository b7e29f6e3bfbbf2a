"""The placement planner's cost model: a profile of measured costs in, predicted step time of a layout out.

The profile (``relayrl.plan.profile``) holds the costs and reads them from runs; this module holds the
laws below and the layouts of a device count; ``relayrl plan`` ranks them by the simulator fed the same
profile (``relayrl.plan.calibrate.rank``).

A *device* is what a rollout replica or a trainer rank is given: a GPU, or one CPU core on a CPU box
(``rollout.num_threads`` / ``trainer.num_threads`` cores each). A *layout* is (placement, rollout devices r,
trainer devices t, mode, k). With ``tokens`` completion tokens per step, the phases of one step cost

::

    Tg(r) = gen_call_s + gen_dev_s_per_token * tokens / r              generation, r one-device replicas
    Tg(N) = gen_call_s + gen_dev_s_per_token * tokens / (N * g)        shared: one replica on N threads,
                                                                        g = gen_efficiency
    Tr    = reward_s                                                    scoring (CPU workers)
    Tt(t) = train_fixed_s + train_dev_s_per_token * tokens / (t * e(t)) training, e(1) = 1, e(t>1) = train_efficiency
            (+ rank_collective_s for t > 1 ranks, whose e is rank_efficiency when given)
    Ts    = sync_fixed_s + sync_bytes / sync_bytes_per_s                weight sync (+ sync_gather_s, t > 1 ranks)
    O     = overhead_s                                                  driver per step (RPCs, buffer, logging)

and the step is

::

    separate, sync  (or k = 0):  step = Tg(r) + Tr + Tt(t) + Ts + O
    separate, async (k >= 1):    step = max(s * Tg(r) + Tr + stall_s (+ sync_gather_s, t > 1 ranks),
                                            train_fixed_s + s * (Tt(t) - train_fixed_s) + Ts) + O
    separate, async streaming:   the same with Tg * u,  u = occupancy of the profile run / STREAM_OCCUPANCY
    colocated (sync), N devices: step = c * Tg(N) + Tr + Tt(N) + Ts + 2 * switch_s + O
    shared (CPU, sync), N cores: step = Tg(N) + Tr + Tt(N) + Ts + O   (Tg with g, Tt with e(N))

    s = 1 on GPUs;  s = (2r + t) / (r + t) when devices are CPU cores;  or ``overlap_slowdown`` if given
    c = 1 on GPUs;  c = 2r / r = 2 when devices are CPU cores;        or ``colocated_gen_slowdown`` if given

Why these laws: replicas never talk to each other, so generation is data parallel and its per-token work
divides by r (``gen_call_s``, the per-call cost that does not divide, is fitted only when runs with
different tokens per replica are given - else 0). Trainer ranks all-gather and reduce-scatter every step
(FSDP2), so t ranks deliver ``t * train_efficiency`` of one rank's throughput (0.9 assumed unless given);
a profile with the CPU probes (``relayrl.plan.measure.probes``) measures instead that ranks split the tokens
evenly and add a fixed ``rank_collective_s`` a step (and ``sync_gather_s`` a sync), and fits g and e.
The fixed costs ``train_fixed_s`` (fetching the batch, the driver's call), ``reward_s``, ``Ts`` and ``O``
are measured in the profile run and do not shrink with devices; on small models they dominate, which is
why the profile must measure them rather than assume them away. In async mode the rollout keeps going
while the trainer trains (admission control lets it run k >= 1 versions ahead), so the slower of the two
paths sets the pace; each sync pauses the engines for ``stall_s``. Colocated placement time-shares all
N devices: phases run one after the other, plus two hand-overs (engines sleep, trainer wakes, and back).

Streaming (``rollout.stream``): a chunk's batch empties through its tail, and a decode step costs about the
same however many of its slots are filled (it reads every weight), so the profile's Tg is a cost at its
engine occupancy (``rollout/occupancy``, mean running sequences per engine step over the target). A
streaming engine that has work waiting keeps its batch full: Tg shrinks by that occupancy over
``STREAM_OCCUPANCY``. Where the trainer is the slower path a streaming engine idles between admissions and
its Tg is off the critical path, as in any async layout. Sync streaming admits one step's groups at a time
and keeps the tail, so it is not a layout of its own.

Shared is relayrl's default on a CPU box: ``placement=separate mode=sync`` with one replica and one rank
whose ``num_threads=0`` each take every core. Sync mode runs one side at a time, so each has all N cores
while it works and nothing is put to sleep (no switch). It exists only for CPU profiles: two GPU processes
cannot take turns on one device without colocated's sleep/wake. N threads in one process do not scale
perfectly (they share caches and memory bandwidth): training uses the same e(N) as N ranks (give
``train_efficiency`` when it matters), and generation a factor g = ``gen_efficiency`` (0.8 assumed unless
given: what a trainer update gains from a second thread, as vLLM's CPU decode runs the same kind of GEMM
kernels). N one-thread replicas, in contrast, are data parallel and keep g = 1. A
profile of a shared run turns its measured Tg into one device's cost as Tg * N * g / tokens (and the
update as update * N * e(N) / tokens), so a shared run and a one-thread run of the same work give the same
per-device costs.

The colocated slowdown c: colocated on an N-core box runs r = N one-thread replicas, and their generation
measures about twice what r data-parallel replicas would give: c = 2. It was first put down to each
EngineCore spinning beside its worker (2r busy processes on r cores), but removing the spin
(``rollout.queue_poll_us``) left colocated generation as slow: what remains fits memory bandwidth (a decode
step reads every weight once per replica, so r replicas on one memory bus move r times the bytes for the
same tokens). A profile taken from a colocated CPU run has c divided out of its generation cost. Give
``colocated_gen_slowdown`` (e.g. measured) to replace it; ``bench/plan_accuracy.py`` checks a prediction
against a real run.

The overlap slowdown s: GPUs don't share their devices, so s = 1 there. On a CPU box a vLLM engine runs
its scheduler (EngineCore) as one more busy process beside its worker thread, so r one-thread replicas keep
2r processes busy. In a sync step only one side runs and the other cores absorb that; when both sides
overlap, 2r + t busy processes share r + t cores and both slow by that ratio (1.5x for 1:1). The factor
outlived the spinning EngineCore it counts (with ``rollout.queue_poll_us`` async runs were no faster), so it
stands as an empirical factor; shared memory bandwidth explains it better.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from relayrl.plan.profile import CPU_COLOCATED_GEN_SLOWDOWN, STREAM_OCCUPANCY, Profile

PLACEMENTS = ("separate", "colocated", "shared")
"""A layout's placements; shared is the config's ``placement=separate`` with every core on each side."""


@dataclass(frozen=True)
class Layout:
    placement: str  # separate | colocated | shared (CPU: one replica and one rank, each on all N cores)
    rollout_devices: int  # r: one replica per device (shared: N threads of the one replica)
    trainer_devices: int  # t: trainer ranks (FSDP2) (shared: N threads of the one rank)
    mode: str = "sync"  # sync | async
    k: int = 0  # buffer.max_staleness (async)
    stream: bool = False  # rollout.stream (async): groups admitted as slots free up, no chunk tail

    @property
    def overlaps(self) -> bool:
        """Rollout and training run at the same time: separate placement, async, k >= 1."""
        return self.placement == "separate" and self.mode == "async" and self.k >= 1

    @property
    def schedule(self) -> str:
        """``sync``, ``async k=<k>`` or ``async k=<k> stream``: the mode column of a plan."""
        if self.mode != "async":
            return "sync"
        return f"async k={self.k}" + (" stream" if self.stream else "")

    @property
    def threads(self) -> int:
        """Threads of each replica and rank: all N when shared, else one device each."""
        return self.rollout_devices if self.placement == "shared" else 1

    @property
    def ranks(self) -> int:
        """Trainer ranks: one when shared (its N devices are threads), else one per trainer device."""
        return 1 if self.placement == "shared" else self.trainer_devices

    def split(self) -> str:
        return f"{self.rollout_devices}:{self.trainer_devices}"


@dataclass(frozen=True)
class Prediction:
    layout: Layout
    step_s: float
    completions_per_s: float
    tokens_per_s: float
    bottleneck: str  # generate | train | sync | overhead | switch: the largest term on the critical path
    idle_rollout: float  # 1 - rollout busy / step
    idle_trainer: float  # 1 - trainer busy (train + sync) / step
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # the terms, seconds
    laws_step_s: float | None = None  # a simulated row: the closed-form laws' step, beside the simulator's


def predict(profile: Profile, layout: Layout) -> Prediction:
    """Step time, throughput, bottleneck and idle fractions of ``layout`` (laws: module docstring)."""
    _check_layout(layout)
    if layout.placement == "shared" and not profile.cpu:
        raise ValueError(
            f"layout {layout}: shared placement time-shares CPU cores; this profile's devices "
            "are GPUs (profile with --cores, or use colocated)"
        )
    colocated = layout.placement == "colocated"
    tg = profile.gen_s(layout.rollout_devices, layout.threads) * (colocated_slowdown(profile) if colocated else 1.0)
    if layout.stream:
        tg *= stream_speedup(profile)
    tt = profile.train_s(layout.trainer_devices, layout.threads)
    ph = {
        "generate": tg,
        "reward": profile.reward_s,
        "train": tt,
        "sync": profile.sync_s(layout.ranks),
        "overhead": profile.overhead_s,
        "switch": 2 * profile.switch_s if colocated else 0.0,
    }
    rollout_path = tg + ph["reward"]
    trainer_path = tt + ph["sync"]
    if layout.overlaps:
        s = overlap_slowdown(profile, layout)
        rollout_path += (s - 1) * tg + profile.stall_s + ph["sync"] - profile.sync_s()  # + a gather's wait
        trainer_path += (s - 1) * (tt - profile.train_fixed_s)
        core = max(rollout_path, trainer_path)
        bottleneck = "generate" if rollout_path >= trainer_path else ("train" if tt >= ph["sync"] else "sync")
    else:
        core = rollout_path + trainer_path + ph["switch"]
        bottleneck = max(("generate", "train", "sync", "switch"), key=lambda k: ph[k])
    step = core + ph["overhead"]
    if ph["overhead"] > max(ph["generate"], ph["train"], ph["sync"]):
        bottleneck = "overhead"
    return Prediction(
        layout,
        step,
        profile.completions / step,
        profile.tokens / step,
        bottleneck,
        idle_rollout=max(0.0, 1 - rollout_path / step),
        idle_trainer=max(0.0, 1 - trainer_path / step),
        phases=ph,
    )


def stream_speedup(profile: Profile) -> float:
    """The factor streaming puts on Tg: the profile's engine occupancy over a streaming engine's
    (``STREAM_OCCUPANCY``), since a decode step costs about the same however many of its slots are used."""
    if profile.gen_occupancy is None:
        raise ValueError(
            "a streaming layout needs the profile's engine occupancy (rollout/occupancy); "
            "profile a run that logs it, or give gen_occupancy"
        )
    return min(1.0, profile.gen_occupancy / STREAM_OCCUPANCY)


def colocated_slowdown(profile: Profile) -> float:
    """c: how much slower colocated replicas generate than the per-device cost says (module docstring)."""
    if profile.colocated_gen_slowdown is not None:
        return profile.colocated_gen_slowdown
    return CPU_COLOCATED_GEN_SLOWDOWN if profile.cpu else 1.0


def overlap_slowdown(profile: Profile, layout: Layout) -> float:
    """s: how much slower generation and training compute run while they overlap (module docstring)."""
    if profile.overlap_slowdown is not None:
        return profile.overlap_slowdown
    r, t = layout.rollout_devices, layout.trainer_devices
    return (2 * r + t) / (r + t) if profile.cpu else 1.0


def _check_layout(layout: Layout) -> None:
    if layout.placement not in PLACEMENTS or layout.mode not in ("sync", "async"):
        raise ValueError(f"layout {layout}: placement must be {'|'.join(PLACEMENTS)} and mode sync|async")
    if layout.stream and not layout.overlaps:
        raise ValueError(f"layout {layout}: streaming is modelled for separate placement, async, k >= 1")
    if layout.rollout_devices < 1 or layout.trainer_devices < 1 or layout.k < 0:
        raise ValueError(f"layout {layout}: needs >= 1 rollout and trainer device and k >= 0")
    if layout.placement == "shared" and (layout.mode != "sync" or layout.rollout_devices != layout.trainer_devices):
        raise ValueError(
            f"layout {layout}: shared runs sync with the replica and the rank on the same N cores "
            "(rollout devices = trainer devices)"
        )


def layouts(
    devices: int, prompts_per_step: int, ks: tuple[int, ...] = (1,), cpu: bool = False, stream: bool = False
) -> list[Layout]:
    """Every layout of ``devices`` devices: separate r:(N-r) for r = 1..N-1 in sync and async (each k; with
    ``stream`` also async streaming),
    colocated on all N (sync: colocated never generates and trains at once, so async gains nothing there),
    and when devices are CPU cores (``cpu``) shared on all N (one replica: it divides any prompt count).
    Replica counts that do not divide ``prompts_per_step`` are left out (the config rejects them)."""
    if devices < 1:
        raise ValueError(f"devices={devices} must be >= 1")
    out = []
    for r in range(1, devices):
        if prompts_per_step % r:
            continue
        out.append(Layout("separate", r, devices - r, "sync", 0))
        out += [Layout("separate", r, devices - r, "async", k) for k in ks if k >= 1]
        out += [Layout("separate", r, devices - r, "async", k, True) for k in ks if k >= 1 and stream]
    if prompts_per_step % devices == 0:
        out.append(Layout("colocated", devices, devices, "sync", 0))
    if cpu:
        out.append(Layout("shared", devices, devices, "sync", 0))
    return out


def overrides(layout: Layout, cpu: bool = False) -> list[str]:
    """Recipe overrides that run ``layout``. ``cpu``: devices are cores, so every replica and rank is pinned to
    one thread and asks Ray for one CPU; shared (always CPU) is one replica and one rank of N threads each
    (on an N-core box the same as the default ``num_threads=0``; explicit, so that a plan for fewer cores
    than the box has runs on that many)."""
    if layout.placement == "shared":
        n = layout.threads
        return [
            "placement=separate",
            "rollout.num_replicas=1",
            "trainer.world_size=1",
            "mode=sync",
            "rollout.num_cpus=1",
            f"rollout.num_threads={n}",
            "trainer.num_cpus=1",
            f"trainer.num_threads={n}",
        ]
    out = [
        f"placement={layout.placement}",
        f"rollout.num_replicas={layout.rollout_devices}",
        f"trainer.world_size={layout.trainer_devices}",
        f"mode={layout.mode}",
    ]
    if layout.mode == "async":
        out.append(f"buffer.max_staleness={layout.k}")
    if layout.stream:
        out.append("rollout.stream=true")
    if cpu:
        out += ["rollout.num_cpus=1", "rollout.num_threads=1", "trainer.num_cpus=1", "trainer.num_threads=1"]
    return out
