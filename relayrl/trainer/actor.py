"""One trainer rank: an HF causal LM sharded with FSDP2 over a torch.distributed group.

``TrainerGroup`` (ranks.py) starts ``world_size`` of these as Ray actors; every public method is a
collective (FSDP2 all-gathers parameters in each forward), so the group calls it on all ranks at once.
With ``trainer.tp_size > 1`` the ranks form a ("dp", "tp") mesh (``tp.py``): rows are split over dp,
the ranks of a tp group hold the same rows and one model's layer shards, and every all-reduce of sums
below runs over dp only. With ``trainer.cp_size > 1`` the mesh is ("dp", "cp") the same way: the ranks of
a cp group hold the same rows and each runs its slice of every packed row (``context.py``). With
``trainer.pp_size > 1`` the ranks of a pipeline hold the same rows and each its own pipeline stages of a policy
(their decoder layers FSDP2-sharded over the stage's dp replicas; with tp_size > 1, on a ("dp", "pp", "tp") mesh,
split over tp instead), and
``PipelinedPolicy.epochs`` (``pp_step.py``) runs the epochs below in their place.

A train step, on every rank (``train_step``; right: where each part is done):

    ray.get(group refs) -> zero-spread groups out (drop_zero_spread, or DAPO's dynamic sampling)
                           none left: no update                                Objective.select_groups (objective.py)
    build_train_batch (whole step, identical on all ranks; DAPO's overlong penalty) -> dp_share over dp:
                   equal row counts (padded), or whole packing units balanced by tokens (packed; balance.py)
    micro-batches: padded rows, or packed rows of <= max_tokens_per_micro_batch real tokens (``batch.py``;
                   shared_prefix: each group's prompt once), as many on every dp rank; a packed row attends
                   per span (``attention.py``), the head scores in chunks (``head.py``), layers may be
                   checkpointed (``recompute.py``, decided at setup)
    D_step = all_reduce(sum of LOSS_AGG denominators)        from masks only, before any backward
    ref logprobs if kl_coef > 0                               once, before any update
    PPO (algorithm.name=gae): V_old = critic(batch); r_t = R at the last token - kl_coef * KL_t
                              A, R_t = GAE(r, V_old); A whitened over the step    Critic.advantages (critic.py)
    micro-batches whose advantages are all 0 (no KL/entropy term): skipped on every rank    learnable (step.py)
    for epoch in 1..E:  for micro-batch:                       PolicyStep.epochs -> train_micro (step.py)
                            per_token = POLICY_LOSSES[policy_loss] [+ kl_coef * KL_ESTIMATORS[kl_estimator]]
                                        [- entropy_coef * H]          (PPO: KL is in the reward instead)
                            (LOSS_AGG[loss_agg] numerator of per_token / D_step).backward()  -> StepStats
                        clip_grad_norm_ ; AdamW step
    PPO: the same epochs of (clipped value loss summed over tokens / step tokens).backward(), the
         critic's clip and AdamW step (disjoint parameters: as if interleaved)       Critic.train (critic.py)
    stats: StepStats (ValueStats) summed, one all-reduce, / epochs / tokens            TokenSums (step.py)
           token imbalance over dp, peak memory over all ranks: one all-reduce (max)      _load_stats

The model stays in eval mode: dropout off, so the old logprobs and the first epoch's agree exactly
(ratio = 1) and the clip only acts on later epochs or on off-policy data.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist

from relayrl.algorithms.advantages import CRITIC_ESTIMATORS
from relayrl.algorithms.objective import build_loss
from relayrl.config import AlgorithmConfig, CriticConfig, ModelConfig, TrainerConfig
from relayrl.logs import show_on_console
from relayrl.monitor.schema import MEMORY_TRAINER_PEAK_GB, TRAINER_TOKEN_IMBALANCE
from relayrl.rendezvous import client_store, master_store
from relayrl.trainer import checkpoint, context, lora, recompute
from relayrl.trainer.background import in_background
from relayrl.trainer.balance import token_imbalance
from relayrl.trainer.batch import MicroBatch, build_train_batch, dp_share, fetch_groups, forward_tokens, micro_batches
from relayrl.trainer.critic import Critic, GaeTargets
from relayrl.trainer.hf import load_sharded, pad_token_id
from relayrl.trainer.optim import policy_adamw
from relayrl.trainer.pp_step import PipelinedPolicy
from relayrl.trainer.pp_weights import load_stages
from relayrl.trainer.step import PolicyStep, learnable, step_totals
from relayrl.trainer.tp import build_mesh
from relayrl.trainer.weights_out import WeightsOut
from relayrl.types import TrainBatch
from relayrl.vllm_import import import_vllm

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from relayrl.weightsync.sync import TrainerSync  # imports vLLM: loaded in setup, while the engines start

logger = logging.getLogger(__name__)


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``nccl`` when CUDA is visible, else ``gloo``; explicit names (``TrainerConfig`` checked
    them) pass through."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return backend


def peak_memory_gb(device: torch.device) -> float:
    """This process's peak memory in GB (1e9 bytes) since it started (never reset): on CUDA the most the
    caching allocator held in tensors on ``device`` (``max_memory_allocated``), else the peak resident set
    (``ru_maxrss``: kilobytes on Linux, bytes on macOS), which counts everything the process ever held."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss * (1 if sys.platform == "darwin" else 1024) / 1e9


class TrainerActor(WeightsOut):
    """One FSDP2 rank. Wrapped with ``ray.remote`` by ``TrainerGroup``; usable in-process for debugging. Its
    offload, weight sync, probe, HF export and checkpoint methods are ``WeightsOut``'s (``weights_out.py``)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        model_path: str,
        model_cfg: ModelConfig,
        trainer_cfg: TrainerConfig,
        algo_cfg: AlgorithmConfig,
        temperature: float,
        seed: int,
        timeout_s: float = 600.0,
        critic_cfg: CriticConfig | None = None,
    ):
        show_on_console()  # this rank's INFO lines to its stdout, which Ray streams to the driver
        self.rank, self.world_size = rank, world_size
        self.critic_cfg = critic_cfg or CriticConfig()
        self.critic: Critic | None = None  # made in setup for gae
        self.context: context.Group | None = None  # trainer.cp_size > 1: this rank's cp group (setup)
        self.pipelined: PipelinedPolicy | None = None  # trainer.pp_size > 1: this rank's stages (setup)
        self.master = (master_addr, master_port)  # port 0: rank 0 binds one the OS picks (``listen``)
        self._master_store: dist.TCPStore | None = None
        self.model_path, self.model_cfg, self.cfg, self.algo = model_path, model_cfg, trainer_cfg, algo_cfg
        self.temperature, self.seed, self.timeout = temperature, seed, timedelta(seconds=timeout_s)
        self._sync: TrainerSync | None = None  # set by connect_rollouts
        self._saver = checkpoint.Saver()  # this rank's async checkpoint writes (one in flight)
        self.objective = build_loss(algo_cfg)

    @property
    def policy_step(self) -> PolicyStep:
        """The policy's micro-batch step under the current objective, temperature and ``trainer.dtype``."""
        return PolicyStep(self.objective, self.temperature, self.cfg.dtype, self.cfg.logits_chunk, self.context)

    # ---------------------------------------------------------------- setup
    def listen(self) -> int:
        """Rank 0: serve the group's store on the master address only (not every interface); returns its
        port, which the other ranks' ``setup`` takes."""
        if self._master_store is None:
            self._master_store = master_store(*self.master, self.world_size, self.timeout)
            self.master = (self.master[0], self._master_store.port)
        return self.master[1]

    def _store(self) -> dist.TCPStore:
        if self.rank == 0:
            self.listen()
            assert self._master_store is not None  # listen made it
            return self._master_store
        return client_store(*self.master, self.world_size, self.timeout)

    def setup(self, master_port: int | None = None) -> None:
        """Join the process group (at rank 0's ``master_port`` when given), load and shard the policy (and the
        frozen reference if KL is on, the critic for PPO); in the background of the engines' start
        (``trainer.setup_nice``)."""
        if master_port is not None:
            self.master = (self.master[0], master_port)
        with in_background(self.cfg.setup_nice):
            self._setup()

    def _setup(self) -> None:
        ppo = self.algo.name in CRITIC_ESTIMATORS  # with trainer.tp_size=1: config.validate refuses TP
        backend = resolve_backend(self.cfg.backend)
        if backend == "nccl":
            torch.cuda.set_device(self.rank % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
            torch.set_num_threads(self.cfg.num_threads or os.cpu_count() or 1)
        dist.init_process_group(
            backend, store=self._store(), rank=self.rank, world_size=self.world_size, timeout=self.timeout
        )
        self.mesh = build_mesh(self.device.type, self.world_size, self.cfg.tp_size, self.cfg.cp_size, self.cfg.pp_size)
        self.dp_group, self.dp_rank, self.dp_size = (
            self.mesh.get_group("dp"),
            self.mesh["dp"].get_local_rank(),
            self.mesh["dp"].size(),
        )
        if self.cfg.cp_size > 1:
            self.context = context.Group(self.mesh.get_group("cp"), self.mesh["cp"].get_local_rank(), self.cfg.cp_size)
        torch.manual_seed(self.seed)
        every = self._checkpoint_every()
        load = functools.partial(load_sharded, self.model_path, self.device, self.mesh, self.model_cfg.dtype)
        tp_mesh = self.mesh["tp"] if self.cfg.tp_size > 1 else None
        if self.cfg.pp_size > 1:  # config.validate refused what pipeline stages do not train yet
            stages = (self.mesh["pp"].get_local_rank(), self.cfg.pp_size, self.cfg.pp_virtual_stages)
            self.model = load_stages(self.model_path, self.device, *stages, every, tp_mesh, self.mesh["dp"])
        else:
            self.model = load(trainable=True, lora_cfg=self.cfg.lora, checkpoint_every=every)
        self.uses_lora = lora.is_peft(self.model)  # the reference is then the base: adapters off, no copy
        self.ref_model = None
        if self.algo.kl_coef > 0 and not self.uses_lora:
            if self.cfg.pp_size > 1:
                ref = load_stages(self.model_path, self.device, *stages, 0, tp_mesh, self.mesh["dp"])
                self.ref_model = ref.requires_grad_(False)
            else:
                self.ref_model = load(trainable=False)
        self.optimizer = policy_adamw(self.model, self.device, self.cfg)
        if self.uses_lora and self.rank == 0:
            logger.info(lora.summary_line(self.model, self.cfg.lora))
        self.pad_token_id = pad_token_id(cast("PretrainedConfig", self.model.config))  # an HF model's config
        self.pipelined = (
            PipelinedPolicy(
                self.model,
                self.cfg,
                self.objective,
                self.temperature,
                self.pad_token_id,
                self.ref_model,
                self.mesh.get_group("pp"),
                self.dp_group,
                kl_in_reward=ppo,
            )
            if self.cfg.pp_size > 1
            else None
        )
        self.trained: checkpoint.Parts = {"policy": (self.model, self.optimizer)}  # name -> (module, optimizer)
        if ppo:
            self.critic = Critic(  # under pp_size > 1 a whole critic on each rank (its "dp" is this rank alone)
                self.model_path,
                self.mesh["dp"] if self.cfg.pp_size > 1 else self.mesh,
                self.device,
                self.model_cfg.dtype,
                self.critic_cfg,
                self.dp_size,
                self.algo,
                self._all_reduce,
                fused_adamw=self.cfg.fused_adamw,
                checkpoint_every=every,
            )
            self.trained["critic"] = (self.critic.model, self.critic.optimizer)
        # connect_rollouts' modules import vLLM, seconds of CPU: now, while the engines start, rather than
        # after they are up, when the first step waits for the connection; without Inductor's compiler.
        import_vllm()
        import relayrl.weightsync.sync  # noqa: F401

    def _checkpoint_every(self) -> int:
        """``trainer.activation_checkpointing`` as a layer stride (``recompute.resolve_every``): ``auto`` sizes
        the longest micro-batch, max(max_tokens_per_micro_batch, model.max_model_len) tokens, against this
        rank's share of the host's memory (the GPU's on CUDA)."""
        model_config = json.loads((Path(self.model_path) / "config.json").read_text())
        tokens = recompute.micro_batch_tokens(self.cfg, self.model_cfg)
        memory = recompute.rank_memory_bytes(self.device, self.world_size)
        every = recompute.resolve_every(self.cfg.activation_checkpointing, model_config, tokens, memory)
        if self.rank == 0:
            logger.info(
                "relayrl: activation checkpointing %s (trainer.activation_checkpointing=%s, ~%.1f GB of "
                "activations at %d tokens without it)",
                {0: "off", 1: "on every layer"}.get(every, f"on every {every}-th layer"),
                self.cfg.activation_checkpointing,
                recompute.activation_bytes(model_config, tokens) / 1e9,
                tokens,
            )
        return every

    # ---------------------------------------------------------------- train
    def train_step(self, group_refs: list) -> dict[str, float]:
        """One optimizer step per epoch on this step's groups; returns stats identical on every rank.

        ``group_refs``: Ray ObjectRefs of ``list[TrajectoryGroup]`` (one per rollout replica), fetched here
        so trajectory data never passes through the driver. Plain lists are accepted too.
        Stats are ``StepStats``' fields (``step.py``: token-weighted means over all ranks and epochs; ``loss``:
        numerators over ``loss_denominator``, the step's global ``LOSS_AGG`` denominator), DAPO's, and with a
        critic its ``GaeTargets`` stats and ``ValueStats`` (``critic.py``).
        """
        t0 = time.perf_counter()
        groups, shaping_stats = self.objective.select_groups(fetch_groups(group_refs))
        if not groups:  # no group with anything to learn from (select_groups): no update, the same on every rank
            return {**shaping_stats, "tokens": 0.0, "sequences": 0.0, "step_seconds": time.perf_counter() - t0}
        batch = build_train_batch(
            groups, self.pad_token_id, self.algo.name, self.objective.reward_shaping, self.algo.whiten
        )
        share = self._share(batch)
        micro = self._micro_batches(share)  # same rows within a tp group
        n_tokens, denom = step_totals(micro, self.objective, self._all_reduce)
        t1 = time.perf_counter()
        old, ref, targets = self._before_update(share, micro, n_tokens)
        live = learnable(micro, self.objective, self._all_reduce) if self.critic is None else [True] * len(micro)
        counts = {
            "tokens": float(n_tokens),
            "sequences": float(len(batch)),
            "skipped_micro_batches": float(live.count(False)),
        }
        if not any(live):  # every advantage 0 and no other term: no gradient, so no AdamW step (it would still
            # move the weights). ``_load_stats`` is a collective: ``live`` is the same on every rank.
            return {**shaping_stats, **counts, **self._load_stats(micro), "step_seconds": time.perf_counter() - t0}
        # the pipeline runs every row (a skipped micro-batch adds 0 to the loss; its stats count here)
        trained_tokens = n_tokens if all(live) or self.pipelined else self._trained_tokens(micro, live)
        t2 = time.perf_counter()
        if self.pipelined is not None:  # trainer.pp_size > 1: the stages run the epochs (pp_step.py)
            rows = share if self.critic is None else self.pipelined.with_advantages(share, micro)
            sums, grad_norms = self.pipelined.epochs(rows, micro, self.optimizer, denom)
        else:
            sums, grad_norms = self.policy_step.epochs(
                self.model,
                self.optimizer,
                micro,
                old,
                ref,
                denom,
                self.dp_size,
                self.cfg.epochs,
                self.cfg.grad_clip,
                live,
            )
        out = {**sums.reduce(self._all_reduce, self.cfg.epochs, trained_tokens, denom), **shaping_stats, **counts}
        if targets is not None and self.critic is not None:  # PPO: the critic learns too; its KL is the step's
            out |= targets.stats | self.critic.train(micro, targets, n_tokens, self.cfg.epochs)
        t3 = time.perf_counter()
        out |= self._load_stats(micro)
        finite = [g for g in grad_norms if math.isfinite(g)]
        out.update(nonfinite_skips=float(len(grad_norms) - len(finite)))
        out.update(
            grad_norm=sum(finite) / len(finite) if finite else float("nan"),
            loss_denominator=float(denom),
            fetch_seconds=t1 - t0,
            logprob_seconds=t2 - t1,
            train_seconds=t3 - t2,
            step_seconds=time.perf_counter() - t0,
        )
        return out

    def _before_update(
        self, share: TrainBatch, micro: list[MicroBatch], n_tokens: torch.Tensor
    ) -> tuple[list[torch.Tensor | None], list[torch.Tensor] | None, GaeTargets | None]:
        """(old logprobs, reference logprobs for the loss, PPO's GAE targets): what the epochs need from
        before any update.

        Old logprobs are left to the first epoch's own forward pass (detached): parameters only change at
        the end of an epoch, so within epoch 0 the policy *is* pi_old; this saves a full forward. PPO puts
        the KL into the reward, so the reference logprobs go to ``Critic.advantages`` (which writes each
        ``mb.advantages``) with pi_old from one extra forward, and none to the loss. Pipelined, the stages score
        both (``PipelinedPolicy.scores``; GRPO's reference in the loss itself).
        """
        step = self.policy_step
        old: list[torch.Tensor | None] = [None] * len(micro)
        kl = self.algo.kl_coef > 0
        if self.critic is None or not kl:  # GRPO: the reference for the loss (pipelined: its stages score it)
            ref = step.reference_logprobs(self.model, self.ref_model, micro) if kl and self.pipelined is None else None
            return old, ref, None if self.critic is None else self.critic.advantages(micro, n_tokens)
        if self.pipelined is not None:
            pi_old, ref = self.pipelined.scores(share, micro)
        else:
            ref = step.reference_logprobs(self.model, self.ref_model, micro)
            pi_old = [step.logprobs(self.model, mb) for mb in micro]
        return [*pi_old], None, self.critic.advantages(micro, n_tokens, pi_old, ref)

    def _trained_tokens(self, micro: list[MicroBatch], live: list[bool]) -> torch.Tensor:
        """Completion tokens of the micro-batches that run, on all dp ranks: what per-token stats average over."""
        return self._all_reduce(torch.stack([mb.loss_mask.sum() * on for mb, on in zip(micro, live)]).sum())

    def _share(self, batch: TrainBatch) -> TrainBatch:
        """This dp rank's rows of the step (``dp_share``: by tokens when packing, else equal row counts)."""
        c = self.cfg
        return dp_share(batch, self.dp_rank, self.dp_size, c.max_tokens_per_micro_batch, c.shared_prefix)

    def _load_stats(self, micro: list[MicroBatch]) -> dict[str, float]:
        """``trainer/token_imbalance`` and ``memory/trainer_peak_gb``, the same on every rank; one all-reduce (max)
        over all ranks of [dp_size + 1] values: slot dp_rank holds this rank's forward tokens (``forward_tokens``
        summed over its micro-batches, fillers included: the packed tokens, which is what costs time, not the
        real tokens; the ranks of a tp group hold the same), the last slot its peak memory."""
        local = torch.zeros(self.dp_size + 1, dtype=torch.float64)
        local[self.dp_rank] = float(sum(forward_tokens(mb) for mb in micro))
        local[-1] = peak_memory_gb(self.device)
        both = local.to(self.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        tokens, peak = both.cpu().tolist()[:-1], float(both[-1])
        return {TRAINER_TOKEN_IMBALANCE: token_imbalance(tokens), MEMORY_TRAINER_PEAK_GB: peak}

    def _micro_batches(self, share: TrainBatch) -> list[MicroBatch]:
        c = self.cfg
        budget, size = c.max_tokens_per_micro_batch, c.micro_batch_size  # packed: a multiple of pp_size of them
        return micro_batches(share, size, budget, c.shared_prefix, self.device, self._all_reduce, c.pp_size)

    def _all_reduce(
        self, value: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Reduce over the dp ranks only: the ranks of a tp group hold the same rows, so summing over all
        ranks would count every token tp_size times."""
        value = value.detach().to(self.device, dtype).clone()
        dist.all_reduce(value, op=op, group=self.dp_group)
        return value

    def close(self) -> None:
        """Leave the process group (lets the actor be killed without a hung collective)."""
        if self._sync is not None:
            self._sync.close()
        if dist.is_initialized():
            dist.destroy_process_group()
