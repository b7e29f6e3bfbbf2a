"""``trainer.pp_size``: the policy in pipeline stages, through the real trainer (Ray actors, gloo), trains
what one rank trains: three GRPO steps with the clip acting, stats, grad norms and gathered weights equal
(fp32), for 1F1B on the 2-layer tiny model and interleaved 1F1B on a 4-layer one; the gathered weights score
like the trainer, and a pp=2 checkpoint resumes on one rank. What is not built yet is refused in one line
before Ray starts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from relayrl.config import AlgorithmConfig, CriticConfig, ModelConfig, TrainerConfig
from relayrl.trainer import manifest
from tests.trainer.test_actor import PROBE, TEMPERATURE, _hf_model, _logprobs, _synthetic_groups
from tests.trainer.test_tp import GRAD_CLIP, PARAM_ATOL, STAT_KEYS, STEPS, tp_friendly


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["trainer.world_size=3", "trainer.pp_size=2"],
            "trainer.world_size=3 is not divisible by trainer.pp_size x trainer.tp_size=2",
        ),
        (
            ["trainer.pp_virtual_stages=2"],
            "trainer.pp_virtual_stages=2 needs trainer.pp_schedule=interleaved or zero_bubble",
        ),
        (["trainer.pp_schedule=zb"], "trainer.pp_schedule"),
        (["trainer.pp_size=0"], "trainer.pp_size=0 must be > 0"),
    ],
)
def test_bad_pp_config_is_one_line_before_ray(overrides, expected):
    from relayrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=re.escape(expected)) as info:
        load_config("grpo_tiny", overrides)
    assert "\n" not in str(info.value)


PADDED = ["trainer.max_tokens_per_micro_batch=0", "trainer.shared_prefix=false"]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["trainer.cp_size=2"], "trainer.pp_size with trainer.cp_size > 1 is not built yet"),
        (["trainer.lora.r=8"], "LoRA (trainer.lora.r=8) under trainer.pp_size is not built"),
        (["trainer.tp_size=2"], "trainer.world_size=2 is not divisible by trainer.pp_size x trainer.tp_size=4"),
    ],
)
def test_what_pipeline_stages_do_not_train_yet_is_refused_by_name(overrides, expected):
    from relayrl.config import ConfigError, load_config

    base = ["trainer.world_size=2", "trainer.pp_size=2", *PADDED]
    if "trainer.cp_size=2" in overrides:
        base = ["trainer.world_size=4", "trainer.pp_size=2"]
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config("grpo_tiny", [*base, *overrides])


def test_stages_that_do_not_divide_the_layers_fail_before_ray(tiny_llama):
    """tiny-llama has 2 layers: 2 ranks x 2 virtual stages is refused when the model is resolved."""
    from relayrl.config import ConfigError, load_config
    from relayrl.preflight import check_context

    over = ["trainer.world_size=2", "trainer.pp_size=2", "trainer.pp_schedule=interleaved", *PADDED]
    cfg = load_config("grpo_tiny", [f"model.path={tiny_llama}", *over, "trainer.pp_virtual_stages=2"])
    with pytest.raises(ConfigError, match=r"2 layers do not split into .* = 4 equal pipeline stages"):
        check_context(cfg, tiny_llama)


def test_a_rank_reads_only_its_own_stages(tiny_llama):
    """``load_stages`` on each of 2 pipeline ranks: the weights of its stage, equal to the whole model's, the rest
    frozen meta stand-ins of the same shapes; the tied LM head is the embedding on the last rank too; the rotary
    embedding's buffers are rebuilt on the device."""
    from relayrl.trainer import pp_weights

    whole = _hf_model(tiny_llama)
    expected = dict(whole.named_parameters())
    layers = {0: ".layers.0.", 1: ".layers.1."}
    for rank in (0, 1):
        model = pp_weights.load_stages(str(tiny_llama), torch.device("cpu"), rank, 2)
        held = set(pp_weights.held(model))
        assert {n for n in held if ".layers." in n} == {n for n in expected if layers[rank] in n}
        assert ("model.embed_tokens.weight" in held) and (("model.norm.weight" in held) == (rank == 1))
        for name, p in model.named_parameters():
            assert p.shape == expected[name].shape and (p.is_meta != (name in held)), name
            if name in held:
                torch.testing.assert_close(p, expected[name], atol=0, rtol=0)
            else:
                assert not p.requires_grad
        assert model.lm_head.weight is model.model.embed_tokens.weight
        torch.testing.assert_close(model.model.rotary_emb.inv_freq, whole.model.rotary_emb.inv_freq)


def test_micro_batch_count_and_filler_rows():
    """9 rows at 2 a micro-batch: 5 micro-batches (1F1B), 6 interleaved over 2 ranks; 3 rows over 4 stages:
    4 micro-batches, so filler rows (all masked) make 4 rows."""
    from relayrl.trainer.pp_step import micro_batch_count, padded_rows
    from relayrl.types import TrainBatch

    assert micro_batch_count(9, 2, 2, "1f1b") == 5 and micro_batch_count(9, 2, 2, "interleaved") == 6
    assert micro_batch_count(3, 8, 4, "gpipe") == 4
    batch = TrainBatch(
        input_ids=torch.tensor([[5, 6, 7, 0], [5, 6, 0, 0], [5, 6, 7, 0]]),
        attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]]),
        loss_mask=torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]),
        behaviour_logprobs=torch.zeros(3, 3),
        advantages=torch.tensor([1.0, -1.0, 0.5]),
        prompt_ids=[0, 0, 1],
    )
    rows = padded_rows(batch, 4, pad_id=0)
    assert rows.input_ids.tolist() == [[5, 6, 7], [5, 6, 0], [5, 6, 7], [0, 0, 0]]
    assert rows.loss_mask.tolist() == [[0, 1], [1, 0], [0, 1], [0, 0]] and rows.advantages.tolist()[-1] == 0


def _layers(base: Path, out: Path, layers: int) -> Path:
    """``base``'s tokenizer and config with ``layers`` decoder layers, fresh seeded weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").exists():
        return out
    config = AutoConfig.from_pretrained(base)
    config.num_hidden_layers = layers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def train(
    path: Path,
    pp_size: int,
    refs: list,
    *,
    world_size: int | None = None,
    schedule: str = "1f1b",
    virtual: int = 1,
    algo: str = "grpo",
    kl_coef: float = 0.0,
    epochs: int = 1,
    entropy_coef: float = 0.0,
    budget: int = 0,
    shared_prefix: bool = False,
    tp_size: int = 1,
) -> dict:
    """Three train_steps of padded rows (or packed, ``budget`` tokens a row); per-step stats, the gathered state
    and the live group."""
    from relayrl.trainer.ranks import TrainerGroup

    world = world_size or pp_size
    cfg = TrainerConfig(
        world_size=world,
        pp_size=pp_size,
        tp_size=tp_size,
        pp_schedule=schedule,
        pp_virtual_stages=virtual,
        lr=1e-3,
        epochs=epochs,
        micro_batch_size=2,
        max_tokens_per_micro_batch=budget,
        shared_prefix=shared_prefix,
        grad_clip=GRAD_CLIP,
        num_cpus=1 / world,
        num_threads=1,
    )
    trainer = TrainerGroup(
        world,
        str(path),
        ModelConfig(path=str(path)),
        cfg,
        AlgorithmConfig(name=algo, group_size=3, kl_coef=kl_coef, entropy_coef=entropy_coef),
        TEMPERATURE,
        seed=0,
        critic_cfg=CriticConfig(lr=1e-3),
    )
    trainer.ready()
    stats = [trainer.train_step(refs) for _ in range(STEPS)]
    return {"stats": stats, "state": trainer.state_dict(), "trainer": trainer}


def _assert_same_run(run: dict, ref: dict, label: str) -> None:
    for step, (s, r) in enumerate(zip(run["stats"], ref["stats"])):
        for key in STAT_KEYS:
            assert s[key] == pytest.approx(r[key], abs=1e-5, rel=1e-5), (label, step, key)
    assert run["state"].keys() == ref["state"].keys()
    for k in ref["state"]:
        torch.testing.assert_close(run["state"][k], ref["state"][k], atol=PARAM_ATOL, rtol=0, msg=f"{label}: {k}")


def _assert_resumes_on_one_rank(path: Path, refs: list, checkpoint: Path, state: dict, label: str) -> None:
    """A one-rank trainer (GRPO with the KL term) loads ``checkpoint`` to ``state``'s weights (PARAM_ATOL)."""
    one = train(path, 1, refs, kl_coef=KL)
    try:
        one["trainer"].load_checkpoint(str(checkpoint))
        for k, v in one["trainer"].state_dict().items():
            torch.testing.assert_close(v, state[k], atol=PARAM_ATOL, rtol=0, msg=f"{label}: {k}")
    finally:
        one["trainer"].shutdown()


@pytest.fixture(scope="module")
def refs(ray_session, tiny_llama):
    groups = _synthetic_groups(vocab=_hf_model(tiny_llama).config.vocab_size)
    return [ray_session.put(groups[:2]), ray_session.put(groups[2:])]


KL = 0.05  # GRPO's KL to the reference in the loss: the reference runs in pipeline stages too
ENTROPY = 0.1  # an entropy bonus large enough to move the weights well past PARAM_ATOL in three steps


@pytest.fixture(scope="module")
def reference(tiny_llama, refs):
    run = train(tiny_llama, 1, refs, kl_coef=KL)
    run.pop("trainer").shutdown()
    return run


def test_pp2_1f1b_trains_what_one_rank_trains(tiny_llama, refs, reference, tmp_path):
    """Three steps with a KL term, the clip acting: the same stats and weights; the gathered weights load into
    transformers and score like the trainer; a pp=2 checkpoint resumes on one rank to the same weights."""
    assert reference["stats"][0]["grad_norm"] > GRAD_CLIP
    start = _hf_model(tiny_llama).state_dict()
    assert max((reference["state"][k] - start[k]).abs().max().item() for k in start) > 10 * PARAM_ATOL  # moved
    assert abs(reference["stats"][-1]["loss"] - reference["stats"][0]["loss"]) > 1e-4  # the KL term moved it
    assert reference["stats"][-1]["kl"] > 0
    run = train(tiny_llama, 2, refs, kl_coef=KL)
    try:
        _assert_same_run(run, reference, "pp=2 1f1b")
        first, last = run["trainer"].held_parameters()  # each rank its own stage's weights, together all of them
        assert {n for n in first if ".layers." in n} == {n for n in run["state"] if ".layers.0." in n}
        assert {n for n in last if ".layers." in n} == {n for n in run["state"] if ".layers.1." in n}
        assert "model.embed_tokens.weight" in first and "model.norm.weight" in last and "model.norm.weight" not in first
        head = "model.embed_tokens.weight" if _hf_model(tiny_llama).config.tie_word_embeddings else "lm_head.weight"
        assert head in last and set(first) | set(last) == {n for n, _ in _hf_model(tiny_llama).named_parameters()}
        model = _hf_model(tiny_llama)
        model.load_state_dict(run["state"], strict=True)
        trainer_lp = torch.tensor(run["trainer"].sequence_logprobs(PROBE))
        torch.testing.assert_close(_logprobs(model, PROBE), trainer_lp, atol=1e-5, rtol=0)
        run["trainer"].save_checkpoint(str(tmp_path))
        manifest.write(tmp_path)  # the driver's commit
        next_pp = run["trainer"].train_step(refs)
        after_pp = run["trainer"].state_dict()
    finally:
        run["trainer"].shutdown()
    one = train(tiny_llama, 1, refs, kl_coef=KL)
    try:  # the pp=2 checkpoint (each stage's weights and AdamW moments under the model's names) on one rank
        one["trainer"].load_checkpoint(str(tmp_path))
        for k, v in one["trainer"].state_dict().items():
            torch.testing.assert_close(v, run["state"][k], atol=0, rtol=0, msg=f"resumed on 1 rank: {k}")
        next_one = one["trainer"].train_step(refs)
        assert next_one["grad_norm"] == pytest.approx(next_pp["grad_norm"], rel=1e-5)
        for k, v in one["trainer"].state_dict().items():
            torch.testing.assert_close(v, after_pp[k], atol=PARAM_ATOL, rtol=0, msg=f"a step after resuming: {k}")
    finally:
        one["trainer"].shutdown()


# packed rows of at most 20 tokens, each group's prompt once: 9 sequences of 6 to 12 tokens make 3 or more rows
PACKED: dict[str, Any] = {"budget": 20, "shared_prefix": True}


def test_packed_rows_under_pp2_train_what_one_rank_trains(tiny_llama, refs, reference):
    """trainer.max_tokens_per_micro_batch with the shared prefix under pp=2: padding-free rows (padded at their end
    to the step's longest, attention by spans) train the padded one-rank run's stats and weights, KL term and clip
    included."""
    run = train(tiny_llama, 2, refs, kl_coef=KL, **PACKED)
    try:
        _assert_same_run(run, reference, "pp=2 packed")
    finally:
        run["trainer"].shutdown()


@pytest.mark.slow
def test_pp2_interleaved_trains_what_one_rank_trains(tiny_llama, ray_session, tmp_path_factory, tmp_path):
    """4 layers, 2 ranks x 2 virtual stages (interleaved 1F1B; then zero bubble, padded and packed), and 4 ranks of
    one stage each, against one rank; the one rank's checkpoint loads into the interleaved pipeline (each rank its
    two stages) to the same weights."""
    path = _layers(tiny_llama, tmp_path_factory.mktemp("pp") / "four", 4)
    groups = _synthetic_groups(vocab=_hf_model(path).config.vocab_size)
    refs = [ray_session.put(groups[:2]), ray_session.put(groups[2:])]
    reference = train(path, 1, refs)
    reference["trainer"].save_checkpoint(str(tmp_path))
    manifest.write(tmp_path)
    reference.pop("trainer").shutdown()
    run = train(path, 2, refs, schedule="interleaved", virtual=2)
    try:
        _assert_same_run(run, reference, "pp=2 interleaved v=2")
        run["trainer"].train_step(refs)  # move away from the checkpoint's weights, then back
        run["trainer"].load_checkpoint(str(tmp_path))
        for k, v in run["trainer"].state_dict().items():
            torch.testing.assert_close(v, reference["state"][k], atol=0, rtol=0, msg=f"1 rank -> pp=2: {k}")
    finally:
        run["trainer"].shutdown()
    for packing in ({}, PACKED):
        run = train(path, 2, refs, schedule="zero_bubble", virtual=2, **packing)
        try:
            _assert_same_run(run, reference, f"pp=2 zero bubble v=2 {packing}")
        finally:
            run["trainer"].shutdown()
    run = train(path, 4, refs)  # 4 stages: the middle ones hold neither end of the tied embedding
    try:
        _assert_same_run(run, reference, "pp=4 1f1b")
        # 9 weights a layer; the first adds the embedding, the last the norm and the (tied) embedding again
        assert [len(h) for h in run["trainer"].held_parameters()] == [10, 9, 9, 11]
    finally:
        run["trainer"].shutdown()


@pytest.mark.slow
def test_ppo_pp2_trains_what_one_rank_trains(tiny_llama, refs, tmp_path):
    """PPO (GAE, its critic whole on each pipeline rank) with its KL penalty in the reward (pi_old's and the
    reference's logprobs scored through the stages) and the policy in 2 stages: the same policy stats and
    weights, and the same critic stats and KL, as one rank; its checkpoint (policy stages and critics) restores
    the critic and the next step exactly."""
    reference = train(tiny_llama, 1, refs, algo="gae", kl_coef=KL)
    reference.pop("trainer").shutdown()
    assert reference["stats"][-1]["kl"] > 0  # the reference and the policy parted: the penalty is not 0
    run = train(tiny_llama, 2, refs, algo="gae", kl_coef=KL)
    try:
        _assert_same_run(run, reference, "ppo pp=2")
        for step, (s, r) in enumerate(zip(run["stats"], reference["stats"])):
            for key in ("value_loss", "critic_grad_norm", "explained_variance", "kl"):
                assert s[key] == pytest.approx(r[key], abs=1e-5, rel=1e-5), (step, key)
        trainer = run["trainer"]
        trainer.save_checkpoint(str(tmp_path))
        manifest.write(tmp_path)
        critic, first = trainer.critic_state_dict(), trainer.train_step(refs)
        trainer.load_checkpoint(str(tmp_path))
        for k, v in trainer.critic_state_dict().items():
            assert torch.equal(v, critic[k]), k
        again = trainer.train_step(refs)
        assert (again["loss"], again["grad_norm"], again["value_loss"]) == (
            first["loss"],
            first["grad_norm"],
            first["value_loss"],
        )
    finally:
        run["trainer"].shutdown()
    packed = train(tiny_llama, 2, refs, algo="gae", kl_coef=KL, **PACKED)  # packed rows: the critic's too
    try:
        _assert_same_run(packed, reference, "ppo pp=2 packed")
        for step, (s, r) in enumerate(zip(packed["stats"], reference["stats"])):
            for key in ("value_loss", "explained_variance", "kl"):
                assert s[key] == pytest.approx(r[key], abs=1e-5, rel=1e-5), (step, key)
    finally:
        packed["trainer"].shutdown()


@pytest.mark.slow
def test_dp2_x_pp2_trains_what_one_rank_trains(tiny_llama, refs, reference, tmp_path):
    """4 ranks: 2 data-parallel replicas of a 2-stage pipeline (9 rows: 5 and 4 with a filler; packed: each
    replica's rows balanced by tokens, as many micro-batches on both), GRPO with the KL term, against one rank; each
    replica keeps half of each of its decoder layers and of its end (FSDP2), the final norm whole; the checkpoint
    resumes on one rank to the same weights."""
    for rows in ({}, PACKED):
        run = train(tiny_llama, 2, refs, world_size=4, kl_coef=KL, **rows)
        try:
            _assert_same_run(run, reference, f"dp=2 x pp=2, {rows or 'padded'}")
            whole = {n: p.numel() for n, p in _hf_model(tiny_llama).named_parameters()}
            for held in run["trainer"].held_parameters():  # each replica: half of each weight, the final norm whole
                assert all(2 * k == whole[n] for n, k in held.items() if n != "model.norm.weight"), held
                assert held.get("model.norm.weight", whole["model.norm.weight"]) == whole["model.norm.weight"]
            if rows:
                continue
            run["trainer"].save_checkpoint(str(tmp_path))  # layer shards as DTensors over dp
            manifest.write(tmp_path)
        finally:
            run["trainer"].shutdown()
    _assert_resumes_on_one_rank(tiny_llama, refs, tmp_path, reference["state"], "dp x pp -> 1")


@pytest.mark.slow
def test_two_epochs_under_pp2_train_what_one_rank_trains(tiny_llama, refs):
    """trainer.epochs=2: pi_old comes from a forward-only pass before the first epoch and stays fixed, so the
    second epoch's ratio moves and the clip can act, as on one rank."""
    reference = train(tiny_llama, 1, refs, kl_coef=KL, epochs=2)
    reference.pop("trainer").shutdown()
    assert reference["stats"][0]["ratio_max"] > 1.0  # the second epoch saw a ratio other than 1
    for rows in ({}, PACKED):  # padded, then packed rows (pi_old from a forward-only pass of packed rows)
        run = train(tiny_llama, 2, refs, kl_coef=KL, epochs=2, **rows)
        try:
            _assert_same_run(run, reference, f"pp=2, 2 epochs, {rows or 'padded'}")
        finally:
            run["trainer"].shutdown()


@pytest.mark.slow
def test_entropy_bonus_under_pp2_trains_what_one_rank_trains(tiny_llama, refs, reference):
    """algorithm.entropy_coef on the last stage (the head's entropy with its gradient), with GRPO's KL term:
    the same stats and weights as one rank, and weights other than without the bonus."""
    one = train(tiny_llama, 1, refs, kl_coef=KL, entropy_coef=ENTROPY)
    one.pop("trainer").shutdown()
    moved = max((one["state"][k] - reference["state"][k]).abs().max().item() for k in one["state"])
    assert moved > 10 * PARAM_ATOL  # the bonus changes what is trained
    run = train(tiny_llama, 2, refs, kl_coef=KL, entropy_coef=ENTROPY)
    try:
        _assert_same_run(run, one, "pp=2 with an entropy bonus")
        assert [s["entropy"] for s in run["stats"]] == pytest.approx([s["entropy"] for s in one["stats"]], rel=1e-5)
    finally:
        run["trainer"].shutdown()


@pytest.mark.slow
def test_pp2_x_tp2_trains_what_one_rank_trains(tiny_llama, ray_session, tmp_path_factory, tmp_path):
    """4 ranks on a ("dp", "pp", "tp") mesh of 1 x 2 x 2: each stage's linears split over 2 tp ranks (a model with
    2 KV heads, so both head counts divide), GRPO with the KL term, padded rows (and packed ones on 8 ranks, 2 x 2 x
    2), against one rank; the pp x tp checkpoint (tp-split weights and moments as DTensors) resumes on one rank to
    the same weights; each rank holds only its own stage's weights (the embedding split by vocabulary over tp), and on 8
    ranks (FSDP2 over the tp shards) half of what the rank of the same stage and tp index holds on 4, the final
    norm whole."""
    path = tp_friendly(tiny_llama, tmp_path_factory.mktemp("pp") / "kv2")
    groups = _synthetic_groups(vocab=_hf_model(path).config.vocab_size)
    refs = [ray_session.put(groups[:2]), ray_session.put(groups[2:])]
    reference = train(path, 1, refs, kl_coef=KL)
    reference.pop("trainer").shutdown()
    tp_shards: list[dict[str, int]] = []  # what each of the 4 ranks holds
    for rows, world in (({}, 4), (PACKED, 8)):  # packed: 2 dp replicas too, each keeping half of its tp shards
        run = train(path, 2, refs, world_size=world, tp_size=2, kl_coef=KL, **rows)
        try:
            _assert_same_run(run, reference, f"dp={world // 4} x pp=2 x tp=2, {rows or 'padded'}")
            held = run["trainer"].held_parameters()  # ranks 0, 1: stage 0 (tp ranks 0, 1); ranks 2, 3: stage 1
            assert not any(".layers.1." in n for n in [*held[0], *held[1]])
            assert not any(".layers.0." in n for n in [*held[2], *held[3]])
            vocab_rows = cast(Any, _hf_model(path)).get_input_embeddings().weight.numel() // (world // 4 * 2)
            assert held[0]["model.embed_tokens.weight"] == vocab_rows  # split by vocabulary over tp (and dp)
            if rows:  # rank r and r + 4: the two dp replicas of 4 ranks' rank r, each with half of every weight
                for mine, whole in zip(held, tp_shards + tp_shards):
                    assert mine.keys() == whole.keys()
                    assert all(2 * k == whole[n] or n == "model.norm.weight" for n, k in mine.items()), mine
                    assert mine.get("model.norm.weight") == whole.get("model.norm.weight")
            tp_shards = tp_shards or held
            run["trainer"].save_checkpoint(str(tmp_path / str(world)))
            manifest.write(tmp_path / str(world))
        finally:
            run["trainer"].shutdown()
    for world in (4, 8):  # the 8 ranks' tp shards as 2-D DTensors over ("dp", "tp")
        _assert_resumes_on_one_rank(path, refs, tmp_path / str(world), reference["state"], f"{world} ranks -> 1")


@pytest.mark.slow
def test_four_stages_x_tp2_train_what_one_rank_trains(tiny_llama, ray_session, tmp_path_factory):
    """8 ranks: 4 stages of one layer, each split over 2 tp ranks, GRPO with the KL term, against one rank. The
    middle stages hold neither end of the tied embedding and join its gradient's sum with zeros of their tp index's
    vocabulary rows (``pipeline._tied_zeros``)."""
    path = _layers(tp_friendly(tiny_llama, tmp_path_factory.mktemp("pp") / "kv2"), tmp_path_factory.mktemp("pp"), 4)
    groups = _synthetic_groups(vocab=_hf_model(path).config.vocab_size)
    refs = [ray_session.put(groups[:2]), ray_session.put(groups[2:])]
    reference = train(path, 1, refs, kl_coef=KL)
    reference.pop("trainer").shutdown()
    run = train(path, 4, refs, world_size=8, tp_size=2, kl_coef=KL)
    try:
        _assert_same_run(run, reference, "pp=4 x tp=2")
        held = run["trainer"].held_parameters()  # rank = pp_rank * 2 + tp_rank
        assert not any("embed_tokens" in n for h in held[2:6] for n in h)  # the middle stages
    finally:
        run["trainer"].shutdown()


def test_pp2_zero_bubble_trains_what_one_rank_trains(tiny_llama, refs, reference):
    """torch's interleaved zero-bubble schedule (each backward split into its input and weight halves, the
    weight halves deferred) with one stage a rank: the padded one-rank run's stats and weights, KL and clip."""
    run = train(tiny_llama, 2, refs, kl_coef=KL, schedule="zero_bubble")
    try:
        _assert_same_run(run, reference, "pp=2 zero bubble")
    finally:
        run["trainer"].shutdown()
