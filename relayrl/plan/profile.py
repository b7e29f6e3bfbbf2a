"""The planner's profile: the measured (or given) costs of one recipe, and how they are read from runs.

``Profile`` holds one device's costs per step (the terms of the laws in ``relayrl.plan.model``);
``Profile.from_runs`` turns run directories' medians into them, dividing out what a run's own layout
added: its threads' scaling (``train_efficiency``, ``gen_efficiency``) and a colocated CPU run's
generation slowdown (``CPU_COLOCATED_GEN_SLOWDOWN``). Given the CPU probes (``relayrl.plan.measure.probes``:
runs on one thread, on N threads at two batch sizes, and on N one-thread trainer ranks) it fits those scalings
and the per-call and per-rank costs instead of assuming them.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayrl.monitor.runs import read_records
from relayrl.monitor.schema import (
    ROLLOUT_COMPLETIONS,
    ROLLOUT_OCCUPANCY,
    ROLLOUT_TOKENS,
    TIMING_GENERATE,
    TIMING_REWARD,
    TIMING_STEP,
    TIMING_SYNC,
    TIMING_TRAIN,
    WEIGHTSYNC_BYTES,
    WEIGHTSYNC_GBPS,
    WEIGHTSYNC_STALL_S,
)


@dataclass(frozen=True)
class Profile:
    """Measured (or given) costs of one recipe; seconds per training step unless said."""

    tokens: float  # completion tokens per step
    completions: float  # completions per step
    prompts_per_step: int  # run.prompts_per_step (replica counts must divide it)
    gen_dev_s_per_token: float  # device-seconds of generation per completion token
    train_dev_s_per_token: float  # device-seconds of training (update + reference logprobs) per token
    gen_call_s: float = 0.0  # per generate call, does not divide by replicas
    reward_s: float = 0.0  # scoring one generate call's completions
    train_fixed_s: float = 0.0  # train call minus update/logprob: batch fetch, driver <-> rank round trip
    sync_bytes: float = 0.0  # weight bytes moved per sync (per engine)
    sync_bytes_per_s: float = 1e9  # transfer + commit speed of a sync
    sync_fixed_s: float = 0.0  # sync seconds that are not bytes / speed (pause, verify, version check)
    stall_s: float = 0.0  # async: seconds each sync pauses the engines
    overhead_s: float = 0.0  # O: per step, what the phase timers miss (driver calls, logging)
    switch_s: float = 0.0  # colocated: one hand-over between rollout and trainer
    train_efficiency: float = 0.9  # e(t > 1): multi-rank training throughput per rank, relative to 1 rank
    rank_efficiency: float | None = None  # e for t > 1 one-thread ranks (CPU); None: train_efficiency
    rank_collective_s: float = 0.0  # per step, what t > 1 ranks add whatever the tokens (FSDP2 collectives)
    sync_gather_s: float = 0.0  # per sync, what t > 1 ranks add (gathering the shards before the transfer)
    gen_efficiency: float = 0.8  # g: one replica's throughput per thread on N > 1 threads, relative to 1
    overlap_slowdown: float | None = None  # s: Tg and Tt's per-token part run this much slower while they
    # overlap; None: (2r + t) / (r + t) if cpu, else 1
    colocated_gen_slowdown: float | None = None  # c: colocated generation this much slower; None: 2 if cpu
    gen_occupancy: float | None = None  # the profile run's engine occupancy (rollout/occupancy); None: not logged
    cpu: bool = False  # devices are CPU cores of one host (profiled with --cores)
    source: str = "given"  # the run dir(s) or file it came from

    def sync_s(self, ranks: int = 1) -> float:
        """Ts = sync_fixed_s + sync_bytes / sync_bytes_per_s (+ sync_gather_s from ``ranks`` > 1 ranks)."""
        return self.sync_fixed_s + self.sync_bytes / self.sync_bytes_per_s + (self.sync_gather_s if ranks > 1 else 0.0)

    def gen_s(self, devices: int, threads: int = 1) -> float:
        """Tg = gen_call_s + gen_dev_s_per_token * tokens / (devices * g(threads)): ``devices`` device-threads
        in all, ``threads`` of them per replica (1: r data-parallel replicas; N: one shared replica)."""
        return self.gen_call_s + self.gen_dev_s_per_token * self.tokens / (devices * gen_efficiency(self, threads))

    def train_s(self, devices: int, threads: int = 1) -> float:
        """Tt(t) = train_fixed_s + train_dev_s_per_token * tokens / (t * e(t)) for ``devices`` device-threads,
        ``threads`` of them per rank: one rank of N threads has e = train_efficiency; t > 1 one-thread ranks
        have e = rank_efficiency (when given) and add rank_collective_s."""
        if threads > 1 or devices == 1:
            e, collective = efficiency(self, devices), 0.0
        else:
            e = self.train_efficiency if self.rank_efficiency is None else self.rank_efficiency
            collective = self.rank_collective_s
        return self.train_fixed_s + collective + self.train_dev_s_per_token * self.tokens / (devices * e)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "given") -> Profile:
        """A profile from given figures (a yaml/json mapping of field names); unknown names are an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(data) - names):
            raise ValueError(f"unknown profile field(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
        missing = [
            n
            for n in ("tokens", "completions", "prompts_per_step", "gen_dev_s_per_token", "train_dev_s_per_token")
            if n not in data
        ]
        if missing:
            raise ValueError(f"profile lacks {', '.join(missing)}; give them (or profile a run: relayrl plan RUN_DIR)")
        return cls(**{"source": source, **data})

    @classmethod
    def from_run(
        cls,
        path: str | Path,
        cores: int | None = None,
        skip: int = 1,
        train_efficiency: float | None = None,
        gen_efficiency: float | None = None,
    ) -> Profile:
        """Profile of one run directory (see ``from_runs``)."""
        return cls.from_runs([path], cores, skip, train_efficiency, gen_efficiency)

    @classmethod
    def from_runs(
        cls,
        paths: Sequence[str | Path],
        cores: int | None = None,
        skip: int = 1,
        train_efficiency: float | None = None,
        gen_efficiency: float | None = None,
    ) -> Profile:
        """Costs measured in run directories (metrics.jsonl + config.yaml), medians over steps after the
        first ``skip`` (warm-up: engine and allocator first use). ``cores``: this is a CPU box with that
        many cores, so a replica or rank with ``num_threads=0`` used all of them (its device count).
        ``train_efficiency``: e(t) assumed for the run's own t device-threads when t > 1, and
        ``gen_efficiency``: g assumed for a replica of more than one thread (both to get one device's cost).

        One run: per-call generation cost cannot be told from per-token cost, so ``gen_call_s`` = 0 (all of
        Tg divides by replicas). Several runs whose tokens per rollout device differ >= 1.5x: ``gen_call_s`` and
        ``gen_dev_s_per_token`` are fitted by least squares on Tg = a + b * tokens / (r * g). The other costs
        are averaged over the runs. g is given, not fitted, from two runs: a per-call cost and a thread
        scaling below g look alike (a shared run and a one-thread run: the fit puts the difference into a).

        The CPU probes (``relayrl.plan.measure.probes``) tell them apart, and ``_fit_probes`` then fits g,
        e, the ranks' costs and the per-call cost (its docstring); the workload (tokens, completions,
        prompts) is then the first run's, the probes' smaller batches only inform the fit."""
        if not paths:
            raise ValueError("no run directories given; pass at least one runs/<id>")
        # None: the field's default (a dataclass keeps a plain default as the class attribute)
        train_eff = cls.train_efficiency if train_efficiency is None else train_efficiency
        gen_eff = cls.gen_efficiency if gen_efficiency is None else gen_efficiency
        samples = [_run_sample(Path(p), cores, skip, train_eff, gen_eff) for p in paths]
        workload, syncs = samples, samples  # the runs the workload and the sync terms are averaged over
        fitted = _fit_probes(samples) if cores is not None else {}
        if fitted:
            workload = [s for s in samples if s["prompts_per_step"] == samples[0]["prompts_per_step"]]
            if "sync_gather_s" in fitted:  # the ranks' syncs are one rank's plus the gather
                syncs = [s for s in samples if s["ranks"] == 1]
        else:
            x = [s["tokens"] / s["gen_devices"] for s in samples]
            fitted = dict(zip(("gen_call_s", "gen_dev_s_per_token"), _fit_line(x, [s["gen"] for s in samples])))
        avg = {k: statistics.fmean(s[k] for s in samples) for k in _AVERAGED if k not in fitted}
        avg |= {k: statistics.fmean(s[k] for s in workload) for k in ("tokens", "completions")}
        avg |= {k: statistics.fmean(s[k] for s in syncs) for k in ("sync_fixed_s", "stall_s")}
        # the mean sync: mean sync_fixed_s + bytes / the harmonic mean of the speeds
        avg["sync_bytes_per_s"] = statistics.harmonic_mean([s["sync_bytes_per_s"] for s in syncs])
        occupancies = [s["gen_occupancy"] for s in samples if s["gen_occupancy"] > 0]
        return cls(
            **{"train_efficiency": train_eff, "gen_efficiency": gen_eff, **fitted},
            cpu=cores is not None,
            source=", ".join(str(p) for p in paths),
            prompts_per_step=int(samples[0]["prompts_per_step"]),  # an int in a dict of floats
            gen_occupancy=statistics.fmean(occupancies) if len(occupancies) == len(samples) else None,
            **avg,
        )


_AVERAGED = (
    "tokens",
    "completions",
    "train_dev_s_per_token",
    "reward_s",
    "train_fixed_s",
    "sync_bytes",
    "sync_bytes_per_s",
    "sync_fixed_s",
    "stall_s",
    "overhead_s",
)


def scaling(n: int, factor: float) -> float:
    """Throughput per unit of ``n`` units relative to one: 1 for one unit, ``factor`` for more."""
    return 1.0 if n == 1 else factor


def efficiency(profile: Profile, devices: int) -> float:
    """e(t): 1 for one device, ``train_efficiency`` for more (ranks' collectives, or one rank's threads)."""
    return scaling(devices, profile.train_efficiency)


def gen_efficiency(profile: Profile, threads: int) -> float:
    """g: 1 for a one-thread replica, ``gen_efficiency`` for a replica on more threads."""
    return scaling(threads, profile.gen_efficiency)


CPU_COLOCATED_GEN_SLOWDOWN = 2.0
"""c on CPU profiles: r one-thread engines generate about half as fast as r data-parallel ones would
(measured; memory bandwidth, module docstring)."""

STREAM_OCCUPANCY = 1.0
"""Engine occupancy a streaming engine holds while it has work waiting (vLLM refills a freed slot at the next
engine step)."""

FIT_SPREAD = 1.5
"""Fit a per-call cost only when tokens per rollout device differ by this factor between runs: runs of one
layout differ by a few tokens, and a line through two such points extrapolates noise."""


def _fit_line(x: list[float], y: list[float]) -> tuple[float, float]:
    """(a, b) of y = a + b x by least squares when the x spread >= ``FIT_SPREAD``; otherwise a = 0 and
    b = mean(y) / mean(x). a is kept >= 0."""
    if _spread(x) < FIT_SPREAD:
        return 0.0, statistics.fmean(y) / statistics.fmean(x)
    mx, my = statistics.fmean(x), statistics.fmean(y)
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sum((xi - mx) ** 2 for xi in x)
    a = my - b * mx
    if a < 0:  # noise: a fixed cost can't be negative, the line goes through 0
        return 0.0, sum(xi * yi for xi, yi in zip(x, y)) / sum(xi * xi for xi in x)
    return a, b


def _read_run(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    import yaml

    metrics, config = path / "metrics.jsonl", path / "config.yaml"
    if not metrics.is_file() or not config.is_file():
        raise FileNotFoundError(
            f"{path} is not a run directory (needs metrics.jsonl and config.yaml); pass runs/<id> of a finished run"
        )
    return yaml.safe_load(config.read_text()), read_records(path)


def run_devices(cfg: dict[str, Any], cores: int | None) -> tuple[int, int]:
    """(rollout devices, trainer devices) of a run's config: replicas x ``rollout.tp_size`` GPUs and
    ``trainer.world_size`` ranks (tensor parallel ranks included); on a CPU box, times threads."""
    r, t = int(cfg["rollout"]["num_replicas"]), int(cfg["trainer"]["world_size"])
    if cores is None:
        return r * int(cfg["rollout"].get("tp_size") or 1), t
    return r * replica_threads(cfg, cores), t * int(cfg["trainer"].get("num_threads") or cores)


def _run_sample(
    path: Path, cores: int | None, skip: int, train_efficiency: float, gen_efficiency: float
) -> dict[str, float]:
    """One run's medians turned into the profile's per-token and fixed costs: one device's, whether the run
    had one-thread replicas and ranks or a replica and a rank on every core (``num_threads=0``)."""
    cfg, rows = _read_run(path)
    rows = rows[skip:]
    need = (TIMING_GENERATE, TIMING_TRAIN, "timing/update", TIMING_SYNC, TIMING_STEP, ROLLOUT_TOKENS)
    if not rows or any(k not in rows[0] for k in need):
        raise ValueError(
            f"{path}/metrics.jsonl has no steps after the {skip} warm-up step(s) with "
            f"{', '.join(need)}; profile a run of at least {skip + 3} steps"
        )
    med = {k: statistics.median(float(r.get(k, 0.0)) for r in rows) for k in {*need, *_OPTIONAL}}
    r, t = run_devices(cfg, cores)
    g = scaling(replica_threads(cfg, cores), gen_efficiency)
    tokens = med[ROLLOUT_TOKENS]
    update = med["timing/update"] + med["timing/logprob"]
    e = scaling(t, train_efficiency)
    bw = med[WEIGHTSYNC_GBPS] * 1e9 or 1e9
    colocated_cpu = cores is not None and cfg.get("placement", {}).get("mode") == "colocated"
    c = CPU_COLOCATED_GEN_SLOWDOWN if colocated_cpu else 1.0  # its generation ran c times slower
    return {
        "tokens": tokens,
        "completions": med[ROLLOUT_COMPLETIONS],
        "gen_devices": r * g,
        "per_replica": tokens / int(cfg["rollout"]["num_replicas"]),  # x: completion tokens per replica
        "gen_threads": replica_threads(cfg, cores),
        "ranks": int(cfg["trainer"]["world_size"]),
        "rank_threads": t // int(cfg["trainer"]["world_size"]),
        "update": update,
        "sync": med[TIMING_SYNC],
        "prompts_per_step": int(cfg["run"]["prompts_per_step"]),
        "gen": med[TIMING_GENERATE] / c,
        "train_dev_s_per_token": update * t * e / tokens,
        "reward_s": med[TIMING_REWARD],
        "train_fixed_s": max(0.0, med[TIMING_TRAIN] - update),
        "sync_bytes": med[WEIGHTSYNC_BYTES],
        "sync_bytes_per_s": bw,
        "sync_fixed_s": max(0.0, med[TIMING_SYNC] - med[WEIGHTSYNC_BYTES] / bw),
        "stall_s": med[WEIGHTSYNC_STALL_S],
        "overhead_s": _overhead(cfg, rows),
        "gen_occupancy": med[ROLLOUT_OCCUPANCY],  # 0: not logged (an older run)
    }


def _fit_probes(samples: list[dict[str, float]]) -> dict[str, float]:
    """Fitted profile fields from runs that differ in threads, ranks and batch (``measure.probes``); {} when
    the runs cannot tell them apart. With x = tokens per replica and n threads a replica:

    - generation, Tg = a + b * x / (n * g(n)): a from the runs of one n whose x differ >= ``FIT_SPREAD``x
      (the per-call cost: an engine step's scheduling and sampling do not divide by threads; the N-thread
      runs' line when both have one), b from the one-thread runs (b = (Tg - a) / x), g from the N-thread
      ones (g = b * x / (n * (Tg - a)));
    - training, update = b_t * tokens on one thread and one rank; g's twin e = b_t * tokens / (n * update)
      from one rank of n threads; t one-thread ranks split the tokens (e = 1) and add a per-step cost
      (FSDP2's all-gather and reduce-scatter of every parameter): rank_collective_s = update - b_t * tokens/t;
    - a sync from t > 1 ranks gathers the shards first: sync_gather_s = its mean sync - one rank's."""
    n = max(s["gen_threads"] for s in samples)
    one = [s for s in samples if s["gen_threads"] == 1]
    more = [s for s in samples if s["gen_threads"] == n > 1]
    spread = [g for g in (one, more) if g and _spread([s["per_replica"] for s in g]) >= FIT_SPREAD]
    single = [s for s in one if s["ranks"] == 1 and s["rank_threads"] == 1]
    if not (one and more and spread and single):
        return {}
    a, _ = _fit_line([s["per_replica"] for s in spread[-1]], [s["gen"] for s in spread[-1]])
    if any(s["gen"] <= a for s in samples):  # noise: a call cheaper than its fixed part
        return {}
    b = statistics.fmean((s["gen"] - a) / s["per_replica"] for s in one)
    g = statistics.fmean(b * s["per_replica"] / (s["gen_threads"] * (s["gen"] - a)) for s in more)
    b_t = statistics.fmean(s["update"] / s["tokens"] for s in single)
    out = {"gen_call_s": a, "gen_dev_s_per_token": b, "gen_efficiency": g, "train_dev_s_per_token": b_t}
    if threaded := [s for s in samples if s["ranks"] == 1 and s["rank_threads"] > 1]:
        out["train_efficiency"] = statistics.fmean(
            b_t * s["tokens"] / (s["rank_threads"] * s["update"]) for s in threaded
        )
    if ranked := [s for s in samples if s["ranks"] > 1 and s["rank_threads"] == 1]:
        collective = statistics.fmean(s["update"] - b_t * s["tokens"] / s["ranks"] for s in ranked)
        one_rank = statistics.fmean(s["sync"] for s in samples if s["ranks"] == 1)
        gather = statistics.fmean(s["sync"] for s in ranked) - one_rank
        out |= {"rank_efficiency": 1.0, "rank_collective_s": max(0.0, collective), "sync_gather_s": max(0.0, gather)}
    return out


def _spread(x: list[float]) -> float:
    """How far apart the runs' x lie: largest over smallest."""
    return max(x) / min(x)


def replica_threads(cfg: dict[str, Any], cores: int | None) -> int:
    """Threads of each rollout replica of a run's config: 1 on GPUs (a device is a GPU, tensor parallel
    ranks are devices), else ``rollout.num_threads`` (0: every core)."""
    return 1 if cores is None else int(cfg["rollout"].get("num_threads") or cores)


_OPTIONAL = (
    "timing/logprob",
    ROLLOUT_OCCUPANCY,
    TIMING_REWARD,
    ROLLOUT_COMPLETIONS,
    WEIGHTSYNC_BYTES,
    WEIGHTSYNC_GBPS,
    WEIGHTSYNC_STALL_S,
)


def _overhead(cfg: dict[str, Any], rows: list[dict[str, Any]]) -> float:
    """O: the median over steps of what the phase timers don't cover, step - (the critical path's phases):
    the driver's admission and buffer calls, logging, a colocated run's sleep/wake hand-over.

    Sync runs: step - (Tg + Tr + Tt + Ts); async runs: step - max(Tg + Tr + stall, Tt + Ts). Per step, not
    median step minus phase medians: on a loaded box the latter is mostly noise (a median of sums exceeds
    the sum of medians), and that noise would then be added to every layout's prediction."""
    is_async = cfg.get("mode") == "async" and int(cfg.get("buffer", {}).get("max_staleness", 0)) >= 1

    def one(row: dict[str, Any]) -> float:
        rollout = row[TIMING_GENERATE] + row.get(TIMING_REWARD, 0.0)
        trainer = row[TIMING_TRAIN] + row[TIMING_SYNC]
        path = max(rollout + row.get(WEIGHTSYNC_STALL_S, 0.0), trainer) if is_async else rollout + trainer
        return row[TIMING_STEP] - path

    return max(0.0, statistics.median(one(r) for r in rows))
