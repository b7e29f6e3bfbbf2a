"""The ``trainer`` section: the FSDP2/TP ranks, their optimizer and micro-batching; and
``trainer.lora``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from relayrl.config.base import ConfigError, choices_of, one_of, positive

TrainerBackend = Literal["auto", "gloo", "nccl"]
"""``trainer.backend`` values."""
TrainerDtype = Literal["float32", "bf16"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved", "zero_bubble"]
LOOPED = ("interleaved", "zero_bubble")
"""Schedules that take pp_virtual_stages > 1 and run rounds of pp_size micro-batches."""
"""Values of ``trainer.dtype``, a ``str`` field checked against them (``base`` says why)."""


LLAMA_LINEARS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP linears of Llama-style decoders (Llama, Qwen2, Mistral, SmolLM2)."""


AUTO_SHARE = 0.25
"""``auto`` checkpoints when the estimated activations exceed this share of a rank's memory (the rest
holds weights, gradients, AdamW's moments, the head's chunks and, on a CPU box, the engines). The trainer
(``trainer/recompute.py``) and the simulator's memory check (``plan/scenario.py``) both decide by it."""


def every_of(mode: str) -> int | None:
    """``off`` -> 0, ``full`` -> 1, ``"N"`` -> N, ``auto`` -> None (``resolve_every`` decides)."""
    if mode == "auto":
        return None
    if mode in ("off", "full"):
        return int(mode == "full")
    if mode.isdigit() and int(mode) > 0:
        return int(mode)
    raise ConfigError(
        f"trainer.activation_checkpointing={mode!r} is not known; use auto, off, full, or N > 0 (every N-th layer)"
    )


@dataclass
class LoraConfig:
    r: int = 0
    """LoRA rank (``trainer/lora.py``, through PEFT); 0: off, every weight is trained. With r > 0 only the
    adapters A [r, in] and B [out, r] of ``target_modules`` train (AdamW state for them alone); engines get
    the merged weights W + alpha / r * B @ A under the base model's names."""
    alpha: float = 16.0
    """LoRA scale numerator: the update is alpha / r * B @ A."""
    dropout: float = 0.0
    """Dropout on the adapters' input. Only 0 is accepted: the trainer runs in eval mode so that the first
    epoch's logprobs are exactly pi_old (``trainer/actor.py``), which would leave any dropout inactive."""
    target_modules: list[str] = field(default_factory=lambda: list(LLAMA_LINEARS))
    """Names of the linear layers that get adapters (matched against module names by PEFT)."""

    def __post_init__(self) -> None:
        if self.r < 0:
            raise ConfigError(f"trainer.lora.r={self.r} must be >= 0 (0: off); set e.g. trainer.lora.r=8")
        if self.r and not self.alpha > 0:
            raise ConfigError(f"trainer.lora.alpha={self.alpha} must be > 0; set e.g. trainer.lora.alpha=16")
        if self.dropout != 0.0:
            raise ConfigError(
                f"trainer.lora.dropout={self.dropout}: the trainer runs in eval mode (pi_old is the "
                "first epoch's forward), so dropout would never act; set trainer.lora.dropout=0"
            )
        if self.r and not self.target_modules:
            raise ConfigError(
                "trainer.lora.target_modules is empty; name the linears to adapt, e.g. "
                "trainer.lora.target_modules=[q_proj,v_proj]"
            )


@dataclass
class TrainerConfig:
    world_size: int = 1
    """Trainer ranks (Ray actors in one torch.distributed group, FSDP2-sharded)."""
    tp_size: int = 1
    """Tensor-parallel ranks per model replica (``trainer/tp.py``): world_size = dp x tp; FSDP2 shards over
    the dp ranks, the decoder layers' linears are split over the tp ranks. Must divide world_size and the
    model's attention and KV heads; PPO's critic needs tp_size=1."""
    cp_size: int = 1
    """Context-parallel ranks per model replica (``trainer/context.py``): each packed row is split over them
    by position, attention gathers the row's keys and values, so one row takes 1/cp_size of the
    activations on each rank (a sequence too long for one rank trains on several). world_size = dp x cp;
    needs packed rows (max_tokens_per_micro_batch > 0) and tp_size=1; PPO's critic needs cp_size=1."""
    pp_size: int = 1
    """Pipeline stages of the policy (``trainer/pipeline.py``, on ``torch.distributed.pipelining``): its decoder
    layers cut into pp_size x pp_virtual_stages equal runs, one pipeline rank each, the RL loss on the last
    stage; world_size = dp x pp x tp, each rank holding only its stages' weights, the decoder layers FSDP2-sharded
    over the dp replicas of a stage (with tp_size > 1 the replicas hold them whole).
    Packed or padded rows, GRPO and PPO (KL terms, entropy bonus), tp_size > 1 inside each stage (a ("dp",
    "pp", "tp") mesh); not built yet: cp_size > 1, LoRA (refused by name)."""
    pp_schedule: str = "1f1b"
    """gpipe | 1f1b | interleaved (interleaved 1F1B: pp_virtual_stages stages a rank, a smaller bubble) |
    zero_bubble (torch's ScheduleInterleavedZeroBubble, ZB-H1 of Qi et al. 2024: each backward split into its input
    and weight halves, the weight halves filling the bubble; pp_virtual_stages stages a rank, 1 or more)."""
    pp_virtual_stages: int = 1
    """Stages each pipeline rank holds under pp_schedule=interleaved or zero_bubble (Megatron-LM's v)."""
    lr: float = 1e-5
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    fused_adamw: bool = True
    """CPU ranks: AdamW's fused kernel (``fused=True``: one pass over each tensor, no temporaries) for the policy
    and the critic; the same update up to float rounding (``tests/trainer/test_optimizer.py``). False: torch's
    default per-tensor loop. GPU ranks keep torch's default either way."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    micro_batch_size: int = 8
    """Padded micro-batches only (max_tokens_per_micro_batch=0): sequences per forward/backward on one rank;
    gradients accumulate over the rank's share."""
    epochs: int = 1
    """Optimizer passes over each batch (PPO epochs); >1 makes the clip matter."""
    num_cpus: float = 1.0
    """Ray CPUs each trainer rank asks for."""
    num_threads: int = 0
    """CPU only: torch threads per rank (0: every core, as the sync loop runs one phase at a time; ``mode=async``
    with separate placement: the cores shared out among replicas and ranks, ``cluster.split_cores``)."""
    max_restarts: int = 2
    """If a trainer rank dies, restart the run from its latest checkpoint (run.checkpoint_every) at most
    this many times."""
    max_bad_steps: int = 3
    """Steps in a row whose gradient was NaN/inf (the optimizer step is skipped and counted in
    policy/nonfinite_skips) before the run stops."""
    backend: str = "auto"
    """torch.distributed backend: auto (nccl with CUDA, else gloo) | gloo | nccl."""
    max_tokens_per_micro_batch: int = 2048
    """Padding-free packing (``trainer/packing.py``): each micro-batch is one row of at most this many real
    tokens (a longer sequence is a row of its own), sequences concatenated with their own position ids,
    each attending to itself only (``trainer/attention.py``: no mask; attention costs the sum of the
    sequences' squared lengths, not the row's); micro_batch_size is then unused. 0: micro-batches of
    micro_batch_size right-padded rows. With cp_size > 1 a row is split over the cp ranks."""
    shared_prefix: bool = True
    """Needs max_tokens_per_micro_batch > 0: a group's G sequences share one copy of their common prefix
    (the prompt) in the packed row, each completion attending to it and causally to itself only, so the
    prompt is computed once per group instead of G times. Exact: equal to the per-sequence forward."""
    dtype: str = "float32"
    """Trainer compute: float32 | bf16 (autocast: bf16 matmuls with float32 master weights, AdamW state,
    LM head, logprobs and losses; the critic stays float32). Not the weights' dtype (model.dtype)."""
    activation_checkpointing: str = "auto"
    """Recompute decoder-layer activations in the backward instead of keeping them (``trainer/recompute.py``):
    off | full | N (every N-th layer) | auto (full when the longest micro-batch's estimated activations,
    max(max_tokens_per_micro_batch, model.max_model_len) tokens, would take over a quarter of a rank's
    memory). For the policy, the critic and the SFT warm start; exact (the same gradients)."""
    logits_chunk: int = 1024
    """Positions the LM head scores at a time (``trainer/head.py``): logprobs and entropies come from the final
    hidden states chunk by chunk, recomputed in the backward, so [tokens, vocabulary] logits never exist.
    Memory O(logits_chunk x V); exact."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full-weight training (``trainer.lora.r=8``); off by default (r=0)."""
    setup_nice: int = 10
    """Niceness each rank adds while it sets up (``trainer/background.py``), so the engines starting beside it
    get the cores first; undone when setup ends. 0 disables; skipped where it could not be undone (neither
    root nor RLIMIT_NICE)."""

    def _check_cp(self) -> None:
        if self.cp_size == 1:
            return
        if self.world_size % self.cp_size:
            raise ConfigError(
                f"trainer.world_size={self.world_size} is not divisible by trainer.cp_size={self.cp_size}; "
                f"set trainer.world_size to a multiple of {self.cp_size} (or lower trainer.cp_size)"
            )
        if self.tp_size > 1:
            raise ConfigError(
                f"trainer.cp_size={self.cp_size} with trainer.tp_size={self.tp_size} is not built; set one of them to 1"
            )
        if self.max_tokens_per_micro_batch == 0:
            raise ConfigError(
                f"trainer.cp_size={self.cp_size} splits packed rows; set trainer.max_tokens_per_micro_batch > 0"
            )

    def _check_pp(self) -> None:
        one_of("trainer.pp_schedule", self.pp_schedule, PipelineSchedule)
        if self.pp_virtual_stages > 1 and self.pp_schedule not in LOOPED:
            raise ConfigError(
                f"trainer.pp_virtual_stages={self.pp_virtual_stages} needs trainer.pp_schedule=interleaved "
                "or zero_bubble"
            )
        if self.pp_size == 1:
            return
        fix = "set trainer.pp_size=1"
        model = self.pp_size * self.tp_size  # the ranks of one model replica
        if self.world_size % model:
            raise ConfigError(
                f"trainer.world_size={self.world_size} is not divisible by trainer.pp_size x trainer.tp_size="
                f"{model}; set trainer.world_size to a multiple of {model} (or lower trainer.pp_size)"
            )
        if self.cp_size > 1:
            raise ConfigError(f"trainer.pp_size with trainer.cp_size > 1 is not built yet; {fix} or cp_size=1")
        if self.lora.r:
            raise ConfigError(f"LoRA (trainer.lora.r={self.lora.r}) under trainer.pp_size is not built; {fix}")

    def __post_init__(self) -> None:
        positive(
            "trainer",
            self,
            "world_size",
            "tp_size",
            "cp_size",
            "pp_size",
            "pp_virtual_stages",
            "lr",
            "micro_batch_size",
            "epochs",
            "num_cpus",
        )
        if not 0 <= self.setup_nice <= 19:
            raise ConfigError(f"trainer.setup_nice={self.setup_nice} is not a niceness increment; set 0 (off) to 19")
        one_of("trainer.backend", self.backend, TrainerBackend)
        if self.world_size % self.tp_size:
            raise ConfigError(
                f"trainer.world_size={self.world_size} is not divisible by trainer.tp_size="
                f"{self.tp_size}; set trainer.world_size to a multiple of {self.tp_size} (or lower "
                "trainer.tp_size)"
            )
        self._check_cp()
        self._check_pp()
        if self.lora.r and self.tp_size > 1:
            raise ConfigError(
                f"trainer.lora.r={self.lora.r} runs with FSDP only (the adapters "
                "are not split over tp ranks); set trainer.tp_size=1 or "
                "trainer.lora.r=0"
            )
        if self.max_tokens_per_micro_batch < 0:
            raise ConfigError(
                f"trainer.max_tokens_per_micro_batch={self.max_tokens_per_micro_batch} must be "
                ">= 0 (0: padded micro-batches); set e.g. trainer.max_tokens_per_micro_batch=2048"
            )
        if self.shared_prefix and self.max_tokens_per_micro_batch == 0:
            raise ConfigError(
                "trainer.shared_prefix=true needs packed rows; set trainer.max_tokens_per_micro_batch"
                " > 0 or trainer.shared_prefix=false"
            )
        if self.logits_chunk <= 0:
            raise ConfigError(
                f"trainer.logits_chunk={self.logits_chunk} must be > 0 (positions per LM-head chunk); "
                "set e.g. trainer.logits_chunk=1024"
            )
        self.activation_checkpointing = str(self.activation_checkpointing)  # hydra reads `=2` as an int
        every_of(self.activation_checkpointing)
        if self.dtype not in choices_of(TrainerDtype):
            raise ConfigError(f"trainer.dtype={self.dtype!r} is not known; use float32 or bf16")
