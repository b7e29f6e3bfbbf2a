"""Rollout replicas joining and leaving a running job (``relayrl scale``), and the effects of each change.

``relayrl scale <run dir> --replicas N`` (or ``relayrl.scale``) writes the target into the run directory's
``control/replicas.json``; the running driver reads it between calls (``Membership.update``):

- **Join.** A replica gets its own one-bundle placement group, so Ray starts it wherever a node has the
  resources (a pending group waits for a node to join). Once its engine is up, and at a moment the trainer
  is idle, the trainer is connected to every engine and the current version is synced to them all (the sync
  transaction, so a joiner whose layout digest differs from the trainer's is refused there and ended before
  it serves). Then its slots join the free ones.
- **Leave.** The slowest serving replica is retired (``StepPolicy.retire``): it takes no new chunk, its
  calls finish (or, with ``hand_back``, go back to be generated elsewhere under their seqs), and once it is
  drained the trainer is reconnected to the others and its actor ended.

The staleness bound and the prompt accounting are the policy's, unchanged by either. Every change is one
console line; each step logs ``rollout/replicas`` (serving) and ``rollout/reissued``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from relayrl.controller.replicas import check_same_model
from relayrl.weightsync.client import last_line

logger = logging.getLogger(__name__)

CONTROL_FILE = Path("control") / "replicas.json"
READ_EVERY_S = 0.5


class ScaleError(RuntimeError):
    """``relayrl scale`` was refused: nothing changed."""


def request_scale(run_dir: str | Path, replicas: int) -> str:
    """Ask the driver of the running ``run_dir`` for ``replicas`` rollout replicas; returns the console line.
    Refused (``ScaleError``, one line, nothing written) for a run that is not running on this host or a count
    below ``rollout.autoscale.min`` (at least 1)."""
    from relayrl.monitor.runs import is_live

    path = Path(run_dir)
    if not is_live(path):
        raise ScaleError(f"{path} is not a running run on this host (status.json); nothing changed")
    floor = max(1, _autoscale_min(path))
    if replicas < floor:
        raise ScaleError(f"--replicas {replicas} is below rollout.autoscale.min={floor} of {path}; nothing changed")
    target = path / CONTROL_FILE
    target.parent.mkdir(exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps({"replicas": replicas, "time": time.time()}))
    os.replace(tmp, target)
    return f"relayrl: asked {path} for {replicas} rollout replica(s); the driver applies it between calls"


def _autoscale_min(run_dir: Path) -> int:
    import yaml

    try:
        return int(yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]["autoscale"]["min"])
    except (OSError, KeyError, TypeError, ValueError, AttributeError):
        return 1


def read_target(run_dir: Path) -> int | None:
    """The replica count last asked for (None: never asked, or the file is half-written or malformed)."""
    try:
        value = json.loads((run_dir / CONTROL_FILE).read_text())["replicas"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) and value >= 1 else None


@dataclass
class Joining:
    """A replica starting: its policy id, actor, the ref of its ``info`` (ready once the engine is up)."""

    rid: int
    actor: Any
    info: Any
    group: Any  # its placement group
    opts: dict  # the actor options that put it there (a restart reuses them)
    t0: float


class Membership:
    """The scheduler's side of joins and leaves (module docstring): one per run, polled every loop turn."""

    def __init__(self, scheduler: Any):
        self.s = scheduler
        self.joining: list[Joining] = []
        self.autoscale = scheduler.cfg.rollout.autoscale.max > 0
        self.target: int | None = scheduler.cfg.rollout.autoscale.max or None  # autoscale: keep asking for max
        self.read_at = -READ_EVERY_S  # when the control file was last read
        self.groups: dict[int, Any] = {}  # placement group of each replica that joined
        if self.autoscale:  # a replica found dead in a sync or probe leaves at once instead of a restart
            scheduler.system.on_death = self.lose_now

    @property
    def serving(self) -> list[int]:
        return self.s.policy.replicas.serving()

    def update(self, quiet: bool) -> None:
        """Read the target, start joins or retire replicas toward it; with ``quiet`` (no step training: the
        trainer can be reconnected) admit the joiners that are up and end the drained replicas."""
        now = time.monotonic()
        target = None
        if now - self.read_at >= READ_EVERY_S:  # the loop turns per event; the file is read at most this often
            self.read_at, target = now, read_target(self.s.run.path)
        if target is not None and target != self.target:
            self.target = target
            logger.info("relayrl: %d rollout replica(s) asked for; %d serving", target, len(self.serving))
        if self.target is not None:
            self._toward(self.target)
        if quiet:
            self._admit_ready()
            self._end_drained()

    def lose(self, rid: int) -> None:
        """Autoscale: replica ``rid`` died (its node went): it leaves, its calls handed back to the others; it is
        asked for again (a placement group that waits for a node). Not while it is the only one serving."""
        self.s.policy.retire(rid, hand_back=True)
        logger.warning("relayrl: rollout replica %d is gone (its node left?); %d serving", rid, len(self.serving))

    def lose_now(self, rid: int) -> bool:
        """``lose``, and the replica taken out at once (the trainer is idle: a sync or its probe found it dead);
        False, to restart it instead, while it is the only one serving."""
        policy = self.s.policy
        if len(self.serving) <= 1 and policy.replicas.takes_work(rid):
            return False
        if policy.replicas.takes_work(rid):
            self.lose(rid)
        remove_rollout(self.s.system, rid, self.groups.pop(rid, None))
        policy.replicas.remove(rid)
        return True

    def _toward(self, target: int) -> None:
        policy = self.s.policy
        have = len(self.serving) + len(self.joining)
        for _ in range(target - have):
            self._start()
        while self.joining and len(self.serving) + len(self.joining) > target:  # not needed any more
            join = self.joining.pop()
            end_rollout(join.actor, join.group)
            logger.info("relayrl: rollout replica %d will not join (the target went down)", join.rid)
        while len(self.serving) > target and len(self.serving) > 1 and not self.joining:
            r = policy.replicas.slowest(self.serving)
            policy.retire(r)
            logger.info("relayrl: rollout replica %d is leaving (it finishes its calls first)", r)

    def _start(self) -> None:
        from relayrl.controller.cluster import rollout_config
        from relayrl.rollout import start_rollout_actor

        cfg, rid = self.s.cfg, self.s.policy.replicas.next_id
        self.s.policy.replicas.next_id += 1  # reserved; live only once admitted
        group, opts = replica_bundle(cfg)
        actor = start_rollout_actor(
            str(self.s.system.model_path),
            cfg.model,
            rollout_config(cfg),
            cfg.run.seed + rid,
            sync_cfg=cfg.weightsync,
            **opts,
        )
        self.joining.append(Joining(rid, actor, actor.info.remote(), group, opts, time.perf_counter()))
        logger.info("relayrl: rollout replica %d is starting (waits for a node with its resources)", rid)

    def _admit_ready(self) -> None:
        for join in list(self.joining):
            ready, _ = ray.wait([join.info], timeout=0)
            if ready:
                self.joining.remove(join)
                self._admit(join)

    def _admit(self, join: Joining) -> None:
        """Connect and sync the joiner with the others (a failure ends it: the others keep their version)."""
        s, version = self.s, self.s.policy.version
        try:
            info = ray.get(join.info)
            seconds = add_rollout(s.system, join, info, version)
        except Exception as exc:  # noqa: BLE001 - a joiner that cannot serve is refused; the run goes on
            logger.warning("relayrl: rollout replica %d refused: %s", join.rid, last_line(exc))
            end_rollout(join.actor, join.group)
            return
        self.groups[join.rid] = join.group
        s.policy.replicas.live.add(join.rid)
        s.idle += [join.rid] * s.policy.pc.slots
        logger.info(
            "relayrl: rollout replica %d joined after %.0fs (v%d synced in %.1fs); %d serving",
            join.rid,
            time.perf_counter() - join.t0,
            version,
            seconds,
            len(self.serving),
        )

    def _end_drained(self) -> None:
        policy = self.s.policy
        for r in sorted(policy.replicas.draining):
            if policy.drained(r):
                remove_rollout(self.s.system, r, self.groups.pop(r, None))
                policy.replicas.remove(r)
                logger.info("relayrl: rollout replica %d left; %d serving", r, len(self.serving))

    def shutdown(self) -> None:
        for join in self.joining:
            end_rollout(join.actor, join.group)
        self.joining.clear()


def replica_bundle(cfg: Any) -> tuple[Any, dict]:
    """A one-bundle placement group for a joining replica and the actor options that put it there."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    gpus = ray.cluster_resources().get("GPU", 0) > 0
    bundle = {"CPU": cfg.rollout.num_cpus, **({"GPU": cfg.rollout.workers} if gpus else {})}
    group = placement_group([bundle])
    strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=0)
    opts = {"num_cpus": cfg.rollout.num_cpus, "scheduling_strategy": strategy}
    return group, opts | ({"num_gpus": cfg.rollout.workers} if gpus else {})


def add_rollout(system: Any, join: Joining, info: dict, version: int) -> float:
    """Put the joiner beside the system's replicas, reconnect the trainer to all of them and sync ``version``
    to every engine (all of them reload it); returns the sync's seconds. On failure the joiner is taken out
    again and the trainer reconnected to the others before the error propagates."""
    from relayrl.controller.cluster import sync_config

    if system.model_digest:  # before it joins anything: a joiner with another model never serves
        check_same_model(info, system.model_digest)
    placement = system.placement
    node = ray.util.placement_group_table(join.group)["bundles_to_node_id"][0]
    system.rollouts.append(join.actor)
    system.ids.append(join.rid)
    system.procs.append((info["node"], int(info["pid"])))
    placement.rollout.append(join.opts)  # a restart of the joiner uses its own bundle
    placement.rollout_nodes.append(node)
    t0 = time.perf_counter()
    try:
        system.trainer.connect_rollouts(sync_config(system.cfg.weightsync, placement), system.rollouts)
        system.sync_weights(version)
    except Exception:
        _forget(system, len(system.rollouts) - 1)
        system.trainer.connect_rollouts(sync_config(system.cfg.weightsync, placement), system.rollouts)
        raise
    return time.perf_counter() - t0


def remove_rollout(system: Any, rid: int, group: Any) -> None:
    """Take replica ``rid`` out: the trainer reconnected to the others first, then its actor ended."""
    from relayrl.controller.cluster import sync_config

    i = system.ids.index(rid)
    actor = system.rollouts[i]
    _forget(system, i)
    system.trainer.connect_rollouts(sync_config(system.cfg.weightsync, system.placement), system.rollouts)
    end_rollout(actor, group)


def _forget(system: Any, i: int) -> None:
    for items in (system.rollouts, system.ids, system.procs, system.placement.rollout, system.placement.rollout_nodes):
        if i < len(items):
            items.pop(i)


def end_rollout(actor: Any, group: Any) -> None:
    """End a replica's actor (its engine shuts down first, best effort) and free its placement group."""
    import contextlib

    from ray.util.placement_group import remove_placement_group

    with contextlib.suppress(Exception):
        ray.get(actor.shutdown.remote(), timeout=30)
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)
    if group is not None:
        with contextlib.suppress(Exception):
            remove_placement_group(group)
