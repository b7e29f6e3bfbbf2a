"""Weight-sync throughput and overhead of each CPU backend, measured side by side in one run (issue 4).

What runs, all in this process tree on this box:

1. baseline   single-thread libc ``memcpy`` of the same bytes into a pre-faulted buffer (best of 3);
              a (multi-threaded) torch ``copy_`` is printed beside it for context, and what each checksum
              the ``pull`` store could use costs on those bytes (``bench/pull_vs_push.py``).
2. transport  a >= 500 MB fp32 state dict shaped like SmolLM2-135M, sent by the real ``TrainerSync``
              to a small Ray actor (``ReceiverHost``) that hosts the backend's real engine-side
              ``Receiver`` and checks stamped bytes; no vLLM, so commit is a no-op. 1 warm-up sync
              (it includes connect), median of ``--syncs``.
3. overhead   the same for tiny-llama's shapes (~1.4 MB): the fixed cost of a sync.
4. count      64 MB split into 8 .. 4096 tensors (time should not depend on the count).
5. bytes      64 .. 512 MB in ~100 tensors (time should grow linearly: constant s/GB).
6. vLLM       the real SmolLM2 weights into a real vLLM engine (``RolloutActor``), once per commit path
              (``weightsync.commit``: inplace, reload); the inplace engine takes shm, broadcast, then pull.
              Then the floor of any sync into vLLM's CPU engine, measured in this process on the same
              weights: one memcpy of the payload plus one oneDNN pack of every GEMM weight (vLLM's CPU
              linear reads only its packed copy), and the verdict on issue 16's goal (sync <= 0.15 s). Last,
              pull's total over each push's on the same weights, and the verdict on the swarm issue's goal
              (pull <= 1.2x push on one host); [2] prints the same ratio for the transport alone.
              Skipped with ``--quick``; ``--vllm-only`` runs just [1] and this.

Stage times come from ``TrainerSync.sync``'s metrics. "transfer" below is *measured* as
``total - connect - start - commit``: everything between the start and commit round trips, i.e. the
trainer packing the bytes plus the engines receiving and verifying them. (weightsync's own
``transfer_s`` times only the ``update_weights`` RPC; for ``shm`` the bytes are written before that
RPC, so its own figure leaves the copy out. Both are printed.)

Every phase runs each backend twice: with the driver's default torch threads (every core, as a
trainer rank runs) and with 1 thread (``shm/1t``, ``broadcast/1t``, ``pull/1t``). The trainer packs with
``Tensor.copy_``, which goes parallel above ~128 KB; on this 2-vCPU box that parallel copy is erratic
(ms-long stalls per call), and the 1-thread rows show what it costs. PASS/MISS is judged on the
default rows; the 1-thread verdicts are printed as a what-if.

Targets (issue 4): shm >= 0.5x memcpy, broadcast >= 0.25x memcpy (transfer GB/s over memcpy GB/s, 500 MB
dict), fixed overhead <= 20 ms (tiny model, total sync; pull too), flat in tensor count (max/min total time
<= FLAT_MAX), linear in bytes (t = a + b * bytes: every size within LINEAR_MAX of the least-squares
line over 64..512 MB; s/GB alone would also count the fixed overhead ``a`` against linearity).

Usage::

    .venv/bin/python -m bench.weight_sync [--quick | --vllm-only] [--syncs 5] [--tiny-syncs 10]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench import pull_vs_push
from bench.common import load_note
from bench.floor import pack_floor_s

BACKENDS = ("shm", "broadcast", "pull")
DEFAULT_THREADS = torch.get_num_threads()
# (backend, torch intra-op threads in the sending process). The default is what a trainer rank runs
# with (every core); the 1-thread rows show how much of the time is torch's parallel copy_ on this box.
VARIANTS = [(b, DEFAULT_THREADS) for b in BACKENDS] + [(b, 1) for b in BACKENDS]
MIN_MODEL_BYTES = 500_000_000
FLAT_MAX = 1.5  # "flat in tensor count": slowest / fastest split of the same bytes
LINEAR_MAX = 0.15  # "linear in bytes": largest |residual| / fitted time of a straight-line fit
TARGET_RATIO = {"shm": 0.5, "broadcast": 0.25}  # pull's target is against push: bench/pull_vs_push.py
TARGET_OVERHEAD_MS = 20.0
MB = 1 << 20


# ---- inputs -------------------------------------------------------------------------------------


def model_shapes(name: str, min_bytes: int = 0) -> tuple[dict[str, tuple[int, ...]], str]:
    """``{param name: shape}`` of built-in model ``name`` (fp32, tied weights once), from a meta-device
    model built from its real config; layers are added until the model holds ``min_bytes``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from relayrl.models import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(name))
    note = f"{name}: {config.num_hidden_layers} layers (real config)"
    while True:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}  # dedups tied parameters
        if sum(torch.Size(s).numel() for s in shapes.values()) * 4 >= min_bytes:
            return shapes, note
        config.num_hidden_layers += 2
        note = f"{name}: scaled to {config.num_hidden_layers} layers to reach {min_bytes / 1e6:.0f} MB"


def random_state_dict(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    return {n: torch.randn(s) for n, s in shapes.items()}


def split_shapes(nbytes: int, count: int) -> dict[str, tuple[int, ...]]:
    """``count`` equal fp32 tensors totalling ``nbytes``."""
    return {f"w{i}": (nbytes // 4 // count,) for i in range(count)}


def nbytes_of(sd: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


def stamp(sd: dict[str, torch.Tensor], version: int) -> None:
    """Write ``version`` into element 0 of the first and last tensor; the receiver checks it arrived."""
    names = list(sd)
    for n in (names[0], names[-1]):
        sd[n].view(-1)[0] = float(version)


# ---- baseline -----------------------------------------------------------------------------------


def memcpy_gbps(nbytes: int, repeats: int = 3) -> float:
    """Best-of-``repeats`` single-thread libc memcpy of ``nbytes`` into a pre-faulted destination."""
    libc = ctypes.CDLL(None)
    libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    libc.memcpy.restype = ctypes.c_void_p
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    best = min(_timed(lambda: libc.memcpy(dst.data_ptr(), src.data_ptr(), nbytes)) for _ in range(repeats))
    assert torch.equal(dst[:: 1 << 20], src[:: 1 << 20])
    return nbytes / best / 1e9


def torch_copy_gbps(nbytes: int, repeats: int = 3) -> float:
    """Same, with ``Tensor.copy_`` (uses torch's intra-op threads): what the trainer's pack calls."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    return nbytes / min(_timed(lambda: dst.copy_(src)) for _ in range(repeats)) / 1e9


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---- engine side without vLLM -------------------------------------------------------------------


class ReceiverHost:
    """Stands in for a RolloutActor: the calls ``RolloutClient`` makes, backed by the transport's real
    ``Receiver`` (as ``RelayWeightEngine`` uses it), minus vLLM. Commit loads nothing."""

    def __init__(self) -> None:
        self.receiver: Any = None
        self.layout: Any = None
        self.verified = 0

    def info(self) -> dict[str, int]:
        return {"workers": 1}

    def init_weight_transfer(self, info: dict[str, Any]) -> None:
        from relayrl.weightsync.layout import FlatLayout
        from relayrl.weightsync.names import RECEIVERS, load

        self.close()
        self.layout = FlatLayout.from_dict(info["layout"])
        self.receiver = load(RECEIVERS[info["transport"]])(self.layout, info["channel"], info.get("rank_offset", 0))

    def start_weight_update(self, version: int, timeout_s: float) -> None:
        pass

    def update_weights(self, info: dict[str, Any]) -> None:
        """Receive, then check the layout digest (as the engine does) and the two stamped elements."""
        from relayrl.weightsync.base import FlatUpdateInfo

        update = FlatUpdateInfo(**info)
        if update.digest != self.layout.digest:
            raise ValueError(f"layout digest {update.digest} != {self.layout.digest}")
        buffer = self.receiver.receive(self.layout, update)
        views = list(self.layout.views(buffer, 0, 1)) + list(self.layout.views(buffer, len(self.layout.slots) - 1))
        got = [float(t.view(-1)[0]) for _, t in views]
        if got != [float(update.version)] * 2:
            raise ValueError(f"v{update.version}: stamped elements read {got}")
        self.verified += 1

    def finish_weight_update(self, version: int) -> float:
        return 0.0

    def abort_weight_update(self, reason: str = "") -> float:
        return 0.0

    def count(self) -> int:
        return self.verified

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
        self.receiver = self.layout = None
        gc.collect()


# ---- running syncs ------------------------------------------------------------------------------


@contextlib.contextmanager
def torch_threads(n: int) -> Any:
    """Run the block with ``n`` torch intra-op threads in this (the sending) process."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def label(backend: str, threads: int) -> str:
    return backend if threads == DEFAULT_THREADS else f"{backend}/{threads}t"


def run_syncs(
    backend: str,
    threads: int,
    sd: dict[str, torch.Tensor],
    rollout: Any,
    syncs: int,
    version0: int = 1,
    stamped: bool = True,
    commit: str = "inplace",
) -> list[dict[str, float]]:
    """One warm-up sync (it connects) then ``syncs`` timed ones through the real ``TrainerSync``.

    ``stamped``: write the version into two elements first (the bench receiver checks them); off for
    a real engine, which must keep serving the real weights.
    """
    from relayrl.config import WeightSyncConfig
    from relayrl.weightsync.base import StateDictSource
    from relayrl.weightsync.sync import TrainerSync

    sync = TrainerSync(
        WeightSyncConfig(backend=backend, shm_dir="/dev/shm", commit=commit), StateDictSource(sd), 0, [rollout], [1]
    )
    rows = []
    try:
        with torch_threads(threads):
            for i in range(syncs + 1):
                if stamped:
                    stamp(sd, version0 + i)
                m = sync.sync(version0 + i)
                if i > 0:
                    rows.append(stages(m))
    finally:
        sync.close()
    return rows


def stages(m: dict[str, float]) -> dict[str, float]:
    """Seconds per stage; ``transfer`` = total - connect - start - commit (see the module docstring)."""
    g = {k: m.get(f"weightsync/{k}_s", 0.0) for k in ("connect", "start", "transfer", "commit", "total")}
    return {
        "total": g["total"],
        "start": g["start"],
        "commit": g["commit"],
        "reported": g["transfer"],
        "transfer": g["total"] - g["connect"] - g["start"] - g["commit"],
        "stall": m["weightsync/stall_s"],
        "bytes": m["weightsync/bytes"],
    }


def median(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


# ---- phases -------------------------------------------------------------------------------------


def phase_transport(receiver: Any, syncs: int, memcpy: float) -> dict[str, float]:
    """Transfer GB/s of a >= 500 MB model-shaped dict, as a multiple of single-thread memcpy."""
    shapes, note = model_shapes("smollm2", MIN_MODEL_BYTES)
    sd = random_state_dict(shapes)
    nbytes = nbytes_of(sd)
    print(
        f"\n[2] transport, {nbytes / 1e6:.0f} MB fp32 in {len(sd)} tensors ({note}); receiver = Ray actor, "
        f"no vLLM; warm-up 1, median of {syncs}; times in ms"
    )
    print(
        f"    {'backend':<13} {'total':>7} {'start':>6} {'transfer':>9} {'(own)':>7} {'commit':>7} "
        f"{'GB/s xfer':>9} {'x memcpy':>8} {'GB/s total':>10}"
    )
    ratios, totals = {}, {}
    for backend, threads in VARIANTS:
        m = median(run_syncs(backend, threads, sd, receiver, syncs))
        gbps = nbytes / m["transfer"] / 1e9
        ratios[label(backend, threads)] = gbps / memcpy
        totals[label(backend, threads)] = m["total"]
        print(
            f"    {label(backend, threads):<13} {m['total'] * 1e3:7.1f} {m['start'] * 1e3:6.1f} "
            f"{m['transfer'] * 1e3:9.1f} {m['reported'] * 1e3:7.1f} {m['commit'] * 1e3:7.1f} {gbps:9.2f} "
            f"{gbps / memcpy:8.2f} {nbytes / m['total'] / 1e9:10.2f}"
        )
    pull_vs_push.ratio_lines(totals, "transport only, no engine")
    del sd
    gc.collect()
    return ratios


def phase_overhead(receiver: Any, syncs: int) -> dict[str, float]:
    """Total ms of a sync whose payload is negligible (tiny-llama)."""
    shapes, _ = model_shapes("tiny-llama")
    sd = random_state_dict(shapes)
    print(
        f"\n[3] fixed overhead, tiny-llama {nbytes_of(sd) / 1e6:.2f} MB in {len(sd)} tensors; warm-up 1, "
        f"median of {syncs}; times in ms"
    )
    print(f"    {'backend':<13} {'total':>7} {'start':>6} {'transfer':>9} {'commit':>7}")
    out = {}
    for backend, threads in VARIANTS:
        m = median(run_syncs(backend, threads, sd, receiver, syncs))
        out[label(backend, threads)] = m["total"] * 1e3
        print(
            f"    {label(backend, threads):<13} {m['total'] * 1e3:7.2f} {m['start'] * 1e3:6.2f} "
            f"{m['transfer'] * 1e3:9.2f} {m['commit'] * 1e3:7.2f}"
        )
    return out


def sweep(
    receiver: Any, column: str, cases: list[tuple[str, dict[str, tuple[int, ...]]]], syncs: int
) -> dict[str, list[dict[str, float]]]:
    """Median stages per (variant, case), printed in seconds."""
    print(f"    {'backend':<13} {column:>8} {'total s':>9} {'transfer s':>11} {'s/GB total':>11}")
    out: dict[str, list[dict[str, float]]] = {}
    for backend, threads in VARIANTS:
        for name, shapes in cases:
            sd = random_state_dict(shapes)
            m = median(run_syncs(backend, threads, sd, receiver, syncs))
            m["gb"] = nbytes_of(sd) / 1e9
            out.setdefault(label(backend, threads), []).append(m)
            print(
                f"    {label(backend, threads):<13} {name:>8} {m['total']:9.4f} {m['transfer']:11.4f} "
                f"{m['total'] / m['gb']:11.3f}"
            )
            del sd
        gc.collect()
    return out


def phase_count(receiver: Any, syncs: int) -> dict[str, float]:
    """64 MB cut into more and more tensors: max/min total time per variant."""
    counts = (8, 64, 512, 4096)
    print(f"\n[4] time vs tensor count, 64 MB fp32; warm-up 1, median of {syncs}")
    res = sweep(receiver, "tensors", [(str(c), split_shapes(64 * MB, c)) for c in counts], syncs)
    flat = {}
    for name, rows in res.items():
        flat[name] = max(r["total"] for r in rows) / min(r["total"] for r in rows)
        per_tensor_us = (rows[-1]["total"] - rows[0]["total"]) / (counts[-1] - counts[0]) * 1e6
        print(f"    {name}: max/min total = {flat[name]:.2f}; slope 8 -> 4096 tensors = {per_tensor_us:.1f} us/tensor")
    return flat


def phase_bytes(receiver: Any, syncs: int) -> dict[str, float]:
    """64 .. 512 MB in 100 tensors: seconds per GB, a straight-line fit and its worst relative residual."""
    sizes = (64, 128, 256, 512)
    print(f"\n[5] time vs bytes, 100 fp32 tensors; warm-up 1, median of {syncs}")
    res = sweep(receiver, "MB", [(str(s), split_shapes(s * MB, 100)) for s in sizes], syncs)
    worst = {}
    for name, rows in res.items():
        per_gb = [r["total"] / r["gb"] for r in rows]
        slope, intercept = fit_line([r["gb"] for r in rows], [r["total"] for r in rows])
        worst[name] = max(abs(r["total"] - intercept - slope * r["gb"]) / (intercept + slope * r["gb"]) for r in rows)
        print(
            f"    {name}: least-squares total = {intercept * 1e3:.1f} ms + {slope:.3f} s/GB; worst residual "
            f"{worst[name]:.0%}; s/GB max/min = {max(per_gb) / min(per_gb):.2f}"
        )
    return worst


def fit_line(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least squares ``y = slope * x + intercept``."""
    mx, my = statistics.fmean(x), statistics.fmean(y)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
    return slope, my - slope * mx


COMMITS = ("inplace", "reload")
"""Engine-side commit paths (``weightsync.commit``), one engine each, measured one after the other."""


def trainer_order(sd: dict[str, torch.Tensor], path: Any) -> dict[str, torch.Tensor]:
    """``sd`` in the order a trainer rank sends it: the HF model's ``named_parameters`` (a safetensors file is
    sorted by name, which puts o_proj between k_proj and q_proj). The order decides which fused linears the
    engine can pack straight from the payload (``weightsync.commit.direct_sources``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    order = [n for n, _ in model.named_parameters() if n in sd]
    return {n: sd[n] for n in [*order, *sorted(set(sd) - set(order))]}


def phase_vllm(syncs: int, memcpy: float, dtype: str = "float32") -> None:
    """The real SmolLM2 weights into a real vLLM engine per commit path; each engine takes shm, then broadcast
    (the ``reload`` engine: shm only, the commit is what differs). ``dtype`` is ``model.dtype``: the engine's
    weights and what a trainer sends (with ``bfloat16`` the trainer keeps float32 master weights and sends
    bf16 shards, so the payload is half the bytes).

    The weights sent are the ones the engine loaded, so its prompt logprobs must not move
    (``|dlogp|``: max change on a 40-token probe after all syncs of that row). ``commit x memcpy`` is the
    engine-side commit's time over one single-thread memcpy of the payload (the floor of any path that
    writes every byte once): 1.0 would be a commit that costs one copy.
    """
    from safetensors.torch import load_file

    from relayrl.models import resolve_model

    path = resolve_model("smollm2")
    sd = trainer_order(load_file(str(path / "model.safetensors")), path)
    sd = {name: t.to(getattr(torch, dtype)) for name, t in sd.items()}
    nbytes = nbytes_of(sd)
    copy_s = nbytes / memcpy / 1e9
    print(
        f"\n[6] vLLM end to end: SmolLM2-135M real weights, model.dtype={dtype}, {nbytes / 1e6:.0f} MB in "
        f"{len(sd)} tensors "
        f"(one memcpy: {copy_s * 1e3:.0f} ms); warm-up 1, median of {syncs}; times in s"
    )
    print(
        f"    {'commit':<8} {'backend':<13} {'total':>6} {'start':>6} {'transfer':>8} {'(own)':>6} {'commit':>6} "
        f"{'stall':>6} {'GB/s xfer':>9} {'x memcpy':>8} {'commit x memcpy':>15} {'|dlogp|':>8}"
    )
    rows = {}
    for commit in COMMITS:
        variants = VARIANTS if commit == "inplace" else [("shm", DEFAULT_THREADS)]
        rows[commit] = vllm_rows(path, sd, dtype, commit, variants, syncs, memcpy, copy_s)
    firsts = {commit: next(iter(r.values())) for commit, r in rows.items()}
    print(
        f"    inplace commit is {firsts['reload']['commit'] / firsts['inplace']['commit']:.2f}x faster than "
        f"reload (shm, default threads, same run)"
    )
    floor_report(sd, dtype, firsts["inplace"], copy_s)
    ratios = pull_vs_push.ratio_lines({k: m["total"] for k, m in rows["inplace"].items()}, "a sync into vLLM, inplace")
    pull_vs_push.verdict(ratios, f"SmolLM2 {dtype} into vLLM", line)
    del sd


SYNC_GOAL_S = 0.15
"""Issue 16 part 6: a SmolLM2 sync (shm, the default commit) within this many seconds."""


def floor_report(sd: dict[str, torch.Tensor], dtype: str, inplace_shm: dict[str, float], copy_s: float) -> None:
    """The floor of any sync into vLLM's CPU engine, beside the ``inplace`` shm row: one copy of the payload
    (the bytes must reach the engine) plus one oneDNN pack of every GEMM weight (vLLM's CPU linear reads
    only its packed copy, so each version must be packed once), measured here on the same weights."""

    pack_s = pack_floor_s(sd)
    floor_s = copy_s + pack_s
    print(
        f"    floor: one memcpy {copy_s * 1e3:.0f} ms + oneDNN pack of the GEMM weights {pack_s * 1e3:.0f} ms "
        f"({DEFAULT_THREADS} threads, warm buffer, best of 3) = {floor_s * 1e3:.0f} ms; inplace shm: total "
        f"{inplace_shm['total'] * 1e3:.0f} ms = {inplace_shm['total'] / floor_s:.2f}x floor, commit "
        f"{inplace_shm['commit'] * 1e3:.0f} ms = {inplace_shm['commit'] / pack_s:.2f}x pack"
    )
    line(
        f"SmolLM2 {dtype} sync <= {SYNC_GOAL_S} s (shm, inplace; floor {floor_s:.3f} s)",
        f"{inplace_shm['total']:.3f} s",
        inplace_shm["total"] <= SYNC_GOAL_S,
    )


def vllm_rows(
    path: Any,
    sd: dict[str, torch.Tensor],
    dtype: str,
    commit: str,
    variants: list,
    syncs: int,
    memcpy: float,
    copy_s: float,
) -> dict[str, dict[str, float]]:
    """One engine with ``weightsync.commit=commit``; a row per (backend, threads); returns each row's median
    stage seconds by ``label``, in ``variants``' order."""
    import ray

    from relayrl.config import ModelConfig, RolloutConfig, WeightSyncConfig
    from relayrl.rollout import start_rollout_actor

    actor = start_rollout_actor(
        str(path),
        ModelConfig(path=str(path), dtype=dtype),
        RolloutConfig(kv_cache_gb=0.5),
        seed=0,
        sync_cfg=WeightSyncConfig(commit=commit),
    )
    try:
        ray.get(actor.info.remote())
        probe = list(range(100, 140))
        before = torch.tensor(ray.get(actor.prompt_logprobs.remote(probe)))
        version, rows = 1, {}
        for backend, threads in variants:
            m = median(run_syncs(backend, threads, sd, actor, syncs, version, stamped=False, commit=commit))
            version += syncs + 1
            assert ray.get(actor.weight_version.remote()) == version - 1
            drift = (torch.tensor(ray.get(actor.prompt_logprobs.remote(probe))) - before).abs().max().item()
            gbps = nbytes_of(sd) / m["transfer"] / 1e9
            rows[label(backend, threads)] = m
            print(
                f"    {commit:<8} {label(backend, threads):<13} {m['total']:6.3f} {m['start']:6.3f} "
                f"{m['transfer']:8.3f} {m['reported']:6.3f} {m['commit']:6.3f} {m['stall']:6.3f} {gbps:9.2f} "
                f"{gbps / memcpy:8.2f} {m['commit'] / copy_s:15.2f} {drift:8.1e}"
            )
        return rows
    finally:
        ray.get(actor.shutdown.remote())
        ray.kill(actor)


# ---- report -------------------------------------------------------------------------------------


def verdicts(
    ratios: dict[str, float], overhead_ms: dict[str, float], flat: dict[str, float], spread: dict[str, float]
) -> None:
    """PASS/MISS per target for the default-thread rows (what a trainer runs), then the 1-thread rows."""
    for title, threads in (
        (f"targets (issue 4), sender with {DEFAULT_THREADS} torch threads (default)", DEFAULT_THREADS),
        ("what-if: sender with 1 torch thread", 1),
    ):
        if threads == 1 and DEFAULT_THREADS == 1:
            break
        print(f"\n{title}")
        for b, target in TARGET_RATIO.items():
            k = label(b, threads)
            line(f"{k} transfer >= {target}x memcpy", f"{ratios[k]:.2f}x", ratios[k] >= target)
        for b in BACKENDS:
            k = label(b, threads)
            line(
                f"{k} fixed overhead <= {TARGET_OVERHEAD_MS:g} ms",
                f"{overhead_ms[k]:.1f} ms",
                overhead_ms[k] <= TARGET_OVERHEAD_MS,
            )
        for b in BACKENDS:
            k = label(b, threads)
            line(f"{k} flat in tensor count (max/min <= {FLAT_MAX})", f"{flat[k]:.2f}", flat[k] <= FLAT_MAX)
        for b in BACKENDS:
            k = label(b, threads)
            line(f"{k} linear in bytes (residual <= {LINEAR_MAX:.0%})", f"{spread[k]:.0%}", spread[k] <= LINEAR_MAX)


def line(what: str, got: str, ok: bool) -> None:
    print(f"    {'PASS' if ok else 'MISS'}  {what:<52} {got}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the vLLM phase")
    parser.add_argument("--vllm-only", action="store_true", help="only the memcpy baseline and the vLLM phase")
    parser.add_argument("--syncs", type=int, default=5, help="timed syncs per large case (after 1 warm-up)")
    parser.add_argument("--tiny-syncs", type=int, default=10, help="timed syncs for the tiny model")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="model.dtype of the vLLM phase's engine and payload",
    )
    args = parser.parse_args()
    import ray

    if not Path("/dev/shm").is_dir():
        raise SystemExit("/dev/shm is missing; the shm backend needs a tmpfs directory")
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
    )
    try:
        run(args)
    finally:
        ray.shutdown()


def run(args: argparse.Namespace) -> None:
    import ray

    t0 = time.perf_counter()
    shapes, _ = model_shapes("smollm2", MIN_MODEL_BYTES)
    nbytes = sum(torch.Size(s).numel() for s in shapes.values()) * 4
    memcpy, tcopy = memcpy_gbps(nbytes), torch_copy_gbps(nbytes)
    print(
        f"weight-sync bench: torch {torch.__version__}, {DEFAULT_THREADS} torch threads by default; "
        f"{load_note()} (a shared box: other work skews times)"
    )
    print(
        f"\n[1] baseline, {nbytes / 1e6:.0f} MB: single-thread libc memcpy {memcpy:.2f} GB/s (best of 3); "
        f"torch copy_ ({DEFAULT_THREADS} threads) {tcopy:.2f} GB/s"
    )
    pull_vs_push.hash_line(nbytes, memcpy)
    if args.vllm_only:
        phase_vllm(args.syncs, memcpy, args.dtype)
        return
    receiver = ray.remote(ReceiverHost).options(num_cpus=0.5).remote()
    try:
        ratios = phase_transport(receiver, args.syncs, memcpy)
        overhead = phase_overhead(receiver, args.tiny_syncs)
        flat = phase_count(receiver, args.syncs)
        spread = phase_bytes(receiver, args.syncs)
        print(f"\n    receiver verified {ray.get(receiver.count.remote())} payloads (stamped elements + digest)")
    finally:
        ray.get(receiver.close.remote())
        ray.kill(receiver)
    if not args.quick:
        phase_vllm(args.syncs, memcpy, args.dtype)
    verdicts(ratios, overhead, flat, spread)
    print(f"\n{time.perf_counter() - t0:.0f} s; {load_note()} at the end")


if __name__ == "__main__":
    main()
