"""Config composition and validation: each bad input fails with one line naming the field and the fix."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from relayrl.config import (
    RECIPES_DIR,
    AlgorithmConfig,
    Config,
    ConfigError,
    RolloutConfig,
    TrainerConfig,
    WeightSyncConfig,
    has_cuda,
    load_config,
)


@pytest.mark.parametrize("name", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_every_recipe_composes_and_validates(name):
    cfg = load_config(name)
    assert isinstance(cfg, Config)


def test_overrides_are_typed():
    cfg = load_config("grpo_tiny", ["trainer.lr=3e-4", "run.steps=7", "placement=colocated"])
    assert cfg.trainer.lr == pytest.approx(3e-4) and cfg.run.steps == 7
    assert cfg.placement.mode == "colocated"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["trainer.lrr=1"], "unknown config key 'trainer.lrr'; did you mean 'trainer.lr'?"),
        (["run.stepz=3"], "did you mean 'run.steps'?"),
        (["trainer.lr=abc"], "trainer.lr: Value 'abc'"),
        (["algorithm.group_size=1"], "set algorithm.group_size>=2"),
        (["trainer.world_size=0"], "trainer.world_size=0 must be > 0"),
        (["rollout.top_p=1.5"], "rollout.top_p=1.5 must be in (0, 1]"),
        (["rollout.start_timeout_s=-1"], "rollout.start_timeout_s=-1.0 must be >= 0 (0: no deadline)"),
        (["model.dtype=float8"], "model.dtype='float8' is not supported"),
        (["placement=colocated", "rollout.num_replicas=2"], "lower rollout.num_replicas"),
        (["data.task=jsonl"], "data.task=jsonl needs data.path"),
        (["data.path=/nonexistent.jsonl"], "data.path=/nonexistent.jsonl does not exist"),
        (["placement=nowhere"], "placement=nowhere is not an option; use one of: colocated, separate"),
        (["weightsync.pull_when=later"], "weightsync.pull_when='later' is not supported; use one of sync, admission"),
        (["weightsync.pull_when=admission"], "is for engines that fetch from a store; set weightsync.backend=pull"),
        (
            ["weightsync.backend=pull", "weightsync.pull_when=admission", "placement=colocated"],
            "placement=colocated hands the weights over in every sync",
        ),
        (
            ["algorithm.name=ppo"],
            (
                "algorithm.name='ppo' is not supported; use one of grpo, dr_grpo, rloo, "
                "reinforce_pp, reinforce_pp_baseline"
            ),
        ),
        (["algorithm.policy_loss=trpo"], "algorithm.policy_loss='trpo' is not supported; use one of ppo_clip,"),
        (["algorithm.loss_agg=sum"], "algorithm.loss_agg='sum' is not supported; use one of token-mean,"),
        (["algorithm.kl_estimator=k4"], "algorithm.kl_estimator='k4' is not supported; use one of k1, k2, k3"),
        (
            ["algorithm.name=rloo", "algorithm.group_size=1"],
            "gives rloo no group to compare against; set algorithm.group_size>=2",
        ),
        (["algorithm.clip_eps_high=0.28"], "use algorithm.policy_loss=clip_higher"),
        (
            ["algorithm.policy_loss=clip_higher"],
            "needs algorithm.clip_eps_high > clip_eps=0.2 (got None); set algorithm.clip_eps_high=0.28",
        ),
        (["algorithm.policy_loss=gspo", "algorithm.clip_eps_high=-1"], "must be > 0; set algorithm.clip_eps=0.2"),
        (["algorithm.policy_loss=dual_clip", "algorithm.dual_clip_c=1"], "algorithm.dual_clip_c=1.0 must be > 1"),
        (["algorithm.norm_len=0"], "algorithm.norm_len=0 must be > 0"),
        (["algorithm.entropy_coef=-0.1"], "algorithm.entropy_coef=-0.1 must be >= 0"),
        (["algorithm.kl_coef=-1"], "algorithm.kl_coef=-1.0 must be >= 0"),
        (["rollout.in_flight=-1"], "rollout.in_flight=-1 must be >= 0 (0: a chunk's worth); set rollout.in_flight=0"),
        (
            ["rollout.stream=true", "rollout.in_flight=3"],
            (
                "rollout.in_flight=3 holds less than one group of algorithm.group_size=4 sequences; "
                "set rollout.in_flight to a multiple of it"
            ),
        ),
    ],
)
def test_bad_config_is_one_line_naming_the_field(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config("grpo_tiny", overrides)
    message = str(err.value)
    assert expected in message
    assert "\n" not in message


def test_reinforce_pp_needs_no_group_and_norm_len_defaults_to_max_tokens():
    cfg = load_config("grpo_tiny", ["algorithm.name=reinforce_pp", "algorithm.group_size=1"])
    assert cfg.algorithm.group_size == 1
    assert cfg.algorithm.norm_len == cfg.rollout.max_tokens == 16
    assert load_config("grpo_tiny", ["algorithm.norm_len=64"]).algorithm.norm_len == 64


def test_recipes_select_their_algorithm():
    dr, rloo, dapo = load_config("drgrpo_arith"), load_config("rloo_tiny"), load_config("dapo_arith")
    assert (dr.algorithm.name, dr.algorithm.loss_agg) == ("dr_grpo", "seq-mean-token-sum-norm")
    assert rloo.algorithm.name == "rloo" and rloo.model.path == "tiny-llama"
    assert (dapo.algorithm.policy_loss, dapo.algorithm.clip_eps_high, dapo.algorithm.loss_agg) == (
        "clip_higher",
        0.28,
        "token-mean",
    )


def test_unknown_recipe_lists_the_choices():
    with pytest.raises(ConfigError, match=r"choose one of: .*grpo_arith"):
        load_config("no_such_recipe")


def test_cli_prints_one_line_and_exits_2_before_ray_starts():
    proc = subprocess.run(
        [sys.executable, "-m", "relayrl.cli", "train", "--config-name", "grpo_arith", "trainer.lrr=1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == ["relayrl: config error: unknown config key 'trainer.lrr'; did you mean 'trainer.lr'?"]
    assert "ray" not in proc.stdout.lower()


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["mode=async", "buffer.max_staleness=1"], "tis"),
        (["mode=async", "buffer.max_staleness=0"], "none"),
        (["mode=sync"], "none"),
        (["mode=async", "algorithm.off_policy=decoupled"], "decoupled"),
    ],
)
def test_off_policy_auto_resolves_from_mode_and_staleness(overrides, expected):
    assert load_config("grpo_tiny", overrides).algorithm.off_policy == expected


@pytest.mark.parametrize(
    "overrides, in_flight",
    [
        (["rollout.stream=true"], 8),  # a chunk's sequences: 2 prompts / 1 replica x 4
        (["rollout.stream=true", "rollout.num_replicas=2", "run.prompts_per_step=4"], 8),  # 4 / 2 x 4
        (["rollout.stream=true", "run.prompts_per_step=6", "algorithm.group_size=2"], 12),  # 6 / 1 x 2
        (["rollout.stream=true", "rollout.in_flight=12"], 12),  # set: kept
        ([], 0),  # not streaming: max_num_seqs stays vLLM's
    ],
)
def test_in_flight_defaults_to_a_chunks_sequences_when_streaming(overrides, in_flight):
    assert load_config("grpo_tiny", overrides).rollout.in_flight == in_flight


def test_async_needs_an_equal_share_per_replica():
    with pytest.raises(ConfigError, match=re.escape("prompts_per_step=3 must be a multiple of rollout.num_replicas=2")):
        load_config("grpo_tiny", ["run.prompts_per_step=3", "rollout.num_replicas=2"])


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["algorithm.lam=1.5"], "algorithm.lam=1.5 must be in [0, 1]"),
        (["algorithm.gamma=-0.1"], "algorithm.gamma=-0.1 must be in [0, 1]"),
        (["critic.lr=0"], "critic.lr=0.0 must be > 0"),
        (["critic.value_clip=-1"], "critic.value_clip=-1.0 must be >= 0"),
        (["algorithm.overlong_buffer=17"], "algorithm.overlong_buffer=17 exceeds overlong_max_len=16"),
        (["algorithm.overlong_buffer=-1"], "algorithm.overlong_buffer=-1 must be >= 0"),
        (
            ["algorithm.dynamic_sampling=true", "algorithm.name=reinforce_pp", "algorithm.group_size=1"],
            "a group of group_size=1 never varies; set algorithm.group_size>=2",
        ),
    ],
)
def test_ppo_and_dapo_fields_are_checked(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config("grpo_tiny", overrides)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_ppo_and_dapo_recipes():
    ppo, dapo = load_config("ppo_tiny"), load_config("dapo_arith")
    assert (ppo.algorithm.name, ppo.algorithm.gamma, ppo.algorithm.lam, ppo.trainer.epochs) == ("gae", 1.0, 1.0, 2)
    assert ppo.critic.value_clip == 0.2 and load_config("ppo_arith").algorithm.name == "gae"
    assert dapo.algorithm.dynamic_sampling and dapo.algorithm.overlong_buffer == 8
    assert dapo.algorithm.overlong_max_len == dapo.rollout.max_tokens == 32


@pytest.mark.parametrize(
    "build, expected",
    [
        (lambda: RolloutConfig(top_p=1.5), "rollout.top_p=1.5 must be in (0, 1]"),
        (lambda: TrainerConfig(world_size=0), "trainer.world_size=0 must be > 0"),
        (lambda: TrainerConfig(world_size=3, tp_size=2), "trainer.world_size=3 is not divisible by trainer.tp_size=2"),
        (lambda: AlgorithmConfig(loss_agg="sum"), "algorithm.loss_agg='sum' is not supported"),
        (lambda: WeightSyncConfig(backend="ftp"), "weightsync.backend='ftp' is not supported"),
        (lambda: Config(mode="later"), "mode='later' is not supported; use one of sync, async"),
    ],
)
def test_each_section_checks_its_own_fields_when_built(build, expected):
    """Checks live with their dataclass: building a section with a bad field fails at once, in one line."""
    with pytest.raises(ConfigError) as err:
        build()
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_tiny_recipes_share_the_tiny_scale_and_keep_their_own_keys():
    """recipes/scale/tiny.yaml sets the tiny scale once; a recipe's own keys (after it) win."""
    for name in ("grpo_tiny", "dapo_tiny", "drgrpo_tiny", "rloo_tiny", "ppo_tiny", "agent_calc_tiny"):
        cfg = load_config(name)
        assert (cfg.model.path, cfg.rollout.max_tokens, cfg.algorithm.group_size, cfg.logging.wandb) == (
            "tiny-llama",
            16,
            4,
            "disabled",
        ), name
    calc = load_config("agent_calc_tiny")
    assert (calc.run.steps, calc.model.max_model_len, [r.fn for r in calc.rewards]) == (
        2,
        1024,
        ["env_reward", "digit_fraction"],
    )


@pytest.mark.skipif(has_cuda(), reason="the refusal is for CPU engines")
@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["rollout.pp_size=2"], "rollout.pp_size=2 on CPU needs a compiled engine"),
        (["rollout.pp_size=0"], "rollout.pp_size=0 must be > 0"),
        (
            ["rollout.pp_size=2", "rollout.enforce_eager=false", "placement=colocated"],
            "set rollout.tp_size=1 rollout.pp_size=1 or placement=separate",
        ),
    ],
)
def test_a_pipelined_engine_is_checked_before_ray(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config("grpo_tiny", overrides)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert load_config("grpo_tiny", ["rollout.pp_size=2", "rollout.enforce_eager=false"]).rollout.workers == 2
