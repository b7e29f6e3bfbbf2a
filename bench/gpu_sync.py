"""Colocated weight sync on one GPU (``weightsync.backend=vllm-native``, ``native_engine=ipc``): the shipped
model from a trainer rank into a vLLM engine on the same GPU, against the HBM copy floor (one device-to-device
copy of the same bytes). Needs CUDA; ``make gpu-check`` runs it.

    python -m bench.gpu_sync [--syncs 5]
"""

from __future__ import annotations

import argparse
import time

import ray
import torch

from relayrl.config import load_config
from relayrl.models import resolve_model
from relayrl.rollout import start_rollout_actor
from relayrl.trainer.ranks import TrainerGroup


def hbm_copy_s(nbytes: int, n: int = 5) -> float:
    """The floor: the best of ``n`` device-to-device copies of ``nbytes`` (read once, write once)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(n + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--syncs", type=int, default=5, help="timed syncs after one warm-up")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.gpu_sync: needs CUDA (this box has none)")
    path = str(resolve_model("smollm2"))
    overrides = [f"model.path={path}", "model.dtype=bfloat16", "trainer.backend=nccl"]
    overrides += ["weightsync.backend=vllm-native", "weightsync.native_engine=ipc"]
    cfg = load_config("grpo_arith", overrides)
    ray.init(num_gpus=1)
    rollout = start_rollout_actor(path, cfg.model, cfg.rollout, 0, sync_cfg=cfg.weightsync, num_gpus=0.5)
    trainer = TrainerGroup(1, path, cfg.model, cfg.trainer, cfg.algorithm, actor_options={"num_gpus": 0.5})
    try:
        trainer.connect_rollouts(cfg.weightsync, [rollout])
        trainer.sync_weights(1)
        seconds, nbytes = [], 0
        for version in range(2, 2 + args.syncs):
            t0 = time.perf_counter()
            stats = trainer.sync_weights(version)
            seconds.append(time.perf_counter() - t0)
            nbytes = int(stats["weightsync/bytes"])
        assert ray.get(rollout.weight_version.remote()) == 1 + args.syncs
        floor = hbm_copy_s(nbytes)
        best = min(seconds)
        print("| model | bytes | sync best | sync median | HBM copy floor | sync / floor |")
        print("| --- | --- | --- | --- | --- | --- |")
        median = sorted(seconds)[len(seconds) // 2]
        print(
            f"| SmolLM2-135M bf16 | {nbytes / 1e6:.0f} MB | {best * 1e3:.1f} ms | {median * 1e3:.1f} ms "
            f"| {floor * 1e3:.2f} ms | {best / floor:.1f}x |"
        )
    finally:
        trainer.shutdown()
        ray.kill(rollout)
        ray.shutdown()


if __name__ == "__main__":
    main()
