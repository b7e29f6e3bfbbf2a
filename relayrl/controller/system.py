"""The actors of one run and the fan-out calls the loop makes on them (refs in, refs out)."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from relayrl.config import Config
from relayrl.controller.cluster import Placement, rollout_config, sync_config
from relayrl.controller.policy import PolicyConfig
from relayrl.controller.replicas import actor_process, answers, restart_backoff_s, wait_engines_up
from relayrl.controller.rollout_stats import step_summary
from relayrl.data.sampler import PromptSampler
from relayrl.models.digest import model_digest
from relayrl.monitor.schema import MISMATCH_MEAN_ABS
from relayrl.weightsync.client import abort_update

logger = logging.getLogger(__name__)

RewardFns = list[tuple[str, Callable, float]]


@dataclass
class System:
    cfg: Config
    sampler: Any
    rollouts: list[Any]
    trainer: Any
    rewards: Any  # relayrl.rewards.pool.RewardPool: scorer actor + reward workers
    model_path: Path | None = None
    placement: Placement | None = None
    restarts: int = 0  # rollout replicas replaced after they died
    procs: list[tuple[str, int]] = field(default_factory=list)  # (node ip, actor pid) per replica
    startup: dict[str, float] = field(default_factory=dict)  # startup/* metrics, logged with the first step
    ids: list[int] = field(default_factory=list)  # the policy's replica id of each rollout (none is reused)
    on_death: Callable[[int], bool] | None = None  # takes a dead replica out instead of a restart (autoscale)
    model_digest: str = ""  # the driver's copy of the model (``relayrl.models.digest``); every engine's must match

    def __post_init__(self) -> None:
        self.ids = self.ids or list(range(len(self.rollouts)))

    def replica(self, rid: int) -> Any:
        return self.rollouts[self.ids.index(rid)]

    @classmethod
    def start(cls, cfg: Config, model_path: Path, placement: Placement, reward_fns: RewardFns, run: Any) -> System:
        """Create the sampler, N rollout actors and the trainer group; wait until all are ready."""
        from relayrl.controller.cluster import SCORING_CPUS
        from relayrl.rewards.pool import RewardPool
        from relayrl.rollout import start_rollout_actor
        from relayrl.trainer.ranks import TrainerGroup

        t0 = time.time()
        logger.info(
            "relayrl: starting %d vLLM engine(s), %d trainer rank(s) and the reward pool",
            cfg.rollout.num_replicas,
            cfg.trainer.world_size,
        )
        sampler = make_sampler(cfg, model_path)
        rollouts = [
            start_rollout_actor(
                str(model_path), cfg.model, rollout_config(cfg), cfg.run.seed + i, sync_cfg=cfg.weightsync, **opts
            )
            for i, opts in enumerate(placement.rollout)
        ]
        trainer = TrainerGroup(
            cfg.trainer.world_size,
            str(model_path),
            cfg.model,
            cfg.trainer,
            cfg.algorithm,
            temperature=cfg.rollout.temperature,
            seed=cfg.run.seed,
            actor_options=placement.trainer,
            critic_cfg=cfg.critic,
        )
        rc = cfg.reward
        rewards = RewardPool.start(
            reward_fns, rc.timeout_s, rc.num_workers, rc.groups_per_call, rc.max_error_rate, cpus=SCORING_CPUS
        )
        digest = model_digest(model_path)
        infos = wait_engines_up(rollouts, cfg.rollout.start_timeout_s, "the run's vLLM engines", digest)
        engines_up = time.time()
        trainer.connect_rollouts(sync_config(cfg.weightsync, placement), rollouts)
        startup = {
            "startup/engine_s": max(float(i["start_seconds"]) for i in infos),
            "startup/engines_up_s": engines_up - t0,
            "startup/actors_s": time.time() - t0,
        }
        logger.info(
            "relayrl: engines up in %.0fs, trainer ready and connected in %.0fs; training",
            engines_up - t0,
            startup["startup/actors_s"],
        )
        return cls(
            cfg,
            sampler,
            rollouts,
            trainer,
            rewards,
            model_path,
            placement,
            procs=[(i["node"], int(i["pid"])) for i in infos],
            startup=startup,
            model_digest=digest,
        )

    def dead_rollouts(self, timeout_s: float = 30.0) -> list[int]:
        """Replicas whose actor or engine no longer answers (a dead engine raises on any call)."""
        return [i for i, r in enumerate(self.rollouts) if not answers(r, timeout_s)]

    def restart_rollout(self, i: int, version: int, error: BaseException, during: str = "") -> None:
        """Replace replica ``i`` after ``error`` killed it (``during``: where, for the console line). A
        replacement that dies while it starts is one more attempt, after a backoff (``restart_backoff_s``);
        every attempt counts towards ``rollout.max_restarts``, past which the run stops naming the last
        error. Recovery that gives up on the first hiccup would end runs a second try survives."""
        logger.warning("relayrl: rollout replica %d died%s (%s); restarting it", i, during, type(error).__name__)
        for attempt in range(self.cfg.rollout.max_restarts + 1):
            if self.restarts >= self.cfg.rollout.max_restarts:
                break
            if attempt:
                delay = restart_backoff_s(attempt)
                logger.warning(
                    "relayrl: replacement of rollout replica %d died or hung while starting (%s); attempt %d in %gs",
                    i,
                    type(error).__name__,
                    attempt + 1,
                    delay,
                )
                time.sleep(delay)
            self.restarts += 1
            try:
                self._recreate_rollout(i, version)
                return
            except Exception as exc:
                if answers(self.rollouts[i]):
                    raise
                error = exc
        last = (str(error).strip().splitlines() or [""])[-1]
        raise RuntimeError(
            f"rollout replica {i} died again after {self.restarts} restarts (rollout.max_restarts): {last}"
        ) from error

    def _recreate_rollout(self, i: int, version: int) -> None:
        """One attempt: a new engine in replica ``i``'s bundle, the trainer reconnected to all engines, and
        the current weights synced at ``version`` before it generates (every engine reloads them; the new
        one would otherwise serve the initial model)."""
        from relayrl.rollout import cleanup_engine_segments, start_rollout_actor

        placement = self.placement
        assert placement is not None, "a System made by System.start has its placement"
        self._kill_rollout(i)
        self.rollouts[i] = start_rollout_actor(
            str(self.model_path),
            self.cfg.model,
            rollout_config(self.cfg),
            self.cfg.run.seed + i + 1000 * self.restarts,
            sync_cfg=self.cfg.weightsync,
            **placement.rollout[i],
        )
        infos = wait_engines_up(
            self.rollouts, self.cfg.rollout.start_timeout_s, f"rollout replica {i}'s replacement", self.model_digest
        )
        self.procs = [(info["node"], int(info["pid"])) for info in infos]
        cleanup_engine_segments()  # the dead replica's /dev/shm queue, now that its processes are gone
        self.trainer.connect_rollouts(sync_config(self.cfg.weightsync, placement), self.rollouts)
        if version > 0:
            self.sync_weights(version)

    def _kill_rollout(self, i: int) -> None:
        """End replica ``i`` for good: its engine processes by SIGKILL when it runs on this node (a stopped
        EngineCore survives ``ray.kill`` of its parent), then the actor. The actor's process is found in Ray's
        actor table: a replacement that hung while it started never answered ``info``."""
        from relayrl.rollout.cleanup import kill_process_tree

        where = actor_process(self.rollouts[i], reported=self.procs[i] if i < len(self.procs) else None)
        if where is not None and where[0] == ray.util.get_node_ip_address():
            kill_process_tree(where[1])
        ray.kill(self.rollouts[i], no_restart=True)

    def pause_rollouts(self, pause: bool = True) -> None:
        """Freeze the engines' running sequences (``pause("keep")``) or let them go on (the silent ones: faults)."""
        calls = [r.pause.remote("keep") if pause else r.resume.remote() for r in self.rollouts]
        for call in calls:
            with contextlib.suppress(Exception):
                ray.get(call, timeout=60)

    def occupancy(self, timeout_s: float = 10.0) -> list[dict[str, float]]:
        """Every replica's engine steps and running sequences since the last call (the silent ones left out)."""
        out = []
        for rollout in self.rollouts:
            with contextlib.suppress(Exception):  # a metric: a dead replica is the fault table's business
                out.append(ray.get(rollout.occupancy.remote(), timeout=timeout_s))
        return out

    def score(self, group_refs: list[ray.ObjectRef]) -> tuple[list[ray.ObjectRef], ray.ObjectRef]:
        """Start scoring: scored-group refs (one per input ref) and the ref of their ``Scored`` (useful
        groups, version span, the reward and rollout metrics), to read with ``rewards.result``; that raises
        ``RewardError`` (one line) when more than ``reward.max_error_rate`` of the completions could not be
        scored."""
        return self.rewards.submit(group_refs, functools.partial(step_summary, self.cfg.logging.samples_per_step))

    def sync_and_verify(self, version: int, refs: list) -> tuple[dict[str, float], float]:
        """Weights to the engines, then the mismatch probe; returns their stats and the bytes of trainer state
        offloaded. Colocated, this is also the hand-over back to rollout, ordered so the trainer's GPU memory
        is free before the engines' KV cache returns: engine weights wake -> sync -> the trainer's half of
        the probe -> trainer state to host -> KV cache wakes -> the engines' half of the probe."""
        if self.cfg.placement.mode != "colocated":
            return self.sync_recovering(version) | self.verify_sync(version, refs), 0.0
        ray.get([r.wake_up.remote(["weights"]) for r in self.rollouts])
        stats = self.sync_recovering(version)
        probe = self.mismatch_probe(version, refs)
        offloaded = self.trainer.offload() if self.cfg.placement.offload_trainer else 0.0
        ray.get([r.wake_up.remote(["kv_cache"]) for r in self.rollouts])
        return stats | self.check_mismatch(version, probe), offloaded

    def to_trainer(self) -> None:
        """Colocated: hand the bundles to the trainer: engines sleep (weights to host, KV cache dropped),
        then the trainer's state comes back onto the GPUs. On CPU neither frees anything."""
        ray.get([r.sleep.remote() for r in self.rollouts])
        if self.cfg.placement.offload_trainer:
            self.trainer.onload()

    def sync_recovering(self, version: int) -> dict[str, float]:
        """``sync_weights``; if it failed because an engine died, replace the dead ones and sync again (a
        trainer rank's death raises ``TrainerDied``)."""
        from relayrl.controller.faults import TrainerDied

        try:
            return self.sync_weights(version)
        except Exception as exc:
            if died := self.trainer.dead_ranks():
                raise TrainerDied(f"trainer rank {died[0]} died during the sync of v{version}") from exc
            if not self.replace_dead_rollouts(exc, 0):  # the retry below brings every engine to ``version``
                raise
            return self.sync_weights(version)

    def replace_dead_rollouts(self, error: BaseException, version: int, during: str = "") -> bool:
        """Replace every replica that no longer answers after ``error`` (synced to ``version`` when > 0), unless
        ``on_death`` took it out (autoscale); False when all answer, i.e. ``error`` was not a replica's death."""
        if not (dead := [self.ids[i] for i in self.dead_rollouts()]):
            return False
        for rid in dead:
            if not (self.on_death and self.on_death(rid)):
                self.restart_rollout(self.ids.index(rid), version, error, during)
        return True

    def sync_weights(self, version: int) -> dict[str, float]:
        """Trainer ranks gather their shards bucket by bucket and every engine commits them as ``version``.

        The transaction runs inside the trainer (rank 0 drives the engines); if it fails - or the trainer
        dies mid-sync and cannot say so - the engines are told here to abort, so they resume serving the
        previous version before the error propagates.
        """
        try:
            stats = self.trainer.sync_weights(version)
        except Exception:
            abort_update(self.rollouts, "trainer-side sync failed", self.cfg.weightsync.timeout_s)
            raise
        if self.cfg.weightsync.pull_when == "admission":  # published only: each replica fetches on its next call
            return stats
        versions = ray.get([r.weight_version.remote() for r in self.rollouts])
        if versions != [version] * len(versions):
            raise RuntimeError(f"after syncing v{version} the engines report versions {versions}")
        return stats

    def verify_sync(self, version: int, group_refs: list[ray.ObjectRef]) -> dict[str, float]:
        """Every ``weightsync.verify_every`` syncs: score a few of this step's completions in the engines
        and in the trainer at temperature 1 and compare (``mismatch/*``); fail fast past the threshold."""
        return self.check_mismatch(version, self.mismatch_probe(version, group_refs))

    def mismatch_probe(self, version: int, group_refs: list[ray.ObjectRef]) -> tuple | None:
        """The trainer's half of ``verify_sync`` (None on syncs that are not checked): sequences, where their
        completions start, the trainer's logprobs, from one trainer call on groups the ranks fetch themselves.
        Split off so colocated runs can take it before the trainer's state leaves the GPU and ask the engines
        after they woke up."""
        ws = self.cfg.weightsync
        if not ws.verify_every or version % ws.verify_every:
            return None
        return self.trainer.probe(group_refs[:1], ws.verify_samples)

    def check_mismatch(self, version: int, probe: tuple | None) -> dict[str, float]:
        """The engines' half: their logprobs on the probe's sequences against the trainer's. A replica that died
        meanwhile is replaced (its successor synced to ``version``) and the engines are asked again; a
        replica that answers but errs, or logprobs past ``weightsync.max_mismatch``, stop the run."""
        from relayrl.weightsync.client import WeightSyncError
        from relayrl.weightsync.verify import logprob_mismatch

        if probe is None:
            return {}
        seqs, starts, trainer = probe
        try:
            engine = self.engine_logprobs(seqs, self.catch_up(version))
        except Exception as exc:
            if not self.replace_dead_rollouts(exc, version, f" during the probe of v{version}"):
                raise
            engine = self.engine_logprobs(seqs, self.catch_up(version))  # the replacements hold ``version`` too
        stats = logprob_mismatch(engine, trainer, starts)
        if stats[MISMATCH_MEAN_ABS] > self.cfg.weightsync.max_mismatch:
            raise WeightSyncError(
                f"after sync v{version} engine and trainer logprobs differ by "
                f"{stats[MISMATCH_MEAN_ABS]:.3g} nats/token (> weightsync.max_mismatch="
                f"{self.cfg.weightsync.max_mismatch:g}): the engine is not running the "
                "trainer's weights"
            )
        return stats

    def engine_logprobs(self, seqs: list[list[int]], rollouts: list[Any] | None = None) -> list[list[float]]:
        """Each sequence's per-token logprobs from the engines (``rollouts``: all), spread over the replicas."""
        rollouts = rollouts or self.rollouts
        return ray.get([rollouts[i % len(rollouts)].prompt_logprobs.remote(s) for i, s in enumerate(seqs)])

    def catch_up(self, version: int) -> list[Any]:
        """The replicas that serve ``version``: all of them after a push. With ``weightsync.pull_when=admission``
        each fetches it first (the probe and evaluation need it now); one whose fetch fails keeps its old
        version and is left out, and if every fetch fails the first failure is raised."""
        if self.cfg.weightsync.pull_when != "admission":
            return self.rollouts
        from relayrl.weightsync.store import fetch_error

        caught, errors = [], []
        for rollout, ref in [(r, r.fetch_version.remote(version)) for r in self.rollouts]:
            try:
                ray.get(ref)
                caught.append(rollout)
            except ray.exceptions.RayTaskError as exc:
                if (cause := fetch_error(exc)) is None:
                    raise
                errors.append(cause)
                logger.warning("relayrl: a replica could not fetch v%d and keeps its old version: %s", version, cause)
        if not caught and errors:
            raise errors[0]
        return caught

    def shutdown(self) -> None:
        for r in self.rollouts:
            with contextlib.suppress(Exception):  # best effort; the actor is killed next anyway
                ray.get(r.shutdown.remote(), timeout=30)
            ray.kill(r)
        self.trainer.shutdown()
        self.rewards.shutdown()


def make_sampler(cfg: Config, model_path: Path) -> PromptSampler:
    """Prompts from the configured task, formatted with the model's chat template, in per-replica chunks (one
    prompt each with ``rollout.stream``)."""
    from relayrl.data import load_task
    from relayrl.data.sampler import chat_formatter
    from relayrl.models import load_tokenizer

    tokenizer = load_tokenizer(model_path)  # the one the driver's prompt check loaded
    rows = load_task(cfg.data)
    return PromptSampler(
        rows,
        PolicyConfig.from_config(cfg, cfg.rollout.num_replicas).chunk,
        cfg.data.seed,
        chat_formatter(tokenizer, cfg.data.chat_template),
        sampling_seed=cfg.run.seed,
    )
