"""``relayrl simulate``: a recipe on a described GPU cluster, through the simulator, and layouts ranked by it.

A *scenario* is a recipe (its algorithm, batch, response length, mode, staleness bound, streaming) on a
cluster file (``relayrl.plan.specs``: GPUs, nodes, the rollout:trainer split, tensor parallelism, the model).
``scenario()`` builds the ``PolicyConfig`` the scheduler would build for it (replicas = rollout GPUs / tp,
placement from the cluster file) and the analytic ``CostModel``; ``run()`` simulates it. ``rank_layouts()``
simulates every layout of the cluster's GPUs (placements, splits, tensor-parallel sizes, sync or async with
each staleness bound) and orders those whose memory fits by simulated throughput.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayrl.config import Config
from relayrl.config.trainer import AUTO_SHARE, every_of
from relayrl.controller.policy import PolicyConfig
from relayrl.plan.cost_model import AnalyticCosts
from relayrl.plan.costs import Cluster, Workload, activation_bytes, memory_fits, memory_per_device
from relayrl.plan.ptdp import PTDP
from relayrl.plan.simulate import SimResult, simulate
from relayrl.plan.specs import ClusterSpec, cluster_spec, load_cluster
from relayrl.plan.swarm_events import Swarm
from relayrl.plan.train_time import layout_training

CLUSTERS_DIR = Path(__file__).parent / "clusters"
DEFAULT_PROMPT_LEN = 256
"""Prompt tokens when the cluster file's ``workload`` does not give ``prompt_len`` (an assumption, printed)."""


@dataclass
class Scenario:
    pc: PolicyConfig
    costs: AnalyticCosts
    steps: int
    pause_while_training: bool = False
    checkpoint_every: int = 0
    swarm: Swarm = dataclasses.field(default_factory=Swarm)
    train_note: str = ""  # why the step's training is priced by an assumed MFU, or why its layout is odd

    @property
    def cluster(self) -> Cluster:
        return self.costs.cluster

    @property
    def workload(self) -> Workload:
        return self.costs.workload

    def run(self, steps: int | None = None) -> SimResult:
        return simulate(
            self.pc,
            self.costs,
            steps or self.steps,
            pause_while_training=self.pause_while_training,
            checkpoint_every=self.checkpoint_every,
            swarm=self.swarm,
        )


def find_cluster(name: str) -> ClusterSpec:
    """A cluster file by path, or by name from the shipped ones (``relayrl/plan/clusters/<name>.yaml``)."""
    path = Path(name)
    if not path.is_file():
        path = CLUSTERS_DIR / f"{name}.yaml"
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in CLUSTERS_DIR.glob("*.yaml")))
        raise FileNotFoundError(f"--cluster {name}: no such file and no shipped cluster of that name ({shipped})")
    return load_cluster(path)


def workload(cfg: Config, spec: ClusterSpec) -> Workload:
    """The step's work: B, G and response_len from the recipe, the model's shapes from the cluster file, a KL
    term's reference forward when ``algorithm.kl_coef`` > 0, the trainer's head chunk and checkpointing
    (``checkpointing``); the file's ``workload`` mapping overrides any."""
    m = spec.model
    stream_seqs = cfg.rollout.in_flight if cfg.rollout.stream and cfg.rollout.in_flight else 0
    fields: dict[str, Any] = {
        "params": m.params,
        "prompt_len": DEFAULT_PROMPT_LEN,
        "response_len": cfg.rollout.max_tokens,
        "response_max": cfg.rollout.max_tokens,
        "prompts_per_step": cfg.run.prompts_per_step,
        "group_size": cfg.algorithm.group_size,
        "kv_bytes_per_token": m.kv_bytes_per_token,
        "layers": m.layers,
        "hidden": m.hidden,
        "heads": m.hidden // m.head_dim if m.head_dim > 0 else 0,
        "extra_forwards": 1 if cfg.algorithm.kl_coef > 0 else 0,
        "vocab": m.vocab,
        "tied_embeddings": m.tied,
        "logits_chunk": cfg.trainer.logits_chunk,
        **({"max_num_seqs": stream_seqs} if stream_seqs else {}),
    }
    names = {f.name for f in dataclasses.fields(Workload)}
    if bad := sorted(set(spec.workload) - names):
        raise ValueError(f"cluster workload has {', '.join(bad)}; valid: {', '.join(sorted(names))}")
    wl = Workload(**{**fields, **spec.workload})
    if "activation_checkpointing" in spec.workload:
        return wl
    on = checkpointing(cfg.trainer.activation_checkpointing, wl, spec.cluster.hardware.memory_bytes)
    return dataclasses.replace(wl, activation_checkpointing=on)


def checkpointing(mode: str, wl: Workload, memory_bytes: float) -> bool:
    """Whether the trainer checkpoints, as it decides: off -> no; full or every N-th -> yes (the check counts
    every layer's input either way); auto -> yes when one longest context's activations without it exceed
    ``AUTO_SHARE`` of a device's memory."""
    every = every_of(mode)
    if every is not None:
        return every > 0
    bare = dataclasses.replace(wl, activation_checkpointing=False)
    return activation_bytes(bare, wl.prompt_len + wl.longest_response) > AUTO_SHARE * memory_bytes


def scenario(cfg: Config, spec: ClusterSpec) -> Scenario:
    """The run ``cfg`` would make on ``spec``'s cluster: its policy exactly as ``PolicyConfig.from_config``
    builds it for the cluster's replicas (placement from the cluster file), and the analytic costs."""
    replicas = spec.replicas
    if not cfg.rollout.stream and cfg.run.prompts_per_step % replicas:
        raise ValueError(
            f"run.prompts_per_step={cfg.run.prompts_per_step} does not divide over {replicas} rollout replicas "
            f"(rollout_gpus / rollout_tp); change one, or set rollout.stream=true"
        )
    pc = dataclasses.replace(PolicyConfig.from_config(cfg, replicas), colocated=spec.cluster.placement == "colocated")
    wl, cl = workload(cfg, spec), spec.cluster
    training, note = layout_training(cl.hardware, wl, cl.trainer_devices, cl.gpus_per_node, named_layout(cfg))
    return Scenario(
        pc,
        AnalyticCosts(cl, wl, training),
        cfg.run.steps,
        cfg.rollout.pause_while_training,
        cfg.run.checkpoint_every,
        spec.swarm,
        note,
    )


def named_layout(cfg: Config) -> PTDP | None:
    """The t, p, v and schedule the recipe names (``trainer.tp_size``, ``pp_size``), or None when both are 1."""
    tr = cfg.trainer
    if tr.tp_size == 1 and tr.pp_size == 1:
        return None
    return PTDP(tr.tp_size, tr.pp_size, 1, 1, 1, tr.pp_virtual_stages, tr.pp_schedule)


def train_line(sc: Scenario) -> str:
    """How the step's training is priced: the layout and the MFU it gives, or the assumed MFU and why."""
    hw, wl, training = sc.cluster.hardware, sc.workload, sc.costs.training
    if training is None:
        return f"train: MFU {hw.mfu:.0%} assumed ({sc.train_note}: costs.train_s)"
    return training.describe(hw, wl) + (f"; {sc.train_note}" if sc.train_note else "")


HEADER = (
    f"{'step':>4} {'step_s':>9} {'generate':>9} {'train':>9} {'sync':>8} {'idle ro':>8} {'idle tr':>8} {'stale':>5}"
    f" {'repl':>5} {'tokens/s':>9}"
)

# ---- the report --------------------------------------------------------------------------------------------


def timeline(result: SimResult) -> list[dict[str, float]]:
    """Per step: its seconds, each pool's busy time split by what (generate on the rollout pool as mean busy
    seconds a replica; train and sync on the trainer), each pool's idle seconds, the replicas up (on average
    over the step) and the completion tokens the step trained per second of it."""
    out = []
    per_group = result.completions_per_group * result.tokens_per_completion
    for s in result.steps:
        inside = [sp for sp in result.spans if sp.lane == "trainer" and sp.start < s.end and sp.end > s.start]
        by = {w: sum(min(sp.end, s.end) - max(sp.start, s.start) for sp in inside if sp.what == w) for w in _TRAINER}
        out.append(
            {
                "step": s.step,
                "start_s": s.start,
                "step_s": s.step_s,
                "generate_s": s.rollout_busy / s.replicas,
                **{f"{w}_s": v for w, v in by.items()},
                "idle_rollout_s": s.rollout_idle_s / s.replicas,
                "idle_trainer_s": s.trainer_idle_s,
                "staleness_mean": s.staleness.get("staleness/mean", 0.0),
                "replicas": s.replicas,
                "tokens_per_s": s.groups * per_group / max(s.step_s, 1e-12),
            }
        )
    return out


_TRAINER = ("train", "sync", "switch", "checkpoint")


def report_lines(sc: Scenario, result: SimResult, name: str = "") -> list[str]:
    """What ``relayrl simulate`` prints: the assumptions, the per-step timeline, throughput, idle, staleness."""
    cl, wl = sc.cluster, sc.workload
    fits, why = memory_fits(cl, wl)
    mem = ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in memory_per_device(cl, wl).items())
    out = [
        (
            f"cluster {name}: {cl.hardware.name}, {cl.placement}, rollout {cl.rollout_devices} GPUs "
            f"({cl.replicas} replicas x tp {cl.rollout_tp}), trainer {cl.trainer_devices} GPUs, sync {cl.sync}"
        ),
        f"workload: P={wl.params / 1e9:.2f}B, B={wl.prompts_per_step} x G={wl.group_size}, prompt {wl.prompt_len} "
        f"+ response {wl.mean_response:.0f} tokens (mean; cap {wl.longest_response}), engine batch "
        f"{sc.costs.engine_seqs} (max_num_seqs {wl.max_num_seqs}), k={sc.pc.max_staleness}"
        + (" stream" if sc.pc.stream else ""),
        train_line(sc),
        f"memory a device: {mem} of {cl.hardware.memory_bytes / 2**30:.0f} GiB"
        + ("" if fits else f"  DOES NOT FIT: {why}"),
        *swarm_lines(sc.swarm),
        HEADER,
    ]
    out += [
        f"{row['step']:>4} {row['step_s']:>9.2f} {row['generate_s']:>9.2f} {row['train_s']:>9.2f} "
        f"{row['sync_s']:>8.2f} {row['idle_rollout_s']:>8.2f} {row['idle_trainer_s']:>8.2f} "
        f"{row['staleness_mean']:>5.2f} {row['replicas']:>5.1f} {row['tokens_per_s']:>9.0f}"
        for row in timeline(result)
    ]
    out += result.lines()[len(result.steps) + 1 :]  # throughput, idle, staleness
    return out


def swarm_lines(swarm: Swarm) -> list[str]:
    """The replicas' speeds and membership events, when the cluster file gives any."""
    out = [f"replica speeds: {', '.join(f'{v:g}' for v in swarm.speeds)}"] if swarm.speeds else []
    for ev in swarm.events:
        when = f"after step {ev.step}" if ev.step is not None else f"at {ev.at:g} s"
        what = f"{ev.join} join (speed {ev.speed:g})" if ev.join else f"leave: {ev.leave}"
        out.append(f"swarm: {when}, {what}")
    return out


def write_outputs(sc: Scenario, result: SimResult, out: Path, gantt_steps: int = 4) -> list[Path]:
    """timeline.json (steps, spans, throughput, staleness) and gantt.png of the first ``gantt_steps`` steps."""
    from relayrl.plan.gantt import gantt

    out.mkdir(parents=True, exist_ok=True)
    data = {
        "steps": timeline(result),
        "spans": [dataclasses.asdict(s) for s in result.spans],
        "throughput": result.throughput(),
        "idle": result.idle(),
        "staleness": {str(k): v for k, v in sorted(result.staleness.items())},
        "median_step_s": result.step_s(),
        "reissued": result.policy.reissued,
        "groups_by_replica": {str(r): n for r, n in sorted(result.groups_by_replica.items())},
    }
    (out / "timeline.json").write_text(json.dumps(data, indent=1))
    end = result.steps[min(gantt_steps, len(result.steps)) - 1].end if result.steps else result.wall_s
    gantt(result, out / "gantt.png", until=end)
    return [out / "timeline.json", out / "gantt.png"]


# ---- the planner -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ranked:
    label: str
    overrides: dict[str, Any]  # cluster-file keys and recipe overrides that give this layout
    step_s: float
    tokens_per_s: float
    idle: dict[str, float]
    fits: bool
    why: str = ""


SPLITS = (0.25, 0.375, 0.5, 0.625, 0.75)
"""Rollout shares of the GPUs a separate layout tries (rounded to whole replicas)."""


def candidate_layouts(spec: ClusterSpec, ks: tuple[int, ...]) -> list[tuple[dict[str, Any], str, int]]:
    """(cluster-file changes, mode, k) of every layout: colocated sync on all GPUs, and separate splits
    (``SPLITS``) in sync and async with each k, for tensor-parallel sizes 1, 2, 4, 8 up to a node."""
    total = spec.gpus
    tps = [tp for tp in (1, 2, 4, 8) if tp <= spec.cluster.gpus_per_node]
    out: list[tuple[dict[str, Any], str, int]] = []
    for tp in tps:
        if total % tp == 0:
            every = {"placement": "colocated", "rollout_devices": total, "trainer_devices": total, "rollout_tp": tp}
            out.append((every, "sync", 0))
        splits = sorted({max(tp, round(share * total / tp) * tp) for share in SPLITS})
        for r in splits:
            if r >= total:
                continue
            base = {"placement": "separate", "rollout_devices": r, "trainer_devices": total - r, "rollout_tp": tp}
            out.append((base, "sync", 0))
            out += [(base, "async", k) for k in ks if k >= 1]
    return out


def rank_layouts(cfg: Config, spec: ClusterSpec, ks: tuple[int, ...] = (1,), steps: int = 8) -> list[Ranked]:
    """Every candidate layout simulated for ``steps`` steps; fitting ones by simulated tokens/s (fastest
    first), then the ones that do not fit, with why."""
    if spec.swarm != Swarm():
        raise ValueError("--rank ranks fixed layouts of one GPU speed: remove the cluster file's swarm section")
    ranked = []
    for changes, mode, k in candidate_layouts(spec, ks):
        s = dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, **changes))
        c = cfg if mode == cfg.mode and k == cfg.buffer.max_staleness else _mode(cfg, mode, k)
        if not cfg.rollout.stream and cfg.run.prompts_per_step % s.replicas:
            continue
        sc = scenario(c, s)
        fits, why = memory_fits(sc.cluster, sc.workload)
        result = sc.run(steps)
        split = f"{changes['rollout_devices']:>4}:{changes['trainer_devices']:<4}"
        label = f"{changes['placement']:<9} {split} tp{changes['rollout_tp']} " + (
            "sync" if mode == "sync" else f"async k={k}"
        )
        ranked.append(
            Ranked(
                label,
                {**changes, "mode": mode, "buffer.max_staleness": k},
                result.step_s(skip=2),
                result.throughput()["tokens_per_s"],
                result.idle(),
                fits,
                why,
            )
        )
    return sorted(ranked, key=lambda r: (not r.fits, -r.tokens_per_s, r.overrides["buffer.max_staleness"]))


def rank_lines(ranked: list[Ranked], top: int = 15) -> list[str]:
    out = [f"{'layout':<34} {'step_s':>9} {'tokens/s':>11} {'idle ro':>8} {'idle tr':>8}  memory"]
    out += [
        f"{r.label:<34} {r.step_s:>9.2f} {r.tokens_per_s:>11.0f} {r.idle['idle/rollout']:>8.2f} "
        f"{r.idle['idle/trainer']:>8.2f}  {'ok' if r.fits else r.why}"
        for r in ranked[:top]
    ]
    if len(ranked) > top:
        out.append(f"... {len(ranked) - top} more")
    return out


def _mode(cfg: Config, mode: str, k: int) -> Config:
    buffer = dataclasses.replace(cfg.buffer, max_staleness=k) if mode == "async" else cfg.buffer
    return dataclasses.replace(cfg, mode=mode, buffer=buffer)


__all__ = ["Scenario", "cluster_spec", "find_cluster", "rank_layouts", "report_lines", "scenario", "write_outputs"]
