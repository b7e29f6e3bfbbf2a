"""``relayrl simulate``: a recipe on a described cluster (``relayrl.plan.scenario``), the cluster file
(``relayrl.plan.specs``), and the cost terms they add (tensor parallelism, sharded sync, colocated hand-over,
memory). Every number is worked by hand on round hardware. Pure Python: no Ray, no engines."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re

import pytest

from relayrl.cli import main
from relayrl.config import Config, load_config
from relayrl.plan import costs as C
from relayrl.plan.cost_model import AnalyticCosts
from relayrl.plan.costs import Cluster, Workload
from relayrl.plan.scenario import (
    CLUSTERS_DIR,
    DEFAULT_PROMPT_LEN,
    candidate_layouts,
    find_cluster,
    rank_layouts,
    report_lines,
    scenario,
    timeline,
    write_outputs,
)
from relayrl.plan.specs import GB, GPUS, MODELS, ClusterSpec, ModelSpec, cluster_spec, load_cluster
from tests.plan.test_simulate import ROUND_HW, ROUND_WL

# F = 1e15 FLOP/s at 50 %, HBM 1e12 B/s fully used, NVLink 1e11 B/s, IB 1e10 B/s, host 1e10 B/s, 80 GB.
HW = dataclasses.replace(
    ROUND_HW, nvlink_bytes_per_s=1e11, ib_bytes_per_s=1e10, allreduce_latency_s=1e-5, host_bytes_per_s=1e10
)
# P = 1e9 (W = 2e9 B), prompt 100, response 1000, B = 8, G = 4, 16 sequences a batch, 10 layers of 1000 hidden.
TP_WL = dataclasses.replace(ROUND_WL, layers=10, hidden=1000)
ROUND_MODEL = ModelSpec(1e9, 10, 1000, 0, 0)  # TP_WL's model; no KV size: the cache never limits the batch
ROUND_RECIPE = ("rollout.max_tokens=1000", "algorithm.group_size=4", "run.prompts_per_step=8")


@functools.cache
def recipe(*overrides: str) -> Config:
    """grpo_arith with overrides, composed once (Hydra's first compose costs a second)."""
    return load_config("grpo_arith", list(overrides))


def round_spec(rollout: int = 2, trainer: int = 2, hw=HW, model=ROUND_MODEL, **kw) -> ClusterSpec:
    """A one-node cluster of round GPUs running ROUND_MODEL with 100-token prompts."""
    return ClusterSpec(Cluster(hw, rollout, trainer, **kw), model, "round", 8, {"prompt_len": 100})


# ---- costs: tensor parallelism, sync, hand-over, memory ------------------------------------------------------


def test_decode_step_with_tp_splits_the_work_and_adds_two_all_reduces_a_layer():
    """b = 16: memory 2e9 / 1e12 = 2 ms beats compute 2e9 · 16 / 5e14 = 64 µs. tp = 2: 2 ms / 2 + 2 · 10 layers
    · (10 µs + 2 · 1/2 · 16 · 1000 · 2 B / 1e11 = 0.32 µs) = 1 ms + 206.4 µs. tp = 4: 0.5 ms + 20 · (10 µs +
    1.5 · 32000 / 1e11 = 0.48 µs) = 0.5 ms + 209.6 µs. tp = 1: no all-reduce."""
    assert C.tp_comm_s(HW, TP_WL, 16, 1) == 0.0
    assert C.decode_step_s(HW, TP_WL, 16, 1) == pytest.approx(2e-3)
    assert C.tp_comm_s(HW, TP_WL, 16, 2) == pytest.approx(2.064e-4)
    assert C.decode_step_s(HW, TP_WL, 16, 2) == pytest.approx(1e-3 + 2.064e-4)
    assert C.decode_step_s(HW, TP_WL, 16, 4) == pytest.approx(5e-4 + 2.096e-4)


def test_prefill_and_generate_with_tp():
    """8 groups x 100 prompt tokens: 2 · 1e9 · 800 / 5e14 = 3.2 ms, / tp = 1.6 ms at tp 2; then 32 sequences,
    16 a batch: 2 waves of 1000 steps at 1.2064 ms."""
    assert C.prefill_s(HW, TP_WL, 8, tp=2) == pytest.approx(1.6e-3)
    assert C.generate_s(HW, TP_WL, 8, tp=2) == pytest.approx(1.6e-3 + 2 * 1000 * 1.2064e-3)


def test_sync_rank0_vs_sharded_on_nvlink_and_ib():
    """W = 2e9 B. 4 + 4 devices fit a node of 8: NVLink 1e11, rank0 20 ms; sharded ways = min(t 4, tp 2) = 2:
    10 ms; t = 2 < tp = 4: ways 2 again. 8 + 8 devices span two nodes: IB 1e10, rank0 0.2 s, sharded
    min(8, 4) = 4 ways: 50 ms."""
    assert C.sync_s(Cluster(HW, 4, 4, rollout_tp=2), TP_WL) == pytest.approx(0.02)
    assert C.sync_s(Cluster(HW, 4, 4, rollout_tp=2, sync="sharded"), TP_WL) == pytest.approx(0.01)
    assert C.sync_s(Cluster(HW, 4, 2, rollout_tp=4, sync="sharded"), TP_WL) == pytest.approx(0.01)
    assert C.sync_s(Cluster(HW, 8, 8, rollout_tp=4), TP_WL) == pytest.approx(0.2)
    assert C.sync_s(Cluster(HW, 8, 8, rollout_tp=4, sync="sharded"), TP_WL) == pytest.approx(0.05)


def test_switch_offloads_the_engines_weights_and_the_trainers_shards():
    """Colocated, tp 2, t = 4: (2e9 / 2 + 16 · 1e9 / 4) / 1e10 B/s = (1e9 + 4e9) / 1e10 = 0.5 s; a given
    ``Cluster.switch_s`` wins; separate placement never hands over."""
    colocated = Cluster(HW, 4, 4, "colocated", rollout_tp=2)
    assert C.switch_s(colocated, TP_WL) == pytest.approx(0.5)
    assert AnalyticCosts(colocated, TP_WL).switch_s() == pytest.approx(0.5)
    assert C.switch_s(dataclasses.replace(colocated, switch_s=0.3), TP_WL) == 0.3
    assert AnalyticCosts(Cluster(HW, 4, 4, rollout_tp=2), TP_WL).switch_s() == 0.0


def test_memory_per_device_by_hand():
    """kv 1e5 B a token, context 100 + 1000: rollout (2e9 + 1100 · 1e5) / tp 2 = 1.055e9; trainer 16e9 / 4
    + activations 1100 · 1000 · (2 · 10 + 34) = 4e9 + 5.94e7; colocated: the larger."""
    wl = dataclasses.replace(TP_WL, kv_bytes_per_token=1e5)
    separate = C.memory_per_device(Cluster(HW, 4, 4, rollout_tp=2), wl)
    assert separate == pytest.approx({"rollout": 1.055e9, "trainer": 4.0594e9})
    colocated = C.memory_per_device(Cluster(HW, 4, 4, "colocated", rollout_tp=2), wl)
    assert colocated == pytest.approx({"rollout": 1.055e9, "trainer": 4.0594e9, "colocated": 4.0594e9})


def test_the_trainer_side_counts_checkpointing_and_the_heads_chunk_by_hand():
    """Context 1100, 10 layers of 1000 hidden, V = 50000, chunk 1024. Checkpointed: 1100 · (2 · 10 · 1000 +
    34 · 1000) = 5.94e7 B; not: 1100 · 10 · 34000 = 3.74e8. The head: 12 · 50000 · min(1024, 1100) = 6.144e8;
    a chunk past the context scores the context (12 · 50000 · 1100 = 6.6e8). Trainer: 16e9 / 4 + both."""
    wl = dataclasses.replace(TP_WL, vocab=50_000, logits_chunk=1024)
    assert C.activation_bytes(wl, 1100) == pytest.approx(5.94e7)
    bare = dataclasses.replace(wl, activation_checkpointing=False)
    assert C.activation_bytes(bare, 1100) == pytest.approx(3.74e8)
    assert C.logits_bytes(wl, 1100) == pytest.approx(6.144e8)
    assert C.logits_bytes(dataclasses.replace(wl, logits_chunk=4096), 1100) == pytest.approx(6.6e8)
    trainer = C.memory_per_device(Cluster(HW, 4, 4), bare)["trainer"]
    assert trainer == pytest.approx(4e9 + 3.74e8 + 6.144e8)


def test_auto_checkpointing_turns_on_where_the_trainer_would():
    """The trainer's rule (AUTO_SHARE = 0.25 of 80e9 = 2e10 B): Llama-3-8B at 1100 tokens keeps 1100 · 32 ·
    34 · 4096 = 4.9e9 B without checkpointing (off); at 8192 + 256 tokens, 3.77e10 B (on). off and full
    are taken as given, whatever the length; the recipe's head chunk reaches the workload."""
    from relayrl.plan.scenario import checkpointing

    short = scenario(recipe("rollout.max_tokens=844"), cluster_spec({})).workload
    long = scenario(recipe("rollout.max_tokens=8192"), cluster_spec({})).workload
    assert (short.activation_checkpointing, long.activation_checkpointing) == (False, True)
    assert (long.vocab, long.logits_chunk) == (128256, 1024)
    assert checkpointing("off", long, 80e9) is False and checkpointing("full", short, 80e9) is True
    assert checkpointing("2", short, 80e9) is True
    off = scenario(recipe("rollout.max_tokens=8192", "trainer.activation_checkpointing=off"), cluster_spec({}))
    assert off.workload.activation_checkpointing is False


def test_a_70b_model_does_not_train_on_one_80gb_device():
    """P = 70e9: the engines at tp 2 hold 140e9 / 2 = 70e9 B < 0.9 · 80e9 = 72e9 (fit); one trainer device
    needs 16 · 70e9 = 1.12e12 B = 1043 GiB > 67 GiB. Colocated on 16 devices the trainer needs 70e9 (fits);
    on 8 it needs 140e9, and the message names the side."""
    wl = Workload(70e9, 100, 1000, 8, 4)
    assert C.memory_fits(Cluster(HW, 2, 1, rollout_tp=2), wl) == (False, "trainer needs 1043 GiB a device > 67 GiB")
    assert C.memory_fits(Cluster(HW, 16, 16, "colocated", rollout_tp=8), wl) == (True, "")
    fits, why = C.memory_fits(Cluster(HW, 8, 8, "colocated", rollout_tp=8), wl)
    assert not fits and why.startswith("trainer needs 130 GiB")


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"rollout_devices": 4, "rollout_tp": 3}, "rollout_tp=3"),  # 3 does not divide 4
        ({"rollout_devices": 16, "rollout_tp": 16}, "gpus_per_node=8"),  # a replica sits in one node
        ({"sync": "nccl"}, "rank0 | sharded"),
    ],
)
def test_cluster_rejects_impossible_tp_and_unknown_sync(kw, match):
    """A replica's tp devices sit in one node and tile the rollout devices; sync is rank0 or sharded."""
    with pytest.raises(ValueError, match=re.escape(match)):
        Cluster(HW, **kw)


# ---- the cluster file ---------------------------------------------------------------------------------------


def test_cluster_spec_defaults_split_the_gpus_in_half():
    """Nothing given: one H100 node of 8, 4 generate and 4 train, tp 1, rank0 sync, Llama-3-8B; an odd total
    gives the trainer the extra GPU; colocated gives both sides every GPU."""
    spec = cluster_spec({})
    cl = spec.cluster
    assert (spec.gpus, cl.rollout_devices, cl.trainer_devices, cl.rollout_tp) == (8, 4, 4, 1)
    assert (cl.placement, cl.sync, cl.hardware, spec.model_name, spec.workload) == (
        "separate",
        "rank0",
        GPUS["h100-sxm"],
        "llama3-8b",
        {},
    )
    odd = cluster_spec({"gpus_per_node": 5}).cluster
    assert (odd.rollout_devices, odd.trainer_devices) == (2, 3)
    colocated = cluster_spec({"nodes": 2, "placement": "colocated"})
    assert (colocated.gpus, colocated.cluster.rollout_devices, colocated.cluster.trainer_devices) == (16, 16, 16)


def test_efficiency_and_links_override_the_datasheet():
    """Efficiencies replace Hardware fields; links are GB/s (1e9 B/s): 100 GB/s NVLink, 25 GB/s IB."""
    hw = cluster_spec({"efficiency": {"mfu": 0.3}, "links": {"nvlink_gb_s": 100, "ib_gb_s": 25}}).cluster.hardware
    assert (hw.mfu, hw.peak_flops) == (0.3, GPUS["h100-sxm"].peak_flops)
    assert (hw.nvlink_bytes_per_s, hw.ib_bytes_per_s) == (pytest.approx(100 * GB), pytest.approx(25e9))
    custom = cluster_spec({"gpu": {"name": "round", "peak_flops": 1e15}}).cluster.hardware
    assert (custom.name, custom.peak_flops) == ("round", 1e15)


def test_model_by_name_and_by_mapping():
    """KV bytes a token = 2 (K, V) · layers · kv_heads · head_dim · 2 B: Llama-3-8B 2 · 32 · 8 · 128 · 2 =
    131072; a mapping of 10 layers, 2 KV heads of 64: 2 · 10 · 2 · 64 · 2 = 5120."""
    assert MODELS["llama3-8b"].kv_bytes_per_token == 131072
    spec = cluster_spec({"model": "qwen2.5-7b"})
    assert (spec.model_name, spec.model) == ("qwen2.5-7b", MODELS["qwen2.5-7b"])
    custom = cluster_spec({"model": {"params": 1e9, "layers": 10, "hidden": 1000, "kv_heads": 2, "head_dim": 64}})
    assert (custom.model_name, custom.model.kv_bytes_per_token) == ("custom", 5120)


@pytest.mark.parametrize(
    "data, match",
    [
        ({"gpus": 8}, "unknown key(s) gpus; valid: gpu, nodes"),
        ({"model": "gpt-5"}, "model='gpt-5' is not in the table; choose one of llama3-8b"),
        ({"model": {"params": 1e9, "depth": 2}}, "model has depth; valid"),
        ({"rollout_gpus": 6, "trainer_gpus": 4}, "need 10 GPUs, the cluster has 1 x 8 = 8"),
        ({"links": {"pcie_gb_s": 1}}, "links has pcie_gb_s; valid: nvlink_gb_s, ib_gb_s"),
        ({"efficiency": {"speed": 2}}, "efficiency has speed"),
        ({"rollout_tp": 3}, "rollout_tp=3"),
        ({"sync": "nccl"}, "rank0 | sharded"),
    ],
)
def test_a_bad_cluster_file_is_a_value_error_naming_the_choices(data, match):
    """Every mistake in a cluster file is one ValueError that names the key and what is valid."""
    with pytest.raises(ValueError, match=re.escape(match)):
        cluster_spec(data)


def test_an_unknown_gpu_lists_every_known_one():
    """The message lists the whole GPU table, so the user can pick one."""
    with pytest.raises(ValueError, match="gpu='h300'") as info:
        cluster_spec({"gpu": "h300"})
    assert all(name in str(info.value) for name in GPUS)


def test_load_cluster_reads_yaml(tmp_path):
    """A file parses as its mapping does; an empty file is the defaults; a list is an error."""
    path = tmp_path / "c.yaml"
    path.write_text("gpu: h200\nnodes: 2\nrollout_gpus: 4\ntrainer_gpus: 12\nrollout_tp: 4\nsync: sharded\n")
    spec = load_cluster(path)
    cl = spec.cluster
    assert (cl.hardware.name, spec.gpus, cl.rollout_devices, cl.trainer_devices, spec.replicas) == (
        "h200",
        16,
        4,
        12,
        1,
    )
    assert cl.sync == "sharded"
    path.write_text("")
    assert load_cluster(path) == cluster_spec({})
    path.write_text("- gpu\n")
    with pytest.raises(ValueError, match="a YAML mapping"):
        load_cluster(path)


@pytest.mark.parametrize("path", sorted(CLUSTERS_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_cluster_loads_and_is_found_by_name(path):
    """A file in relayrl/plan/clusters/ parses, and ``--cluster <stem>`` finds it."""
    spec = load_cluster(path)
    assert find_cluster(path.stem) == spec and spec.replicas >= 1


def test_the_shipped_h100_2x8_is_two_nodes_split_8_8():
    """The README's example cluster says what its comment says: 2 x 8 H100, 8 generate, 8 train."""
    spec = find_cluster("h100-2x8")
    assert (spec.gpus, spec.cluster.rollout_devices, spec.cluster.trainer_devices) == (16, 8, 8)
    assert (spec.model_name, spec.workload) == ("llama3-8b", {"prompt_len": 256})


# ---- the scenario -------------------------------------------------------------------------------------------


def test_the_policy_is_the_recipes_on_the_clusters_replicas():
    """8 rollout GPUs at tp 2 are 4 replicas; B = 16 gives chunks of 4; mode=async k=2 is k = 2."""
    cfg = recipe("mode=async", "buffer.max_staleness=2", "run.prompts_per_step=16")
    sc = scenario(cfg, cluster_spec({"nodes": 2, "rollout_gpus": 8, "trainer_gpus": 8, "rollout_tp": 2}))
    pc = sc.pc
    assert (pc.max_staleness, pc.replicas, pc.chunk, pc.colocated, pc.stream) == (2, 4, 4, False, False)
    assert sc.steps == cfg.run.steps == 25


def test_placement_comes_from_the_cluster_file_not_the_recipe():
    """The cluster file decides colocated or separate, whatever the recipe's placement says."""
    separate_recipe, colocated_recipe = recipe("run.prompts_per_step=8"), recipe("placement=colocated")
    assert scenario(separate_recipe, cluster_spec({"placement": "colocated"})).pc.colocated
    assert not scenario(colocated_recipe, cluster_spec({})).pc.colocated


def test_streaming_slots_and_engine_batch_from_in_flight():
    """in_flight 32 sequences of G = 8 is 4 groups; slots = 2 · 4 = 8 one-group chunks; the engine batch is 32.
    Streaming needs no B / replicas: B = 4 runs on 3 replicas."""
    sc = scenario(recipe("rollout.stream=true", "rollout.in_flight=32"), cluster_spec({"rollout_gpus": 3}))
    assert (sc.pc.stream, sc.pc.chunk, sc.pc.slots, sc.pc.replicas) == (True, 1, 8, 3)
    assert sc.workload.max_num_seqs == 32


def test_workload_from_the_recipe_and_the_cluster_file():
    """B, G and response_len from the recipe, the model's shapes from the file, a reference forward with a KL
    term, and the file's workload mapping over all of it."""
    wl = scenario(recipe("rollout.max_tokens=512", "algorithm.kl_coef=0.1"), cluster_spec({})).workload
    assert (wl.prompts_per_step, wl.group_size, wl.response_len, wl.response_max) == (4, 8, 512, 512)
    assert (wl.prompt_len, wl.extra_forwards) == (DEFAULT_PROMPT_LEN, 1)
    assert (wl.params, wl.kv_bytes_per_token, wl.layers, wl.hidden) == (8.03e9, 131072, 32, 4096)
    given = scenario(recipe(), cluster_spec({"workload": {"prompt_len": 1000, "response_cv": 0.5}})).workload
    assert (given.prompt_len, given.response_cv, given.extra_forwards) == (1000, 0.5, 0)


def test_a_bad_workload_key_or_an_uneven_batch_is_a_value_error():
    """An unknown workload field, and B = 6 over 4 replicas, fail before simulating; the second names the
    fix."""
    with pytest.raises(ValueError, match="cluster workload has foo"):
        scenario(recipe(), cluster_spec({"workload": {"foo": 1}}))
    with pytest.raises(ValueError, match=r"prompts_per_step=6 .* 4 rollout replicas.*rollout\.stream=true"):
        scenario(recipe("run.prompts_per_step=6"), cluster_spec({}))


def test_a_sync_step_is_generate_plus_train_plus_sync():
    """4 rollout GPUs at tp 2 (2 replicas, 4 groups = 16 sequences each), 2 trainers. generate: 3.2 ms · 4/8 / 2
    = 0.8 ms prefill + 1000 steps at 1.2064 ms = 1.2072 s; train: 6 · 1e9 · 8 · (100 + 4 · 1000) / (5e14 · 2)
    = 0.1968 s; sync: 2e9 / 1e11 (one node) = 0.02 s. Step: 1.424 s, every one."""
    sc = scenario(recipe(*ROUND_RECIPE), round_spec(4, 2, rollout_tp=2))
    cl, wl = sc.cluster, sc.workload
    terms = C.generate_s(HW, wl, 4, tp=2) + C.train_s(cl, wl) + C.sync_s(cl, wl)
    assert terms == pytest.approx(1.2072 + 0.1968 + 0.02)
    assert all(math.isclose(s.step_s, terms) for s in sc.run(3).steps)


@pytest.mark.parametrize(
    "mfu, step_s",
    [
        (0.005, 19.68 + 0.02),  # train 0.1968 · 100 = 19.68 s > generate 2.0016 s: train + sync
        (0.5, 2.0016 + 0.02),  # generate 1.6 ms + 1000 · 2 ms > train 0.1968 s: generate + the sync's pause
    ],
)
def test_an_async_k1_step_is_the_slower_side_plus_sync(mfu, step_s):
    """Separate 2:2, tp 1, k = 1: in steady state a step is max(generate, train) + sync."""
    spec = round_spec(2, 2, hw=dataclasses.replace(HW, mfu=mfu))
    sc = scenario(recipe(*ROUND_RECIPE, "mode=async", "buffer.max_staleness=1"), spec)
    cl, wl = sc.cluster, sc.workload
    assert max(C.generate_s(HW, wl, 4), C.train_s(cl, wl)) + C.sync_s(cl, wl) == pytest.approx(step_s)
    assert all(math.isclose(s.step_s, step_s) for s in sc.run(6).steps[2:])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_timeline_rows_add_up_to_the_step(mode):
    """Each pool's busy and idle seconds fill the step; a sync step's row is 1.2072 s generate, 0.1968 s
    train, 0.02 s sync (the 1.424 s step above)."""
    sc = scenario(recipe(*ROUND_RECIPE, f"mode={mode}"), round_spec(4, 2, rollout_tp=2))
    rows = timeline(sc.run(4))
    assert len(rows) == 4
    for r in rows:
        assert math.isclose(r["generate_s"] + r["idle_rollout_s"], r["step_s"])
        assert math.isclose(r["train_s"] + r["sync_s"] + r["idle_trainer_s"], r["step_s"])
    if mode == "sync":
        assert [rows[1][k] for k in ("generate_s", "train_s", "sync_s")] == pytest.approx([1.2072, 0.1968, 0.02])


def test_a_colocated_step_hands_over_twice():
    """Colocated 2 GPUs, tp 1: switch (2e9 + 16e9 / 2) / 1e10 = 1 s each way, so a step is 2.0016 generate +
    1 + 0.1968 train + 1 + 0.02 sync = 4.2184 s, and the trainer's row counts both switches."""
    sc = scenario(recipe(*ROUND_RECIPE), round_spec(2, 2, placement="colocated"))
    rows = timeline(sc.run(3))
    assert all(math.isclose(r["step_s"], 4.2184) for r in rows)
    assert all(math.isclose(r["switch_s"], 2.0) for r in rows)
    assert all(math.isclose(r["train_s"] + r["sync_s"] + r["switch_s"] + r["idle_trainer_s"], 4.2184) for r in rows)


def test_report_names_the_memory_and_says_when_it_does_not_fit():
    """Llama-3-8B's 16e9 B of weights on a 1 GB device: the rollout side does not fit."""
    sc = scenario(recipe(), cluster_spec({}))
    lines = report_lines(sc, sc.run(2), "h100")
    assert any(line.startswith("memory a device: rollout 15.0 GiB") for line in lines)
    assert not any("DOES NOT FIT" in line for line in lines)
    small = scenario(recipe(), cluster_spec({"gpu": {"name": "tiny", "memory_bytes": 1e9}}))
    text = "\n".join(report_lines(small, small.run(2), "tiny"))
    assert "DOES NOT FIT: rollout needs 15 GiB a device > 1 GiB" in text


def test_write_outputs_writes_the_timeline_json_and_a_png(tmp_path):
    """timeline.json is valid JSON with steps, spans, throughput and staleness (3 sync steps of 8 groups: 24
    groups 0 versions old); gantt.png is a PNG."""
    sc = scenario(recipe(*ROUND_RECIPE), round_spec())
    result = sc.run(3)
    json_path, png_path = write_outputs(sc, result, tmp_path / "out")
    data = json.loads(json_path.read_text())
    assert len(data["steps"]) == 3 and data["spans"] and data["staleness"] == {"0": 24}
    assert data["throughput"]["groups_per_s"] == pytest.approx(24 / result.wall_s)
    assert png_path.read_bytes()[:4] == b"\x89PNG"


# ---- the planner --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [{}, {"nodes": 2}, {"gpus_per_node": 4}, {"gpus_per_node": 6, "nodes": 2}])
def test_candidate_layouts_stay_inside_the_cluster(data):
    """No layout needs more GPUs than the cluster has (separate: the sum; colocated: every GPU), every tp fits a
    node and divides its rollout GPUs, and each one is a valid Cluster."""
    spec = cluster_spec(data)
    layouts = candidate_layouts(spec, (1, 2))
    assert layouts
    for changes, _mode, _k in layouts:
        r, t, tp = changes["rollout_devices"], changes["trainer_devices"], changes["rollout_tp"]
        assert (r + t if changes["placement"] == "separate" else max(r, t)) <= spec.gpus
        assert r % tp == 0 and tp <= spec.cluster.gpus_per_node
        dataclasses.replace(spec.cluster, **changes)  # __post_init__ validates


def test_rank_lists_fitting_layouts_fastest_first_then_the_rest_with_why():
    """P = 10e9 trains in 16 · 10e9 / t B a device: t = 2 needs 80e9 > 72e9 (6:2 does not fit); t >= 3 fits."""
    spec = round_spec(4, 4, model=ModelSpec(10e9, 10, 1000, 0, 0))
    ranked = rank_layouts(recipe(*ROUND_RECIPE, "run.prompts_per_step=24"), spec, steps=4)
    fits = [r.fits for r in ranked]
    assert True in fits and False in fits and fits == sorted(fits, reverse=True)
    speeds = [r.tokens_per_s for r in ranked if r.fits]
    assert speeds == sorted(speeds, reverse=True)
    bad = [r for r in ranked if not r.fits]
    assert all(r.overrides["trainer_devices"] == 2 and r.why.startswith("trainer needs") for r in bad)


def test_async_beats_sync_when_training_dominates():
    """mfu 0.005 on 4:4, tp 1 (4 replicas of 2 groups = 8 sequences): generate 0.8 ms + 1000 · 2 ms = 2.0008 s,
    train 6 · 1e9 · 32800 / (1e15 · 0.005 · 4) = 9.84 s, sync 0.02 s. Sync: 11.8608 s a step; async k = 1:
    9.86 s. For every separate split async is faster."""
    spec = round_spec(4, 4, hw=dataclasses.replace(HW, mfu=0.005))
    ranked = rank_layouts(recipe(*ROUND_RECIPE), spec, steps=6)
    by = {(r.label.split()[1], r.label.split()[2], r.overrides["mode"]): r for r in ranked if "separate" in r.label}
    assert by[("4:4", "tp1", "sync")].step_s == pytest.approx(2.0008 + 9.84 + 0.02)
    assert by[("4:4", "tp1", "async")].step_s == pytest.approx(9.84 + 0.02)
    for (split, tp, mode), r in by.items():
        if mode == "sync":
            assert by[(split, tp, "async")].tokens_per_s > r.tokens_per_s, (split, tp)


# ---- the CLI ------------------------------------------------------------------------------------------------


def test_cli_simulate_prints_the_timeline_and_writes_both_files(tmp_path, capsys):
    """``relayrl simulate`` exits 0, prints one timeline row per step, and writes (and names) both files."""
    argv = ["simulate", "--cluster", "h100-2x8", "run.prompts_per_step=64", "run.steps=3", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    header = next(i for i, line in enumerate(out.splitlines()) if line.split()[:2] == ["step", "step_s"])
    assert [line.split()[0] for line in out.splitlines()[header + 1 : header + 4]] == ["1", "2", "3"]
    assert (tmp_path / "timeline.json").is_file() and (tmp_path / "gantt.png").is_file()
    assert str(tmp_path / "gantt.png") in out


def test_cli_simulate_an_unknown_cluster_names_the_shipped_ones(capsys):
    """A missing cluster exits 2 with one line naming the shipped clusters."""
    assert main(["simulate", "--cluster", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--cluster nope" in err and "h100-2x8" in err


def test_cli_rank_prints_a_table_led_by_a_fitting_layout(tmp_path, capsys):
    """``--rank`` on a 4-GPU cluster file: a table of layouts whose first (fastest) row fits in memory."""
    path = tmp_path / "four.yaml"
    path.write_text("gpus_per_node: 4\n")
    assert main(["simulate", "--cluster", str(path), "--rank"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["layout", "step_s"] and lines[1].endswith("ok")
