"""One trainer rank: an HF causal LM sharded with FSDP2 over a torch.distributed group.

``TrainerGroup`` (group.py) starts ``world_size`` of these as Ray actors; every public method is a
collective (FSDP2 all-gathers parameters in each forward), so the group calls it on all ranks at once.
With ``trainer.tp_size > 1`` the ranks form a ("dp", "tp") mesh (``tp.py``): rows are split over dp,
the ranks of a tp group hold the same rows and one model's layer shards, and every all-reduce of sums
below runs over dp only.

A train step, on every rank:

    ray.get(group refs)  ->  build_train_batch (whole step, identical on all ranks)  ->  split_batch over dp
    micro-batches: padded rows, or packed rows of <= max_tokens_per_micro_batch real tokens (``packing.py``;
                   shared_prefix: each group's prompt once), as many on every dp rank
    D_step = all_reduce(sum of LOSS_AGG denominators)               from masks only, before any backward
    ref logprobs if kl_coef > 0                                      once, before any update
    PPO (algorithm.name=gae): V_old = critic(batch); r_t = R at the last token - kl_coef * KL_t
                              A, R_t = GAE(r, V_old); A whitened over the whole step (all ranks)
    for epoch in 1..E:  for micro-batch:
                            per_token = POLICY_LOSSES[policy_loss] [+ kl_coef * KL_ESTIMATORS[kl_estimator]]
                                        [- entropy_coef * H]          (PPO: KL is in the reward instead)
                            (LOSS_AGG[loss_agg] numerator of per_token / D_step).backward()
                            PPO: (clipped value loss summed over tokens / step tokens).backward()
                        clip_grad_norm_ ; AdamW step  (and the critic's)

Before any of it, DAPO's shaping (``shaping.py``): groups whose rewards don't vary are dropped
(``algorithm.dynamic_sampling``) and overlong completions lose reward (``algorithm.overlong_buffer``).

Every ``LOSS_AGG`` mode is a ratio of sums (tokens, or sequences, or sequences x L), so with the
denominator summed over the whole step on all ranks the gradient is that of the step's loss however
the step is split into ranks and micro-batches (a sequence is never split, so per-sequence means stay
local).
The model stays in eval mode: dropout off, so the old logprobs and the first epoch's agree exactly
(ratio = 1) and the clip only acts on later epochs or on off-policy data.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from relayrl.config import AlgorithmConfig, CriticConfig, ModelConfig, TrainerConfig, WeightSyncConfig
from relayrl.rendezvous import client_store, master_store
from relayrl.trainer import checkpoint
from relayrl.trainer.advantages import (CRITIC_ESTIMATORS, masked_moments, moments_mean_var, outcome_gae,
                                        whiten_from_moments)
from relayrl.trainer.batch import (MicroBatch, build_train_batch, empty_micro_batch, packed_micro_batch,
                                   packing_plan, row_micro_batches, split_batch, to_device, trainable_groups)
from relayrl.trainer.fsdp import clip_and_step, shard_model
from relayrl.trainer.logprobs import logits_entropy, target_logprobs, token_logprobs
from relayrl.trainer.packing import attention_mask_4d, place, split_to_count
from relayrl.trainer.precision import autocast, keep_head_fp32
from relayrl.trainer.losses import (KL_ESTIMATORS, LOSS_AGG, POLICY_LOSSES, entropy_bonus, kl_k3, kl_loss,
                                    masked_token_sum)
from relayrl.trainer.shaping import dynamic_sampling_filter, overlong_penalty
from relayrl.trainer.tp import build_mesh, parallelize
from relayrl.types import TrainBatch, TrajectoryGroup

# Sums all-reduced at the end of a step, in this order (ratio_max is reduced with MAX): "loss" is the
# LOSS_AGG numerator (divided by the step's denominator), the rest are token-weighted (divided by tokens).
_SUM_STATS = ("loss", "clip_frac", "approx_kl", "ratio_mean", "kl", "entropy", "behaviour_kl", "is_weight",
              "is_trunc_frac")
_CRITIC_SUM_STATS = ("value_loss", "value_clip_frac")     # the critic's token sums (PPO), reduced likewise


def policy_loss_kwargs(algo: AlgorithmConfig) -> dict[str, float]:
    """The hyper-parameters ``POLICY_LOSSES[algo.policy_loss]`` takes; clip_eps_high None = symmetric."""
    if algo.policy_loss == "ppo_clip":
        return {"clip_eps": algo.clip_eps}
    high = algo.clip_eps if algo.clip_eps_high is None else algo.clip_eps_high
    kw = {"clip_eps": algo.clip_eps, "clip_eps_high": high}
    if algo.policy_loss == "dual_clip":
        kw["dual_clip_c"] = algo.dual_clip_c
    return kw


def off_policy_kwargs(algo: AlgorithmConfig) -> dict[str, float | str] | None:
    """How the policy loss weighs tokens by ``w = pi_old / mu`` (None: not at all). ``auto`` is resolved by
    ``load_config``; left unresolved it means none. ``decoupled``: AReaL's objective, w untruncated."""
    return {"tis": {"is_level": "token", "is_cap": algo.is_cap},
            "tis_sequence": {"is_level": "sequence", "is_cap": algo.is_cap},
            "decoupled": {"is_level": "token", "is_cap": math.inf}}.get(algo.off_policy)


def loss_agg_kwargs(algo: AlgorithmConfig) -> dict[str, int]:
    """The keywords ``LOSS_AGG[algo.loss_agg]`` takes: only seq-mean-token-sum-norm needs ``max_len``."""
    if algo.loss_agg != "seq-mean-token-sum-norm":
        return {}
    if algo.norm_len is None:
        raise ValueError("algorithm.loss_agg=seq-mean-token-sum-norm needs algorithm.norm_len; set it to "
                         "rollout.max_tokens (load_config does this by default)")
    return {"max_len": algo.norm_len}


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``nccl`` when CUDA is visible, else ``gloo``; explicit names pass through."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"trainer.backend={backend!r} is not supported; use auto, gloo or nccl")
    return backend


class TrainerActor:
    """One FSDP2 rank. Wrapped with ``ray.remote`` by ``TrainerGroup``; usable in-process for debugging."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, model_path: str,
                 model_cfg: ModelConfig, trainer_cfg: TrainerConfig, algo_cfg: AlgorithmConfig,
                 temperature: float, seed: int, timeout_s: float = 600.0, critic_cfg: CriticConfig | None = None):
        self.rank, self.world_size = rank, world_size
        self.critic_cfg, self.critic = critic_cfg or CriticConfig(), None   # Critic, made in setup for gae
        self.master = (master_addr, master_port)
        self.model_path, self.model_cfg, self.cfg, self.algo = model_path, model_cfg, trainer_cfg, algo_cfg
        self.temperature, self.seed, self.timeout = temperature, seed, timedelta(seconds=timeout_s)
        self._sync = None  # TrainerSync, set by connect_rollouts
        self._saver = checkpoint.Saver()  # this rank's async checkpoint writes (one in flight)
        self.policy_loss = POLICY_LOSSES[algo_cfg.policy_loss]
        self.policy_kw, self.agg_kw = policy_loss_kwargs(algo_cfg), loss_agg_kwargs(algo_cfg)
        self.off_policy_kw = off_policy_kwargs(algo_cfg)
        self.aggregate = LOSS_AGG[algo_cfg.loss_agg]
        self.reward_shaping = None
        if algo_cfg.overlong_buffer:
            max_len = algo_cfg.overlong_max_len
            if max_len is None:
                raise ValueError("algorithm.overlong_buffer is set but algorithm.overlong_max_len is None; set it "
                                 "to rollout.max_tokens (load_config does this by default)")
            self.reward_shaping = functools.partial(overlong_penalty, max_len=max_len,
                                                    buffer_len=algo_cfg.overlong_buffer,
                                                    factor=algo_cfg.overlong_penalty)

    # ---------------------------------------------------------------- setup
    def _store(self) -> dist.TCPStore:
        """Rank 0 serves the group's store on the master address only (not every interface)."""
        make = master_store if self.rank == 0 else client_store
        return make(*self.master, self.world_size, self.timeout)

    def setup(self) -> None:
        """Join the process group, load and shard the policy (and the frozen reference if KL is on, the critic
        for PPO)."""
        backend = resolve_backend(self.cfg.backend)
        if backend == "nccl":
            torch.cuda.set_device(self.rank % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
            torch.set_num_threads(self.cfg.num_threads or os.cpu_count() or 1)
        dist.init_process_group(backend, store=self._store(), rank=self.rank, world_size=self.world_size,
                                timeout=self.timeout)
        self.mesh = build_mesh(self.device.type, self.world_size, self.cfg.tp_size)
        self.dp_mesh, self.dp_group = self.mesh["dp"], self.mesh.get_group("dp")
        self.dp_rank, self.dp_size = self.dp_mesh.get_local_rank(), self.dp_mesh.size()
        torch.manual_seed(self.seed)
        self.model = self._load_sharded(trainable=True)
        self.ref_model = self._load_sharded(trainable=False) if self.algo.kl_coef > 0 else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.lr, betas=tuple(self.cfg.betas),
                                           weight_decay=self.cfg.weight_decay)
        self.pad_token_id = self._pad_token_id()
        if self.algo.name in CRITIC_ESTIMATORS:
            from relayrl.trainer.critic import Critic

            if self.cfg.tp_size > 1:
                raise ValueError("PPO's critic is trained with FSDP only; set trainer.tp_size=1")
            self.critic = Critic(self.model_path, self.mesh, self.device, self.model_cfg.dtype, self.critic_cfg,
                                 self.world_size)

    def _load_sharded(self, trainable: bool) -> torch.nn.Module:
        """The HF causal LM with float32 master weights: decoder linears split over "tp" (``tp.parallelize``,
        tp_size > 1), then sharded per decoder layer over "dp" (``fsdp.shard_model``)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).to(self.device)
        keep_head_fp32(model.get_output_embeddings())        # trainer.dtype=bf16: logits stay float32
        if self.cfg.tp_size > 1:
            parallelize(model, self.mesh["tp"])
        return shard_model(model, self.dp_mesh, self.model_cfg.dtype, trainable)

    def _pad_token_id(self) -> int:
        config = self.model.config
        for tid in (config.pad_token_id, config.eos_token_id, 0):
            if tid is not None:
                return tid[0] if isinstance(tid, list) else int(tid)
        return 0

    # ---------------------------------------------------------------- train
    def train_step(self, group_refs: list) -> dict[str, float]:
        """One optimizer step per epoch on this step's groups; returns stats identical on every rank.

        ``group_refs``: Ray ObjectRefs of ``list[TrajectoryGroup]`` (one per rollout replica), fetched here
        so trajectory data never passes through the driver. Plain lists are accepted too.
        Stats are token-weighted means over all ranks and epochs (``loss``: numerators over
        ``loss_denominator``, the step's global ``LOSS_AGG`` denominator); ``behaviour_kl`` is the k3 estimate of
        KL(engine || trainer) before the update: ~0 on-policy, large if weight sync or sampling settings differ.
        """
        t0 = time.perf_counter()
        groups, shaping_stats = self._select_groups(self._fetch(group_refs))
        if not groups:       # dynamic sampling left nothing to learn from: no update (same on every rank)
            return {**shaping_stats, "tokens": 0.0, "sequences": 0.0, "step_seconds": time.perf_counter() - t0}
        batch = build_train_batch(groups, self.pad_token_id, self.algo.name, self.reward_shaping,
                                  self.algo.whiten)
        micro = self._micro_batches(split_batch(batch, self.dp_rank, self.dp_size))   # same rows within a tp group
        n_tokens, denom = self._step_totals(micro)
        t1 = time.perf_counter()
        # Old logprobs come from the first epoch's own forward pass (detached): parameters only change
        # at the end of an epoch, so within epoch 0 the policy *is* pi_old. This saves a full forward.
        old: list[torch.Tensor | None] = [None] * len(micro)
        ref = [self._logprobs(self.ref_model, mb) for mb in micro] if self.ref_model is not None else None
        targets, critic_stats = self._gae_targets(micro, old, ref, n_tokens) if self.critic else (None, {})
        loss_ref = None if self.critic else ref          # PPO puts the KL into the reward, not into the loss
        t2 = time.perf_counter()
        sums = {k: torch.zeros((), device=self.device) for k in _SUM_STATS + (_CRITIC_SUM_STATS if targets else ())}
        ratio_max, grad_norms, critic_norms = torch.zeros((), device=self.device), [], []
        for _ in range(self.cfg.epochs):
            for i, mb in enumerate(micro):
                stats, old[i] = self._train_micro(mb, old[i], loss_ref[i] if loss_ref else None, denom)
                if targets:
                    stats |= self.critic.train_micro(mb, *targets[i], n_tokens)
                ratio_max = torch.maximum(ratio_max, stats.pop("ratio_max"))
                for k, v in stats.items():
                    sums[k] += v
            grad_norms.append(self._optimizer_step())
            critic_norms += [self.critic.step()] if self.critic else []
        t3 = time.perf_counter()
        out = {**self._reduce_stats(sums, ratio_max, n_tokens, denom), **shaping_stats, **critic_stats}
        if critic_norms:
            out["critic_grad_norm"] = sum(critic_norms) / len(critic_norms)
        finite = [g for g in grad_norms if math.isfinite(g)]
        out.update(nonfinite_skips=float(len(grad_norms) - len(finite)))
        out.update(grad_norm=sum(finite) / len(finite) if finite else float("nan"), tokens=float(n_tokens),
                   loss_denominator=float(denom), sequences=float(len(batch)), fetch_seconds=t1 - t0,
                   logprob_seconds=t2 - t1, train_seconds=t3 - t2, step_seconds=time.perf_counter() - t0)
        return out

    def _select_groups(self, groups: list[TrajectoryGroup]) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """DAPO's dynamic sampling (``algorithm.dynamic_sampling``: drop groups whose rewards don't vary) and
        the overlong penalty's statistics (the penalty itself is added in ``build_train_batch``).

        The filter reads the rewards from the reward functions, before the overlong term (DAPO filters on
        accuracy), after exclusions (``trainable_groups``). Stats: ``dapo/dropped_groups``, ``dapo/kept_groups``,
        ``dapo/overlong_penalty`` (mean term added to the reward), ``dapo/overlong_frac`` (share penalised).
        """
        stats: dict[str, float] = {}
        if self.algo.dynamic_sampling:
            groups, dropped = dynamic_sampling_filter(trainable_groups(groups))
            stats |= {"dapo/dropped_groups": float(dropped), "dapo/kept_groups": float(len(groups))}
        if self.reward_shaping is not None and groups:
            lengths = [len(t.completion_token_ids) for g in groups for t in g.trajectories if t.excluded is None]
            penalty = self.reward_shaping(torch.tensor(lengths))
            stats |= {"dapo/overlong_penalty": float(penalty.mean()),
                      "dapo/overlong_frac": float((penalty < 0).float().mean())}
        return groups, stats

    def _gae_targets(self, micro: list[TrainBatch], old: list[torch.Tensor | None], ref: list[torch.Tensor] | None,
                     n_tokens: torch.Tensor) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], dict[str, float]]:
        """PPO: V_old from the critic, token rewards with the KL penalty, GAE, and advantages whitened with
        the whole step's mean/std (all ranks), written to each ``mb.advantages`` [B, T].

        With a reference model the penalty ``kl_coef * k(pi_old, pi_ref)`` needs pi_old before any update,
        so ``old`` is filled here (one extra no-grad forward). Returns ``(V_old, returns)`` per micro-batch
        and step-wide stats: explained variance of V_old (1 - Var(R - V) / Var(R)), value and return means,
        the mean KL of the penalty.
        """
        targets, advantages, kl_sum = [], [], torch.zeros((), device=self.device)
        for i, mb in enumerate(micro):
            values, penalty = self.critic.values(mb), None
            if ref is not None:
                old[i] = self._logprobs(self.model, mb)
                kl = KL_ESTIMATORS[self.algo.kl_estimator](old[i], ref[i])
                penalty, kl_sum = self.algo.kl_coef * kl, kl_sum + masked_token_sum(kl, mb.loss_mask)
            adv, returns = outcome_gae(mb.rewards, values, mb.loss_mask, self.algo.gamma, self.algo.lam, penalty)
            targets.append((values, returns))
            advantages.append(adv)
        adv_moments = self._step_moments(advantages, micro)
        for mb, adv in zip(micro, advantages):
            mb.advantages = whiten_from_moments(adv, mb.loss_mask, adv_moments)
        (v_mean, _), (r_mean, r_var), (_, err_var) = (
            moments_mean_var(self._step_moments(xs, micro)) for xs in
            ([v for v, _ in targets], [r for _, r in targets], [r - v for v, r in targets]))
        stats = {"explained_variance": float(1.0 - err_var / r_var.clamp(min=1e-8)),
                 "value_mean": float(v_mean), "return_mean": float(r_mean)}
        if ref is not None:
            stats["kl"] = float(self._all_reduce(kl_sum) / n_tokens)
        return targets, stats

    def _step_moments(self, xs: list[torch.Tensor], micro: list[TrainBatch]) -> torch.Tensor:
        """``masked_moments`` [n, sum, sum of squares] of [B, T] tensors over the whole step (all ranks)."""
        local = torch.stack([masked_moments(x, mb.loss_mask) for x, mb in zip(xs, micro)]).sum(0)
        return self._all_reduce(local, dtype=torch.float64)

    def _step_totals(self, micro: list[TrainBatch]) -> tuple[torch.Tensor, torch.Tensor]:
        """(completion tokens, ``LOSS_AGG`` denominator) of the whole step on all ranks, each >= 1.

        Denominators depend only on the masks, so they are known before any forward pass; one all-reduce
        gives every rank the global value to divide its numerators by.
        """
        dens = [self.aggregate(torch.zeros_like(mb.loss_mask), mb.loss_mask, **self.agg_kw)[1] for mb in micro]
        local = torch.stack([sum(mb.loss_mask.sum() for mb in micro), sum(dens)])
        n_tokens, denom = self._all_reduce(local).clamp(min=1)
        return n_tokens, denom

    @staticmethod
    def _fetch(group_refs: list) -> list[TrajectoryGroup]:
        import ray

        refs = [r for r in group_refs if isinstance(r, ray.ObjectRef)]
        fetched = iter(ray.get(refs)) if refs else iter(())
        parts = [next(fetched) if isinstance(r, ray.ObjectRef) else r for r in group_refs]
        return [g for part in parts for g in part]

    def _micro_batches(self, share: TrainBatch) -> list[MicroBatch]:
        """Chunks of ``micro_batch_size`` padded rows, or with ``max_tokens_per_micro_batch`` packed rows of at
        most that many tokens (``shared_prefix``: each group's prompt once). Collective when packing: every dp
        rank runs as many micro-batches as the busiest (FSDP gathers in each forward), splitting its own
        chunks first and adding micro-batches with nothing to train on only when it has too few rows."""
        budget, share_prefix = self.cfg.max_tokens_per_micro_batch, self.cfg.shared_prefix
        if budget <= 0:
            return [to_device(mb, self.device) for mb in row_micro_batches(share, self.cfg.micro_batch_size)]
        units, costs, chunks = packing_plan(share, budget, share_prefix)
        count = int(self._all_reduce(torch.tensor(float(len(chunks))), dist.ReduceOp.MAX))
        chunks = split_to_count(chunks, costs, count)
        out = [packed_micro_batch(share, [units[u] for u in chunk], share_prefix) for chunk in chunks]
        out += [empty_micro_batch(share, share_prefix) for _ in range(count - len(out))]
        return [to_device(mb, self.device) for mb in out]

    def _forward(self, model: torch.nn.Module,
                 mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        """What the loss needs from the model: (logits [R, K, V], their targets [R, K], ``to_batch`` laying
        per-entry values [R, K, ...] out like ``mb.loss_mask`` [b, T, ...]).

        Padded rows: R = b, K = T, logits only from ``target_start`` (the LM head and the softmax over the
        vocabulary cost as much as several layers, and prompt positions carry no loss). Packed: one row
        with position ids per sequence and a block mask, K scored entries (``packing.py``).
        ``trainer.dtype=bf16`` runs the model under autocast with the LM head in float32.
        """
        with autocast(self.device.type, self.cfg.dtype):
            if mb.packed is None:
                keep = torch.arange(mb.target_start, mb.input_ids.shape[1], device=self.device)
                logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False,
                               logits_to_keep=keep).logits
                return logits[:, :-1], mb.input_ids[:, mb.target_start + 1:], lambda v: v
            row = mb.packed
            mask = attention_mask_4d(row, model.config._attn_implementation, torch.float32)
            logits = model(input_ids=row.input_ids, position_ids=row.position_ids, attention_mask=mask,
                           use_cache=False, logits_to_keep=row.score_pos).logits
            return logits, row.score_target[None], lambda v: place(v[0], row.gather)

    @torch.no_grad()
    def _logprobs(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        """Per-token logprobs [b, T] aligned with ``mb.loss_mask`` (no graph)."""
        logits, targets, to_batch = self._forward(model, mb)
        return to_batch(target_logprobs(logits, targets, self.temperature))

    def _train_micro(self, mb: TrainBatch, old: torch.Tensor | None, ref: torch.Tensor | None,
                     denom: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Forward/backward one micro-batch; returns its stat sums (and ratio_max) and the old logprobs
        (``old`` if given, else this forward's detached logprobs: valid before any update)."""
        logits, targets, to_batch = self._forward(self.model, mb)
        logprobs = to_batch(target_logprobs(logits, targets, self.temperature))
        old = logprobs.detach() if old is None else old
        behaviour = ({} if self.off_policy_kw is None else
                     {"behaviour_logprobs": mb.behaviour_logprobs, **self.off_policy_kw})
        per_token, stats = self.policy_loss(logprobs, old, mb.advantages, mb.loss_mask, **self.policy_kw,
                                            **behaviour)
        kl_sum = torch.zeros((), device=self.device)
        if ref is not None:
            kl_term, kl_stats = kl_loss(logprobs, ref, mb.loss_mask, self.algo.kl_coef, self.algo.kl_estimator)
            per_token, kl_sum = per_token + kl_term, kl_stats["kl"] * mb.loss_mask.sum()
        entropy_term, entropy_sum = self._entropy(logits, to_batch, mb)
        if entropy_term is not None:
            per_token = per_token + entropy_term
        numerator, _ = self.aggregate(per_token, mb.loss_mask, **self.agg_kw)
        # FSDP2 averages gradients over the dp ranks; scaling by dp_size turns that back into a sum, so the
        # gradient is d(sum of all dp ranks' numerators / D_step). TP ranks share rows and compute one loss.
        (numerator * self.dp_size / denom).backward()
        ntok = mb.loss_mask.sum()
        with torch.no_grad():
            return {"loss": numerator.detach(), "clip_frac": stats["clip_frac"] * ntok,
                    "approx_kl": stats["approx_kl"] * ntok, "ratio_mean": stats["ratio_mean"] * ntok,
                    "ratio_max": stats["ratio_max"], "kl": kl_sum.detach(), "entropy": entropy_sum,
                    "behaviour_kl": masked_token_sum(kl_k3(mb.behaviour_logprobs, old), mb.loss_mask),
                    "is_weight": stats.get("is_weight_mean", ntok.new_ones((), dtype=torch.float32)) * ntok,
                    "is_trunc_frac": stats.get("is_trunc_frac", ntok.new_zeros((), dtype=torch.float32)) * ntok}, old

    def _entropy(self, logits: torch.Tensor, to_batch: Callable[[torch.Tensor], torch.Tensor],
                 mb: MicroBatch) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(entropy-bonus loss term [b, T] or None when entropy_coef is 0, token-summed entropy for stats);
        ``logits`` [R, K, V] and ``to_batch`` as ``_forward`` returns them."""
        if self.algo.entropy_coef <= 0:
            entropy = to_batch(logits_entropy(logits.detach(), self.temperature))
            return None, masked_token_sum(entropy, mb.loss_mask)
        scaled = to_batch(logits.float() / self.temperature)          # [b, T, V] aligned with loss_mask
        term, stats = entropy_bonus(scaled, mb.loss_mask, self.algo.entropy_coef)
        return term, stats["entropy"] * mb.loss_mask.sum()

    def _optimizer_step(self) -> float:
        """Clip the global grad norm (DTensor-aware), step AdamW; returns the pre-clip norm."""
        return clip_and_step(self.model, self.optimizer, self.cfg.grad_clip)

    def _all_reduce(self, value: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Reduce over the dp ranks only: the ranks of a tp group hold the same rows, so summing over all
        ranks would count every token tp_size times."""
        value = value.detach().to(self.device, dtype).clone()
        dist.all_reduce(value, op=op, group=self.dp_group)
        return value

    def _reduce_stats(self, sums: dict[str, torch.Tensor], ratio_max: torch.Tensor, n_tokens: torch.Tensor,
                      denom: torch.Tensor) -> dict[str, float]:
        """Means over all ranks and epochs (loss: over the aggregation's denominator, the rest: over
        tokens); ratio_max is the max over them."""
        total = self._all_reduce(torch.stack(list(sums.values()))) / self.cfg.epochs
        out = {k: float(v / (denom if k == "loss" else n_tokens)) for k, v in zip(sums, total)}
        out["ratio_max"] = float(self._all_reduce(ratio_max, dist.ReduceOp.MAX))
        return out

    # ---------------------------------------------------------------- weights out
    def offload(self) -> float:
        """Colocated GPUs: training state to host memory while the engines generate; bytes moved (CPU: 0)."""
        return self._move(torch.device("cpu")) if self.device.type == "cuda" else 0.0

    def onload(self) -> float:
        """Training state back onto this rank's GPU before a train step; bytes moved (CPU: 0)."""
        return self._move(self.device) if self.device.type == "cuda" else 0.0

    def _move(self, device: torch.device) -> float:
        from relayrl.trainer.offload import move_training_state

        modules = [m for m in (self.model, self.ref_model) if m is not None]
        optimizers = [self.optimizer]
        if self.critic is not None:
            modules.append(self.critic.model)
            optimizers.append(self.critic.optimizer)
        return float(move_training_state(modules, optimizers, device))

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full, unsharded CPU state dict with HF names on rank 0 (None elsewhere). Collective.

        FSDP2 replaces parameters in place (DTensors) without renaming modules, so the keys are exactly
        ``AutoModelForCausalLM.state_dict()``'s: what ``load_state_dict`` and vLLM's ``load_weights`` take.
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=options)
        return state if self.rank == 0 else None

    def critic_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The critic's full CPU state dict (HF ``*ForTokenClassification`` names) on rank 0. Collective."""
        if self.critic is None:
            raise RuntimeError(f"algorithm.name={self.algo.name!r} trains no critic; use algorithm.name=gae (PPO)")
        state = self.critic.state_dict()
        return state if self.rank == 0 else None

    def connect_rollouts(self, ws_cfg: WeightSyncConfig, rollouts: list, workers: list[int]) -> None:
        """Get ready to sync weights to ``rollouts`` (RolloutActor handles; ``workers[i]`` vLLM workers each).

        The source is vLLM's ``ModuleSource`` over the FSDP model: it all-gathers one parameter at a
        time (``full_tensor``), in ``named_parameters`` order on every rank, so tied weights appear
        once and the trainer never holds more than one bucket of gathered weights.
        """
        from vllm.distributed.weight_transfer.base import ModuleSource

        from relayrl.weightsync.sync import TrainerSync

        if self._sync is not None:
            self._sync.close()
        self._sync = TrainerSync(ws_cfg, ModuleSource(self.model), self.rank, rollouts, workers,
                                 wire_dtype=self.model_cfg.dtype)

    def sync_weights(self, version: int) -> dict[str, float] | None:
        """Send the current weights to every engine as ``version`` (collective). Rank 0 returns metrics."""
        if self._sync is None:
            raise RuntimeError("sync_weights before connect_rollouts; call TrainerGroup.connect_rollouts first")
        stats = self._sync.sync(version)
        return stats if self.rank == 0 else None

    def save_hf(self, out_dir: str) -> str | None:
        """Write an HF model directory (safetensors, config, tokenizer) from rank 0. Collective."""
        state = self.state_dict()
        if self.rank != 0:
            return None
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        config = AutoConfig.from_pretrained(self.model_path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(state, strict=True, assign=True)
        model.tie_weights()
        model.save_pretrained(out_dir, safe_serialization=True)
        AutoTokenizer.from_pretrained(self.model_path).save_pretrained(out_dir)
        if (Path(self.model_path) / "generation_config.json").exists():
            GenerationConfig.from_pretrained(self.model_path).save_pretrained(out_dir)
        return str(out_dir)

    @torch.no_grad()
    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int], temperature: float | None = None) -> list[float]:
        """Logprob of each token after the first under the current weights (default: the sampling
        temperature). Collective."""
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        logits = self.model(input_ids=ids, use_cache=False).logits
        return token_logprobs(logits, ids, self.temperature if temperature is None else temperature)[0].tolist()

    # ---------------------------------------------------------------- checkpoints
    def _checkpoint_parts(self) -> dict:
        parts = {"policy": (self.model, self.optimizer)}
        if self.critic is not None:
            parts["critic"] = (self.critic.model, self.critic.optimizer)
        return parts

    def save_checkpoint(self, path: str, asynchronous: bool = False) -> float:
        """Collective: this rank's shards of the policy (and critic) with their optimizers, and its RNG;
        ``asynchronous`` returns once they are staged (``checkpoint_written`` says when they are on disk).
        Returns the seconds training was held up."""
        return self._saver.save(Path(path), self._checkpoint_parts(), self.rank, asynchronous)

    def checkpoint_written(self, wait: bool = False) -> bool:
        """Whether the last ``save_checkpoint`` is on disk (``wait``: block until it is)."""
        if wait:
            self._saver.wait()
        return self._saver.done()

    def load_checkpoint(self, path: str) -> None:
        """Collective: restore ``save_checkpoint``'s state into the live sharded modules."""
        self._saver.wait()
        checkpoint.load(Path(path), self._checkpoint_parts(), self.rank)

    def close(self) -> None:
        """Leave the process group (lets the actor be killed without a hung collective)."""
        if self._sync is not None:
            self._sync.close()
        if dist.is_initialized():
            dist.destroy_process_group()
