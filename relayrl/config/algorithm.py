"""The ``algorithm`` section (advantage estimator, policy loss, KL, off-policy correction, DAPO's
fields) and ``critic``, PPO's value model.

The names of estimators and losses are checked against the registries that implement them
(``algorithms.advantages``, ``.losses``, ``.kl``, ``.aggregation``): a new entry there is a valid choice
here, with no second list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relayrl.config.base import ConfigError, one_of, positive

OffPolicy = Literal["auto", "tis", "tis_sequence", "decoupled", "none"]
"""Values of ``algorithm.off_policy``, a ``str`` field checked against them (``base`` says why)."""

GROUPED_ESTIMATORS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
"""Advantage estimators whose baseline comes from the other samples of the same prompt (need G >= 2)."""
ZERO_SPREAD_ESTIMATORS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo")
"""Grouped estimators whose advantage is 0 on every sample of a group whose rewards don't vary
(reinforce_pp_baseline whitens over the batch afterwards, which shifts such a group away from 0)."""


def _algorithm_choices() -> dict[str, tuple[str, ...]]:
    """Valid names per algorithm field, read from the registries (pure torch modules, cheap to import)."""
    from relayrl.algorithms.advantages import ADVANTAGES, CRITIC_ESTIMATORS, WHITEN_MODES
    from relayrl.algorithms.aggregation import LOSS_AGG
    from relayrl.algorithms.kl import KL_ESTIMATORS
    from relayrl.algorithms.losses import POLICY_LOSSES

    return {
        "name": (*ADVANTAGES, *CRITIC_ESTIMATORS),
        "policy_loss": tuple(POLICY_LOSSES),
        "loss_agg": tuple(LOSS_AGG),
        "kl_estimator": tuple(KL_ESTIMATORS),
        "whiten": WHITEN_MODES,
    }


@dataclass
class AlgorithmConfig:
    name: str = "grpo"
    """Advantage estimator, a key of ``algorithms.advantages.ADVANTAGES``: grpo | dr_grpo (no std division) |
    rloo | reinforce_pp (batch-whitened) | reinforce_pp_baseline; or gae: PPO with a learned critic
    (``critic`` section; per-token GAE(gamma, lam) advantages, whitened over the step)."""
    group_size: int = 8
    """Completions sampled per prompt (G); grouped estimators compare each one with its group."""
    policy_loss: str = "ppo_clip"
    """Per-token surrogate, a key of ``algorithms.losses.POLICY_LOSSES``: ppo_clip | dual_clip | clip_higher | gspo."""
    clip_eps: float = 0.2
    """Lower clip range of the ratio pi/pi_old (and the upper one unless clip_eps_high is set).
    gspo clips a per-token geometric-mean ratio: its paper uses 3e-4."""
    clip_eps_high: float | None = None
    """Upper clip range (DAPO's clip-higher: 0.28); None: symmetric, = clip_eps."""
    dual_clip_c: float = 3.0
    """dual_clip only: caps the loss of a negative-advantage token at c|A| (must be > 1)."""
    loss_agg: str = "token-mean"
    """How per-token losses become the step's loss, a key of ``algorithms.aggregation.LOSS_AGG``: token-mean |
    seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm. Normalised over the whole step."""
    norm_len: int | None = None
    """seq-mean-token-sum-norm's constant L in sum / (B * L); None: rollout.max_tokens (set by load_config)."""
    kl_coef: float = 0.0
    """Weight of the KL(pi || pi_ref) loss term; 0 skips the reference model entirely."""
    kl_estimator: str = "k3"
    """Per-token KL estimator, a key of ``algorithms.kl.KL_ESTIMATORS``: k1 | k2 | k3 | abs (|k1|)."""
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
    drop_zero_spread: bool = True
    """Leave out of the update the groups whose completions all got the same reward when that leaves nothing to
    learn from them: a group-baseline estimator (``ZERO_SPREAD_ESTIMATORS``) gives them advantage 0, and with
    kl_coef = entropy_coef = 0 no other term reaches them. Counted as ``policy/skipped_groups``; a step left
    with no group skips its update. Like DAPO's filter it drops their tokens from token-mean denominators,
    without drawing more prompts; false keeps them (their tokens still dilute the mean, as in plain GRPO)."""
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
            one_of(f"algorithm.{key}", getattr(self, key), choices)
        one_of("algorithm.off_policy", self.off_policy, OffPolicy)
        positive("algorithm", self, "group_size")
        if self.name in GROUPED_ESTIMATORS and self.group_size < 2:
            raise ConfigError(
                f"algorithm.group_size={self.group_size} gives {self.name} no group to compare "
                "against; set algorithm.group_size>=2 or algorithm.name=reinforce_pp"
            )
        self._check_clip()
        self._check_ranges()

    def _check_clip(self) -> None:
        """Each policy loss's clip hyper-parameters."""
        if self.clip_eps <= 0 or (self.clip_eps_high is not None and self.clip_eps_high <= 0):
            raise ConfigError(
                f"algorithm.clip_eps={self.clip_eps} and clip_eps_high={self.clip_eps_high} must "
                "be > 0; set algorithm.clip_eps=0.2"
            )
        if self.policy_loss == "ppo_clip" and self.clip_eps_high is not None:
            raise ConfigError(
                "algorithm.clip_eps_high is set but ppo_clip is symmetric; "
                "use algorithm.policy_loss=clip_higher (or dual_clip/gspo) or unset clip_eps_high"
            )
        if self.policy_loss == "clip_higher" and not (self.clip_eps_high or 0) > self.clip_eps:
            raise ConfigError(
                f"algorithm.policy_loss=clip_higher needs algorithm.clip_eps_high > clip_eps="
                f"{self.clip_eps} (got {self.clip_eps_high}); set algorithm.clip_eps_high=0.28"
            )
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
            raise ConfigError(
                f"algorithm.dynamic_sampling drops groups whose rewards don't vary, and a group of "
                f"group_size={self.group_size} never varies; set algorithm.group_size>=2"
            )
        if self.max_sampling_batches < 0:
            raise ConfigError(
                f"algorithm.max_sampling_batches={self.max_sampling_batches} must be >= 0 (0: no "
                "limit); set algorithm.max_sampling_batches=10"
            )
        for key in ("gamma", "lam"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"algorithm.{key}={getattr(self, key)} must be in [0, 1]; set algorithm.{key}=1.0")
        if self.overlong_max_len is not None and self.overlong_max_len <= 0:
            raise ConfigError(
                f"algorithm.overlong_max_len={self.overlong_max_len} must be > 0; leave it unset (rollout.max_tokens)"
            )


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
