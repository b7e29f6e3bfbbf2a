"""Published specs the simulator's cost models start from: accelerators, models, and a cluster file.

``GPUS``: datasheet figures (dense BF16 FLOP/s without sparsity, HBM bandwidth and size, NVLink one
direction per GPU, one NIC per GPU). ``MODELS``: parameter counts and the shapes that set KV-cache bytes and
tensor-parallel traffic, from the models' ``config.json``. The efficiencies (MFU, HBM efficiency) are not
published figures: ``Hardware`` carries assumed defaults, and a cluster file may override them.

A cluster file (``relayrl simulate --cluster FILE``) is YAML::

    gpu: h100-sxm          # a name from GPUS, or a mapping of Hardware fields
    nodes: 2
    gpus_per_node: 8
    rollout_gpus: 8        # separate placement: rollout + trainer <= nodes x gpus_per_node
    trainer_gpus: 8
    placement: separate    # separate | colocated (then rollout_gpus = trainer_gpus = every GPU)
    rollout_tp: 1          # tensor-parallel size of a rollout replica (replicas = rollout_gpus / rollout_tp)
    model: llama3-8b       # a name from MODELS, or a mapping of ModelSpec fields
    workload: {prompt_len: 256}       # Workload fields; the recipe gives B, G and response_len
    efficiency: {mfu: 0.4}            # Hardware fields to override (assumptions)
    links: {ib_gb_s: 50}              # nvlink_gb_s / ib_gb_s, GB/s one direction per GPU
    sync: rank0            # rank0 (relayrl's broadcast from trainer rank 0) | sharded (every rank sends its shard)
    restart_s: 0           # a rollout engine's start-up to its first weight sync: a replacement or a join
    swarm: {speeds: [1, 0.5], events: [{step: 20, leave: 1}]}   # relayrl.plan.swarm_events (separate only)

An unknown key, GPU or model is a ``ValueError`` naming the valid ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relayrl.plan.costs import Cluster, Hardware
from relayrl.plan.swarm_events import Swarm, parse_swarm

GB = 1e9

GPUS: dict[str, Hardware] = {
    # NVIDIA datasheets: dense BF16 tensor FLOP/s, HBM, NVLink (per GPU, one direction = half the quoted
    # bidirectional figure), one ConnectX NIC per GPU as in DGX/HGX systems.
    "h100-sxm": Hardware("h100-sxm", 989e12, 3.35e12, 450 * GB, 50 * GB, memory_bytes=80 * GB),
    "h800": Hardware("h800", 989e12, 3.35e12, 200 * GB, 50 * GB, memory_bytes=80 * GB),  # NVLink 400 GB/s
    "h200": Hardware("h200", 989e12, 4.8e12, 450 * GB, 50 * GB, memory_bytes=141 * GB),
    "h100-pcie": Hardware("h100-pcie", 756e12, 2.0e12, 300 * GB, 50 * GB, memory_bytes=80 * GB),
    "a100-80g": Hardware("a100-80g", 312e12, 2.039e12, 300 * GB, 25 * GB, memory_bytes=80 * GB),
    "a100-40g": Hardware("a100-40g", 312e12, 1.555e12, 300 * GB, 25 * GB, memory_bytes=40 * GB),
    "b200": Hardware("b200", 2.25e15, 8.0e12, 900 * GB, 50 * GB, memory_bytes=180 * GB),
    "l40s": Hardware("l40s", 362e12, 0.864e12, 32 * GB, 25 * GB, memory_bytes=48 * GB),  # PCIe 4.0 x16, no NVLink
}


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder: what the costs need. KV bytes per token = 2 (K, V) · layers · kv_heads · head_dim ·
    ``kv_dtype_bytes``."""

    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: float = 2.0
    vocab: int = 0  # the LM head's rows (0: unknown, no logits term in the memory check)
    tied: bool = False  # tie_word_embeddings: the head is the input embedding (one V x hidden matrix in params)

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes


MODELS: dict[str, ModelSpec] = {
    # config.json of each model (hidden_size, num_hidden_layers, num_key_value_heads, head_dim, vocab_size,
    # tie_word_embeddings)
    "llama3-8b": ModelSpec(8.03e9, 32, 4096, 8, 128, vocab=128256),
    "llama3-70b": ModelSpec(70.6e9, 80, 8192, 8, 128, vocab=128256),
    "llama3-405b": ModelSpec(405.9e9, 126, 16384, 8, 128, vocab=128256),
    "qwen2.5-1.5b": ModelSpec(1.54e9, 28, 1536, 2, 128, vocab=151936, tied=True),
    "qwen2.5-7b": ModelSpec(7.62e9, 28, 3584, 4, 128, vocab=152064),
    "qwen2.5-14b": ModelSpec(14.8e9, 48, 5120, 8, 128, vocab=152064),
    "qwen2.5-32b": ModelSpec(32.8e9, 64, 5120, 8, 128, vocab=152064),
    "qwen3-32b": ModelSpec(32.8e9, 64, 5120, 8, 128, vocab=151936),
    "smollm2-135m": ModelSpec(1.35e8, 30, 576, 3, 64, vocab=49152, tied=True),
}


@dataclass(frozen=True)
class ClusterSpec:
    """A parsed cluster file: the ``Cluster`` the costs take, the model, and workload fields to override."""

    cluster: Cluster
    model: ModelSpec
    model_name: str
    gpus: int  # nodes x gpus_per_node: what the planner shares out
    workload: dict[str, Any] = field(default_factory=dict)
    swarm: Swarm = field(default_factory=Swarm)

    @property
    def replicas(self) -> int:
        return self.cluster.rollout_devices // self.cluster.rollout_tp


KEYS: tuple[str, ...] = ("gpu", "nodes", "gpus_per_node", "rollout_gpus", "trainer_gpus", "placement", "rollout_tp")
KEYS += ("model", "workload", "efficiency", "links", "sync", "restart_s", "swarm")


def load_cluster(path: str | Path) -> ClusterSpec:
    """Parse a cluster file (module docstring); errors name the key and the valid choices."""
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a cluster file is a YAML mapping (keys: {', '.join(KEYS)})")
    return cluster_spec(data, source=str(path))


def cluster_spec(data: dict[str, Any], source: str = "cluster") -> ClusterSpec:
    if unknown := sorted(set(data) - set(KEYS)):
        raise ValueError(f"{source}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(KEYS)}")
    hw = _hardware(data.get("gpu", "h100-sxm"), source)
    hw = _replace(hw, data.get("efficiency") or {}, f"{source}: efficiency")
    links = dict(data.get("links") or {})
    if bad := sorted(set(links) - {"nvlink_gb_s", "ib_gb_s"}):
        raise ValueError(f"{source}: links has {', '.join(bad)}; valid: nvlink_gb_s, ib_gb_s")
    hw = dataclasses.replace(
        hw,
        nvlink_bytes_per_s=links.get("nvlink_gb_s", hw.nvlink_bytes_per_s / GB) * GB,
        ib_bytes_per_s=links.get("ib_gb_s", hw.ib_bytes_per_s / GB) * GB,
    )
    per_node, nodes = int(data.get("gpus_per_node", 8)), int(data.get("nodes", 1))
    total = per_node * nodes
    placement = data.get("placement", "separate")
    default_split = (total, total) if placement == "colocated" else (total // 2, total - total // 2)
    rollout, trainer = int(data.get("rollout_gpus", default_split[0])), int(data.get("trainer_gpus", default_split[1]))
    used = max(rollout, trainer) if placement == "colocated" else rollout + trainer
    if used > total:
        raise ValueError(
            f"{source}: rollout_gpus={rollout} + trainer_gpus={trainer} need {used} GPUs, the cluster has "
            f"{nodes} x {per_node} = {total}; lower them or add nodes"
        )
    cluster = Cluster(
        hw,
        rollout,
        trainer,
        placement,
        per_node,
        rollout_tp=int(data.get("rollout_tp", 1)),
        sync=data.get("sync", "rank0"),
        restart_s=float(data.get("restart_s", 0.0)),
    )
    name, model = _model(data.get("model", "llama3-8b"), source)
    workload = dict(data.get("workload") or {})
    return ClusterSpec(cluster, model, name, total, workload, _swarm(data.get("swarm") or {}, cluster, source))


def _swarm(data: dict[str, Any], cluster: Cluster, source: str) -> Swarm:
    """The ``swarm`` section, checked against the cluster: one speed a replica, events only when separate (a
    colocated node's GPUs are trainer ranks too: it cannot leave the rollout alone)."""
    swarm = parse_swarm(data, source)
    swarm.speeds_of(cluster.replicas)
    if swarm.events and cluster.placement == "colocated":
        raise ValueError(f"{source}: swarm.events need placement: separate (a colocated node also trains)")
    return swarm


def _hardware(gpu: Any, source: str) -> Hardware:
    if isinstance(gpu, dict):
        return _replace(Hardware(name=str(gpu.get("name", "custom"))), gpu, f"{source}: gpu")
    if gpu not in GPUS:
        raise ValueError(f"{source}: gpu={gpu!r} is not in the table; choose one of {', '.join(GPUS)} or give fields")
    return GPUS[gpu]


def _model(model: Any, source: str) -> tuple[str, ModelSpec]:
    if isinstance(model, dict):
        names = {f.name for f in dataclasses.fields(ModelSpec)}
        if bad := sorted(set(model) - names):
            raise ValueError(f"{source}: model has {', '.join(bad)}; valid: {', '.join(sorted(names))}")
        return "custom", ModelSpec(**model)
    if model not in MODELS:
        raise ValueError(f"{source}: model={model!r} is not in the table; choose one of {', '.join(MODELS)}")
    return model, MODELS[model]


def _replace(obj: Any, changes: dict[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(obj)}
    if bad := sorted(set(changes) - names):
        raise ValueError(f"{where} has {', '.join(bad)}; valid: {', '.join(sorted(names))}")
    return dataclasses.replace(obj, **changes)
