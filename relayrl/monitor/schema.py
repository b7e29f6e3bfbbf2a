"""The metric schema: every metric a run logs, with its unit and meaning, in one place.

Names are ``group/name``; the groups are the dashboard's sections (docs/observability.md is rendered
from this table by ``schema_doc.schema_markdown`` and a test keeps the two equal). A name part in angle brackets
is a family: ``reward/<fn>`` is one metric per reward function, ``staleness/<d>`` one per version lag.

Producers keep their own short names (the trainer returns ``loss``, ``kl``, ...; the scorer's clock is
``timing/score``); ``to_schema`` is the one place where they become schema names, applied by
``RunDir.log`` before any sink sees a step. It also adds what is derived from other metrics
(``policy/lr``, ``perf/*``, ``rollout/tokens_per_s``).

``when`` says in which runs a metric appears: ``always``; ``async`` (mode=async); ``colocated``;
``verify`` (steps where ``weightsync.verify_every`` divides the version); ``first_sync`` (the step whose
sync sets up the transfer channel); ``drop_stale`` (buffer.drop_stale=true and something was dropped);
``first_step`` (the first step a driver process logs: a run's step 1, or the first after a resume);
``gae`` (algorithm.name=gae: PPO with a critic); ``dapo`` (algorithm.dynamic_sampling or an overlong buffer);
``dynamic`` (algorithm.dynamic_sampling); ``env`` (env.name is set: multi-turn episodes); ``eval`` (steps that
evaluate: eval.every > 0 divides the step, and step 0 with eval.before_first_step); ``push`` (a sync that moves
the weights into the engines: every backend but ``weightsync.pull_when=admission``); ``publish``
(``weightsync.pull_when=admission``: the sync publishes, each replica fetches on its next call).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

REDUCTIONS = ("mean", "sum", "min", "max")

# Names that code in several files writes or reads: one constant each, so a rename is one edit.
REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
REWARD_FN = "reward/<fn>"
REWARD_PASS_RATE = "reward/pass_rate"
REWARD_SPREAD_GROUPS = "reward/spread_groups"
REWARD_ZERO_STD_GROUPS = "reward/zero_std_groups"
POLICY_SKIPPED_GROUPS = "policy/skipped_groups"
POLICY_KL = "policy/kl"
POLICY_APPROX_KL = "policy/approx_kl"
TRAINER_TOKEN_IMBALANCE = "trainer/token_imbalance"
MEMORY_TRAINER_PEAK_GB = "memory/trainer_peak_gb"
MEMORY_ENGINE_GB = "memory/engine_gb"
ROLLOUT_COMPLETIONS = "rollout/completions"
ROLLOUT_TOKENS = "rollout/tokens"
ROLLOUT_CALLS = "rollout/calls"
ROLLOUT_TOKENS_PER_S = "rollout/tokens_per_s"
ROLLOUT_MIN_VERSION = "rollout/min_version"
ROLLOUT_MAX_VERSION = "rollout/max_version"
ROLLOUT_OCCUPANCY = "rollout/occupancy"
ROLLOUT_REPLICAS = "rollout/replicas"
ROLLOUT_REISSUED = "rollout/reissued"
STALENESS_LAG = "staleness/<d>"
STALENESS_MAX = "staleness/max"
TIMING_GENERATE = "timing/generate"
TIMING_SCORE = "timing/score"
TIMING_REWARD = "timing/reward"
TIMING_TRAIN = "timing/train"
TIMING_SYNC = "timing/sync"
TIMING_WAIT = "timing/wait"
TIMING_CHECKPOINT_STALL = "timing/checkpoint_stall"
TIMING_STEP = "timing/step"
WEIGHTSYNC_VERSION = "weightsync/version"
WEIGHTSYNC_BYTES = "weightsync/bytes"
WEIGHTSYNC_TOTAL_S = "weightsync/total_s"
WEIGHTSYNC_GBPS = "weightsync/gbps"
WEIGHTSYNC_STALL_S = "weightsync/stall_s"
WEIGHTSYNC_STAGE_S = (
    "weightsync/{stage}_s"  # a stage's seconds: start, transfer, receive, commit, init, connect, publish
)
MISMATCH_MEAN_ABS = "mismatch/mean_abs"
MISMATCH_MAX_ABS = "mismatch/max_abs"
MISMATCH_TOKENS = "mismatch/tokens"
PERF_COMPLETIONS_PER_S = "perf/completions_per_s"
PERF_TOKENS_PER_S = "perf/tokens_per_s"
PERF_TOKENS_PER_S_PER_REPLICA = "perf/tokens_per_s_per_replica"
EVAL_TIME_S = "eval/time_s"


@dataclass(frozen=True)
class Metric:
    name: str  # "group/name"; "<...>" parts are families
    unit: str
    meaning: str
    when: str = "always"
    reduce: str = "mean"  # how per-call values combine into the step's: group-weighted mean | sum | min | max

    def __post_init__(self) -> None:
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"metric {self.name}: reduce={self.reduce!r}; use one of {', '.join(REDUCTIONS)}")

    @property
    def group(self) -> str:
        return self.name.split("/", 1)[0]

    def matches(self, key: str) -> bool:
        """``staleness/<d>`` matches ``staleness/2`` (``<d>``: digits); other ``<...>`` parts match one name part."""
        pattern = re.sub(r"<[^>]+>", lambda m: r"\d+" if m.group() == "<d>" else "[^/]+", self.name)
        return re.fullmatch(pattern, key) is not None


M = Metric
SCHEMA: tuple[Metric, ...] = (
    # reward/* - the scorer (relayrl.rewards.scoring.reward_metrics), over completions not excluded
    M(REWARD_MEAN, "reward", "mean weighted total reward of the step's completions (the headline)"),
    M(REWARD_STD, "reward", "population std of the total reward (per generate call, averaged)"),
    M(REWARD_FN, "reward", "mean of one reward function, over completions where it applied"),
    M(REWARD_PASS_RATE, "fraction", "completions whose primary (first) reward function gave >= 1"),
    M(
        REWARD_SPREAD_GROUPS,
        "groups",
        "trainable groups whose rewards vary (what dynamic sampling keeps)",
        reduce="sum",
    ),
    M(REWARD_ZERO_STD_GROUPS, "fraction", "prompt groups whose completions all scored the same (no GRPO signal)"),
    M("reward/errors", "count", "completions excluded because a reward function failed on them", reduce="sum"),
    M("reward/error_rate", "fraction", "excluded completions / all completions"),
    M(
        "reward/errors/<reason>",
        "count",
        "excluded completions per reason (raised, timeout, worker_died, ...)",
        reduce="sum",
    ),
    M("reward/dropped_groups", "count", "groups not trained on: fewer than 2 scored completions left", reduce="sum"),
    # policy/* - the trainer's step statistics, token-weighted means over ranks and epochs
    M("policy/loss", "loss", "policy loss (incl. KL and entropy terms) over the aggregation's denominator"),
    M(POLICY_KL, "nats/token", "KL(pi || pi_ref) estimate against the frozen reference (0 when kl_coef=0)"),
    M(POLICY_APPROX_KL, "nats/token", "k3 KL(pi_old || pi) inside the step: how far the update moved"),
    M("policy/behaviour_kl", "nats/token", "k3 KL(engine || trainer) before the update: off-policyness"),
    M("policy/entropy", "nats/token", "mean token entropy of the policy at the sampling temperature"),
    M("policy/clip_frac", "fraction", "tokens whose ratio was clipped"),
    M("policy/ratio_mean", "ratio", "mean pi/pi_old"),
    M("policy/ratio_max", "ratio", "max pi/pi_old"),
    M("policy/is_weight", "ratio", "mean truncated importance weight pi_old/mu (1 without off-policy correction)"),
    M("policy/is_trunc_frac", "fraction", "tokens whose importance weight hit the cap"),
    M("policy/grad_norm", "norm", "global gradient norm before clipping (mean over epochs)"),
    M("policy/lr", "lr", "learning rate of the step"),
    M("policy/tokens", "tokens", "completion tokens in the loss (all ranks)"),
    M("policy/sequences", "count", "sequences trained on"),
    M(
        POLICY_SKIPPED_GROUPS,
        "groups",
        "groups left out of the update: rewards all equal, so nothing to learn (algorithm.drop_zero_spread)",
    ),
    M("policy/skipped_micro_batches", "count", "micro-batches whose advantages were all 0: no forward or backward"),
    M("policy/loss_denominator", "count", "the loss aggregation's denominator (tokens for token-mean)"),
    M("policy/value_loss", "loss", "PPO critic: clipped value regression loss per token", "gae"),
    M("policy/value_clip_frac", "fraction", "PPO critic: tokens where the clipped value term was larger", "gae"),
    M("policy/explained_variance", "fraction", "PPO critic: 1 - Var(returns - values) / Var(returns)", "gae"),
    M("policy/value_mean", "value", "PPO critic: mean predicted value over completion tokens", "gae"),
    M("policy/return_mean", "value", "PPO critic: mean GAE return over completion tokens", "gae"),
    M("policy/critic_grad_norm", "norm", "PPO critic: gradient norm before clipping", "gae"),
    M("policy/nonfinite_skips", "count", "optimizer steps skipped for a NaN/inf gradient (trainer.max_bad_steps)"),
    # dapo/* - DAPO's dynamic sampling and overlong shaping (trainer side)
    M("dapo/dropped_groups", "groups", "groups without reward spread dropped before the update", "dapo"),
    M("dapo/kept_groups", "groups", "groups trained on after dynamic sampling", "dapo"),
    M("dapo/drawn_groups", "groups", "groups the step drew from the buffer to fill up (refills included)", "dynamic"),
    M("dapo/overlong_penalty", "reward", "mean soft overlong penalty added to the rewards", "dapo"),
    M("dapo/overlong_frac", "fraction", "completions inside the overlong buffer", "dapo"),
    # trainer/* - how the step's work was spread over the trainer ranks
    M(
        TRAINER_TOKEN_IMBALANCE,
        "ratio",
        "max / mean over dp ranks of the tokens their forwards run over (packed rows, or padded rows x length); "
        "1 = even",
    ),
    # rollout/*
    M(ROLLOUT_COMPLETIONS, "count", "completions generated for this step", reduce="sum"),
    M(ROLLOUT_TOKENS, "tokens", "completion tokens generated for this step", reduce="sum"),
    M("rollout/len_mean", "tokens", "mean completion length"),
    M("rollout/truncated_frac", "fraction", "completions cut at rollout.max_tokens"),
    M("rollout/empty_frac", "fraction", "completions with no visible text (EOS first or whitespace only)"),
    M(
        ROLLOUT_CALLS,
        "count",
        "generate calls whose groups the step took (replicas; more when DAPO refills)",
        reduce="sum",
    ),
    M(ROLLOUT_TOKENS_PER_S, "tokens/s", "generation speed of one busy engine: tokens / engine-seconds"),
    M(ROLLOUT_MIN_VERSION, "version", "oldest policy version among the step's tokens", reduce="min"),
    M(ROLLOUT_MAX_VERSION, "version", "newest policy version among the step's tokens", reduce="max"),
    M("rollout/restarts", "count", "rollout replicas replaced so far after their actor or engine died"),
    M("rollout/running", "sequences", "mean sequences an engine ran per engine step (vLLM's scheduler)"),
    M("rollout/waiting", "sequences", "mean sequences waiting in an engine per engine step"),
    M(
        ROLLOUT_OCCUPANCY,
        "fraction",
        "rollout/running / the target: rollout.in_flight when streaming, else a chunk's sequences",
    ),
    M(ROLLOUT_REPLICAS, "count", "rollout replicas serving when the step was logged (``relayrl scale``)"),
    M(
        ROLLOUT_REISSUED,
        "count",
        "straggler copies whose other copy came back first during the step: cancelled or discarded, never trained",
        reduce="sum",
    ),
    M("rollout/engine_steps", "count", "engine steps (prefill or decode) of all replicas in the step", reduce="sum"),
    # env/* - multi-turn episodes (relayrl.controller.system.env_metrics), means over the step's episodes
    M("env/turns", "turns", "model turns per episode", "env"),
    M("env/tool_calls", "calls", "well-formed calls of a known tool per episode", "env"),
    M("env/tool_call_rate", "fraction", "episodes that made at least one tool call", "env"),
    M("env/tool_errors", "count", "malformed calls, unknown tools and failed calls per episode", "env"),
    M("env/timeout_frac", "fraction", "episodes ended by env.episode_timeout_s", "env"),
    # staleness/*
    M(STALENESS_LAG, "count", "groups trained whose oldest token is d versions behind the trainer"),
    M(STALENESS_MAX, "versions", "largest d of the step (<= buffer.max_staleness)"),
    M("staleness/mean", "versions", "group-weighted mean d"),
    # buffer/*
    M("buffer/depth", "groups", "groups waiting in the replay buffer after the step's batch was taken"),
    M("buffer/entries", "count", "generate calls waiting in the replay buffer"),
    M("buffer/dropped/<reason>", "groups", "groups dropped so far (only with buffer.drop_stale)", "drop_stale"),
    # accounting/* - every prompt issued ends trained or dropped (checked at the end of the run)
    M("accounting/issued", "prompts", "prompts started so far (a chunk regenerated after a crash counts once)"),
    M("accounting/trained", "prompts", "prompts whose groups reached a train step so far"),
    M("accounting/dropped", "prompts", "prompts dropped so far, with the reason under buffer/dropped/*"),
    # timing/*
    M(TIMING_GENERATE, "s", "wall seconds of one generate call (mean over the step's calls)"),
    M(TIMING_REWARD, "s", "driver: a generate call's groups handed to the scorer -> its result read (mean)"),
    M("timing/fetch", "s", "trainer: pulling the step's trajectories from the object store"),
    M("timing/logprob", "s", "trainer: reference-model logprobs (0 when kl_coef=0)"),
    M("timing/update", "s", "trainer: forward/backward/optimizer over all epochs"),
    M("timing/train_actor", "s", "trainer: the whole train_step inside the rank"),
    M(TIMING_TRAIN, "s", "driver: train_step call to its result"),
    M(TIMING_SYNC, "s", "driver: weight sync incl. the mismatch probe"),
    M(TIMING_CHECKPOINT_STALL, "s", "driver held by checkpoint saves since the last step (async: the staging copy)"),
    M(TIMING_WAIT, "s", "trainer idle waiting for a full batch since the last step"),
    M(TIMING_STEP, "s", "wall seconds since the previous step was logged"),
    # startup/* (the first step a driver process logs)
    M(
        "startup/engine_s",
        "s",
        "slowest rollout engine's construction (AsyncLLM start; its vLLM import unless forked from the preloaded "
        "server)",
        when="first_step",
    ),
    M(
        "startup/engines_up_s",
        "s",
        "system start -> every engine answers (actors start concurrently)",
        when="first_step",
    ),
    M(
        "startup/actors_s",
        "s",
        "system start -> engines up, trainer ranks set up and connected to them",
        when="first_step",
    ),
    M("startup/first_step_s", "s", "system up -> first step logged", when="first_step"),
    M("startup/to_first_step_s", "s", "process launch -> first step logged", when="first_step"),
    # idle/*
    M("idle/rollout", "fraction", "1 - engine busy seconds / (replicas x step seconds)"),
    M("idle/trainer", "fraction", "1 - trainer busy seconds / step seconds"),
    # memory/*
    M(
        MEMORY_TRAINER_PEAK_GB,
        "GB",
        "peak memory of the busiest trainer rank since it started: CUDA max_memory_allocated, CPU peak RSS",
        reduce="max",
    ),
    M(
        MEMORY_ENGINE_GB,
        "GB",
        "memory of the largest rollout replica at the step's end: CUDA memory in use on its device, CPU RSS "
        "of its actor and its engine processes",
        reduce="max",
    ),
    M("colocated/switches", "count", "bundle hand-overs rollout<->trainer in the step (0 unless colocated)"),
    M(
        "colocated/offload_bytes",
        "bytes",
        "trainer state moved to/from the GPU per rank at the last switch (0 on CPU)",
        "colocated",
    ),
    # weightsync/*
    M(WEIGHTSYNC_VERSION, "version", "version the engines committed (= step)"),
    M(WEIGHTSYNC_BYTES, "bytes", "bytes moved per engine (wire dtype, aligned)"),
    M(WEIGHTSYNC_TOTAL_S, "s", "trainer-side seconds of the whole sync"),
    M(WEIGHTSYNC_GBPS, "GB/s", "bytes / (transfer + commit seconds)"),
    M(WEIGHTSYNC_STALL_S, "s", "longest time an engine was paused for the update"),
    M("weightsync/start_s", "s", "stage: engines paused and update opened", "push"),
    M("weightsync/transfer_s", "s", "stage: weights sent and staged", "push"),
    M(
        "weightsync/receive_s",
        "s",
        "stage: engines receive (broadcast: during transfer) and verify the payload",
        "push",
    ),
    M("weightsync/commit_s", "s", "stage: staged weights loaded and version set", "push"),
    M(
        "weightsync/publish_s",
        "s",
        "stage: the version written to the pull store (replicas fetch on their next call)",
        "publish",
    ),
    M("weightsync/init_s", "s", "stage: transfer channel set up on the engines", "first_sync"),
    M("weightsync/connect_s", "s", "trainer-side channel set-up", "first_sync"),
    # mismatch/*
    M(MISMATCH_MEAN_ABS, "nats/token", "mean |engine - trainer| logprob after a sync", "verify"),
    M(MISMATCH_MAX_ABS, "nats/token", "max |engine - trainer| logprob after a sync", "verify"),
    M(MISMATCH_TOKENS, "tokens", "tokens compared by the probe", "verify"),
    # perf/*
    M(PERF_COMPLETIONS_PER_S, "1/s", "rollout/completions / timing/step: end-to-end completions per second"),
    M(PERF_TOKENS_PER_S, "tokens/s", "rollout/tokens / timing/step: end-to-end tokens per second"),
    M(PERF_TOKENS_PER_S_PER_REPLICA, "tokens/s", "perf/tokens_per_s / rollout.num_replicas"),
    # eval/* - evaluation during training (relayrl.controller.training_eval): the step's synced weights
    # (step 0: the initial model) on eval.train_prompts held-out prompts
    M("eval/greedy_accuracy", "fraction", "greedy completions (temperature 0, one per prompt) that pass", "eval"),
    M("eval/sampled_accuracy", "fraction", "sampled completions (rollout.temperature) that pass", "eval"),
    M("eval/pass@<k>", "fraction", "prompts with a passing sample among k = eval.samples (unbiased pass@k)", "eval"),
    M("eval/mean_reward", "reward", "mean weighted total reward of the sampled completions", "eval"),
    M(EVAL_TIME_S, "s", "wall seconds of the evaluation (the trainer waits this long)", "eval"),
)
del M

GROUPS: tuple[str, ...] = tuple(dict.fromkeys(m.group for m in SCHEMA))
"""Sections in order: reward, policy, dapo, trainer, rollout, env, staleness, buffer, accounting, timing, startup,
idle, memory, colocated, weightsync, mismatch, perf, eval."""

RENAMES: dict[str, str] = {
    TIMING_SCORE: TIMING_REWARD,
    "fetch_seconds": "timing/fetch",
    "logprob_seconds": "timing/logprob",
    "train_seconds": "timing/update",
    "step_seconds": "timing/train_actor",
}
"""Producer names that are not ``policy/<name>``. Every other bare name (no ``/``) is a trainer stat and
becomes ``policy/<name>``."""


def canonical_name(key: str) -> str:
    """``loss`` -> ``policy/loss``; ``timing/score`` -> ``timing/reward``; schema names pass through."""
    if key in RENAMES:
        return RENAMES[key]
    return key if "/" in key else f"policy/{key}"


def to_schema(metrics: dict[str, Any], lr: float, replicas: int) -> dict[str, Any]:
    """A step's producer metrics under schema names, plus the derived ones:

    * ``policy/lr``: ``lr`` unless the trainer reported its own (a schedule);
    * ``perf/completions_per_s`` = completions / step seconds, ``perf/tokens_per_s`` = tokens / step seconds,
      ``perf/tokens_per_s_per_replica`` = that / replicas;
    * ``rollout/tokens_per_s`` = tokens / (calls x mean generate seconds) = tokens / engine-busy seconds,
      where calls = ``rollout/calls`` (the replica count when that is absent: one call per replica and step).
    """
    out = {canonical_name(k): v for k, v in metrics.items()}
    out.setdefault("policy/lr", lr)
    step_s, gen_s = out.get(TIMING_STEP), out.get(TIMING_GENERATE)
    if ROLLOUT_TOKENS in out and step_s:
        out[PERF_COMPLETIONS_PER_S] = out[ROLLOUT_COMPLETIONS] / step_s
        out[PERF_TOKENS_PER_S] = out[ROLLOUT_TOKENS] / step_s
        out[PERF_TOKENS_PER_S_PER_REPLICA] = out[PERF_TOKENS_PER_S] / replicas
    if ROLLOUT_TOKENS in out and gen_s:
        out[ROLLOUT_TOKENS_PER_S] = out[ROLLOUT_TOKENS] / (out.get(ROLLOUT_CALLS, replicas) * gen_s)
    return out


def lookup(key: str) -> Metric | None:
    """The schema entry documenting ``key`` (exact names before families), or None."""
    for metric in SCHEMA:
        if metric.name == key:
            return metric
    return next((m for m in SCHEMA if m.matches(key)), None)


def reduction(key: str) -> str:
    """How a step combines per-call values of ``key`` (the schema entry's ``reduce``; mean if unknown)."""
    metric = lookup(key)
    return metric.reduce if metric else "mean"


def expected(when: set[str]) -> list[Metric]:
    """Metrics a run must log at least once, given the conditions it meets (``always`` is implied)."""
    return [m for m in SCHEMA if m.when in when | {"always"}]


def schema_gaps(keys: set[str], when: set[str]) -> tuple[list[str], list[str]]:
    """(logged keys the schema does not document, schema metrics for ``when`` that no key matches).

    Both empty means the run logged exactly what the schema promises; ``step`` and ``wall_time`` (added by
    the jsonl sink) are not metrics.
    """
    keys = set(keys) - {"step", "wall_time"}
    undocumented = sorted(k for k in keys if lookup(k) is None)
    missing = [m.name for m in expected(when) if not any(m.matches(k) for k in keys)]
    return undocumented, missing
