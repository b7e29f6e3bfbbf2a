"""The planner's model against hand-worked numbers, its CLI, and one prediction checked against a real run."""

from __future__ import annotations

import dataclasses
import json

import pytest

from relayrl.plan import Layout, Profile, layouts, overrides, predict, rank

# Tg(r) = 0.2 + 0.02 * 100 / r;  Tt(t) = 0.5 + 0.03 * 100 / (t * e(t)), e = 0.9 beyond one rank;
# Ts = 0.1 + 1e9 / 2e9 = 0.6;  Tr = 0.1;  stall 0.3;  O = 0.2;  switch 0.25 (x2 per colocated step)
P = Profile(
    tokens=100,
    completions=10,
    prompts_per_step=4,
    gen_dev_s_per_token=0.02,
    train_dev_s_per_token=0.03,
    gen_call_s=0.2,
    reward_s=0.1,
    train_fixed_s=0.5,
    sync_bytes=1e9,
    sync_bytes_per_s=2e9,
    sync_fixed_s=0.1,
    stall_s=0.3,
    overhead_s=0.2,
    switch_s=0.25,
    train_efficiency=0.9,
)


def test_phase_laws_by_hand():
    assert P.gen_s(1) == pytest.approx(2.2) and P.gen_s(2) == pytest.approx(1.2) and P.gen_s(4) == pytest.approx(0.7)
    assert P.train_s(1) == pytest.approx(3.5)  # one rank: no efficiency loss
    assert P.train_s(2) == pytest.approx(0.5 + 3 / 1.8)  # 2.1667
    assert P.sync_s() == pytest.approx(0.6)


def test_separate_sync_is_the_sum_of_phases():
    p = predict(P, Layout("separate", 1, 1, "sync"))
    assert p.step_s == pytest.approx(2.2 + 0.1 + 3.5 + 0.6 + 0.2)  # 6.6
    assert p.completions_per_s == pytest.approx(10 / 6.6) and p.tokens_per_s == pytest.approx(100 / 6.6)
    assert p.bottleneck == "train"
    assert p.idle_rollout == pytest.approx(1 - 2.3 / 6.6) and p.idle_trainer == pytest.approx(1 - 4.1 / 6.6)


def test_async_is_the_slower_path_plus_overhead():
    p = predict(P, Layout("separate", 1, 1, "async", 1))
    assert p.step_s == pytest.approx(max(2.2 + 0.1 + 0.3, 3.5 + 0.6) + 0.2)  # 4.3, trainer-bound
    assert p.bottleneck == "train" and p.idle_trainer == pytest.approx(1 - 4.1 / 4.3)
    gen_bound = predict(P, Layout("separate", 1, 3, "async", 1))  # Tt(3) = 0.5 + 3/2.7 = 1.611
    assert gen_bound.step_s == pytest.approx(2.6 + 0.2) and gen_bound.bottleneck == "generate"
    slowed = Profile(**{**P.to_dict(), "overlap_slowdown": 1.5})  # compute 1.5x slower while overlapping
    assert predict(slowed, Layout("separate", 1, 1, "async", 1)).step_s == pytest.approx(
        max(1.5 * 2.2 + 0.1 + 0.3, 0.5 + 1.5 * 3.0 + 0.6) + 0.2
    )  # 5.8
    assert predict(slowed, Layout("separate", 1, 1, "sync")).step_s == pytest.approx(6.6)  # no overlap, no slowdown
    cpu = Profile(**{**P.to_dict(), "cpu": True})  # cores: s = (2r + t) / (r + t), 1.5 for 1:1, 1.25 for 1:3
    assert predict(cpu, Layout("separate", 1, 1, "async", 1)).step_s == pytest.approx(5.8)
    assert predict(cpu, Layout("separate", 1, 3, "async", 1)).step_s == pytest.approx(
        max(1.25 * 2.2 + 0.1 + 0.3, 0.5 + 1.25 * 3 / 2.7 + 0.6) + 0.2
    )  # 3.35, generation-bound
    k0 = predict(P, Layout("separate", 1, 1, "async", 0))  # k = 0 cannot overlap
    assert k0.step_s == pytest.approx(6.6)


def test_colocated_serializes_on_all_devices_with_two_switches():
    p = predict(P, Layout("colocated", 2, 2, "sync"))
    assert p.step_s == pytest.approx(1.2 + 0.1 + (0.5 + 3 / 1.8) + 0.6 + 2 * 0.25 + 0.2)  # 4.7667


def test_rank_enumerates_splits_and_sorts_them():
    """Ranked by the simulator fed P's costs: the sync layouts and the trainer-bound 2:2 async are the laws'
    figures; the generation-bound 1:3 async is Tg(1) 2.2 + the sync freezing the call 0.6 + Tr 0.1 = 2.9 (the
    laws: 2.2 + 0.1 + stall 0.3 + O 0.2 = 2.8; the simulator runs the driver's O beside the next call)."""
    preds = rank(P, 4)
    got = [(p.layout.placement, p.layout.split(), p.layout.mode, round(p.step_s, 4)) for p in preds]
    assert got == [
        ("separate", "1:3", "async", 2.9),
        ("separate", "2:2", "async", 2.9667),
        ("colocated", "4:4", "sync", 3.4333),
        ("separate", "2:2", "sync", 4.2667),
        ("separate", "1:3", "sync", 4.7111),
    ]  # 3:1 is left out: 3 does not divide 4 prompts
    assert Layout("separate", 3, 1) not in layouts(4, 4)
    assert len(layouts(4, 4, ks=(1, 2))) == 7


def test_overrides_name_the_layout():
    lay = Layout("separate", 3, 1, "async", 1)
    assert overrides(lay) == [
        "placement=separate",
        "rollout.num_replicas=3",
        "trainer.world_size=1",
        "mode=async",
        "buffer.max_staleness=1",
    ]
    assert overrides(Layout("colocated", 2, 2), cpu=True)[-1] == "trainer.num_threads=1"


def test_bad_input_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        Profile.from_run(tmp_path)
    with pytest.raises(ValueError, match="unknown profile field"):
        Profile.from_dict({"tokens": 1, "tokenz": 2})
    with pytest.raises(ValueError, match="devices=0"):
        rank(P, 0)
    three = rank(Profile(**{**P.to_dict(), "prompts_per_step": 3}), 2)  # 2 replicas can't share 3 prompts
    assert [p.layout.placement for p in three] == ["separate", "separate"]


def fake_run(
    path,
    replicas=2,
    world_size=2,
    threads=1,
    mode="sync",
    gen=(1.0, 1.2, 0.9),
    tokens=200.0,
    placement="separate",
    trainer_threads=None,
    update=0.6,
    sync=0.3,
    prompts=4,
):
    """A run dir whose steps after the warm-up have medians: gen 1.0, reward 0.1, train 0.8 (update 0.6 +
    logprob 0.1 + 0.1 fixed), sync 0.3 (1e8 bytes at 0.5 GB/s = 0.2 + 0.1 fixed), stall 0.05, step 2.3 ->
    O = 0.1. ``trainer_threads``: the ranks' threads when not ``threads``."""
    path.mkdir(parents=True)
    rank_threads = threads if trainer_threads is None else trainer_threads
    (path / "config.yaml").write_text(
        f"mode: {mode}\nbuffer: {{max_staleness: 1}}\nrun: {{prompts_per_step: {prompts}}}\n"
        f"placement: {{mode: {placement}}}\nrollout: {{num_replicas: {replicas}, num_threads: {threads}}}\n"
        f"trainer: {{world_size: {world_size}, num_threads: {rank_threads}}}\n"
    )
    warm = {
        "timing/generate": 9.0,
        "timing/train": 9.0,
        "timing/update": 9.0,
        "timing/sync": 9.0,
        "timing/step": 40.0,
        "rollout/tokens": tokens,
    }
    rows = [warm] + [
        {
            "timing/generate": g,
            "timing/reward": 0.1,
            "timing/train": update + 0.2,
            "timing/update": update,
            "timing/logprob": 0.1,
            "timing/sync": sync,
            "weightsync/bytes": 1e8,
            "weightsync/gbps": 0.5,
            "weightsync/stall_s": 0.05,
            "timing/step": s,
            "rollout/tokens": tokens,
            "rollout/completions": 16.0,
        }
        for g, s in zip(gen, (2.3, 2.5, 2.2))
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_profile_from_run_by_hand(tmp_path):
    p = Profile.from_run(fake_run(tmp_path / "a"))
    assert p.gen_dev_s_per_token == pytest.approx(1.0 * 2 / 200)  # median Tg x replicas / tokens
    assert p.train_dev_s_per_token == pytest.approx(0.7 * 2 * 0.9 / 200)  # (update + logprob) x t x e / tokens
    assert (p.train_fixed_s, p.reward_s, p.sync_bytes_per_s) == pytest.approx((0.1, 0.1, 5e8))
    assert (p.sync_fixed_s, p.stall_s, p.overhead_s, p.gen_call_s) == pytest.approx((0.1, 0.05, 0.1, 0.0))
    assert predict(p, Layout("separate", 2, 2)).step_s == pytest.approx(2.3)  # reproduces its own median step
    cpu = Profile.from_run(fake_run(tmp_path / "b", threads=0), cores=2)  # 0 threads = both cores
    assert cpu.gen_dev_s_per_token == pytest.approx(1.0 * 4 * 0.8 / 200)  # 2 x 2 threads, g = 0.8


def test_a_shared_run_and_a_one_thread_run_give_the_same_device_costs(tmp_path):
    # The CPU default (one replica, one rank, num_threads=0 on 2 cores) counts 2 devices a side:
    # gen_dev = Tg x 2 x g / tokens = 1.0 x 2 x 0.8 / 200 = 0.008; train_dev = 0.7 x 2 x e / 200 = 0.0063.
    shared = Profile.from_run(fake_run(tmp_path / "s", replicas=1, world_size=1, threads=0), cores=2)
    assert shared.gen_dev_s_per_token == pytest.approx(0.008)
    assert shared.train_dev_s_per_token == pytest.approx(0.0063)
    assert predict(shared, Layout("shared", 2, 2)).step_s == pytest.approx(2.3)  # its own median step
    # The same work on one thread a side: Tg(1) = 0.008 x 200 = 1.6 s, update 1.16 + logprob 0.1 =
    # 0.0063 x 200 = 1.26 s (train 1.26 + 0.1 fixed = 1.36 s): the same per-device costs come out.
    one = fake_run(tmp_path / "o", replicas=1, world_size=1, threads=1, gen=(1.6, 1.6, 1.6))
    rows = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    for row in rows[1:]:
        row.update({"timing/update": 1.26 - 0.1, "timing/train": 1.36})
    (one / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    single = Profile.from_run(one, cores=2)
    assert single.gen_dev_s_per_token == pytest.approx(0.008)
    assert single.train_dev_s_per_token == pytest.approx(0.0063)


# P on CPU cores: the shared layout, one replica and one rank on all N cores, g = 0.8 and e = 0.9.
PC = Profile(**{**P.to_dict(), "cpu": True})


def test_shared_layout_by_hand():
    # Tg = 0.2 + 0.02 * 100 / (2 * 0.8) = 1.45;  Tt(2) = 0.5 + 3 / 1.8 = 2.1667;  no switch
    p = predict(PC, Layout("shared", 2, 2))
    assert p.step_s == pytest.approx(1.45 + 0.1 + (0.5 + 3 / 1.8) + 0.6 + 0.2)  # 4.5167
    assert p.phases["switch"] == 0.0 and p.bottleneck == "train"
    # 4 cores: Tg = 0.2 + 2 / 3.2 = 0.825;  Tt(4) = 0.5 + 3 / 3.6 = 1.3333
    assert predict(PC, Layout("shared", 4, 4)).step_s == pytest.approx(0.825 + 0.1 + 0.5 + 3 / 3.6 + 0.6 + 0.2)
    # one core: one thread each, g = e = 1, the same as separate 1:1 sync's sum: 6.6
    assert predict(PC, Layout("shared", 1, 1)).step_s == pytest.approx(6.6)
    # colocated 2:2 is 2 one-thread replicas (g = 1: Tg = 1.2) beside their 2 EngineCores on 2 cores (c = 2:
    # 2.4) plus two switches: 2.4 + 0.1 + 2.1667 + 0.6 + 0.5 + 0.2 = 5.9667
    assert predict(PC, Layout("colocated", 2, 2)).step_s == pytest.approx(5.9667, abs=1e-4)


def test_colocated_generation_on_cpu_cores_is_slowed_by_the_engine_cores():
    # GPU profile P: c = 1, Tg(2) = 0.2 + 2 / 2 = 1.2 (test_colocated_serializes_on_all_devices_with_two_switches)
    assert predict(P, Layout("colocated", 2, 2)).phases["generate"] == pytest.approx(1.2)
    # CPU profile: c = 2r / r = 2 -> 2.4; a given c replaces the rule, on CPU or GPU profiles alike
    assert predict(PC, Layout("colocated", 2, 2)).phases["generate"] == pytest.approx(2.4)
    measured = Profile(**{**PC.to_dict(), "colocated_gen_slowdown": 1.25})
    assert predict(measured, Layout("colocated", 2, 2)).phases["generate"] == pytest.approx(1.5)
    # other layouts keep their laws: shared Tg = 1.45 (test_shared_layout_by_hand)
    assert predict(PC, Layout("shared", 2, 2)).phases["generate"] == pytest.approx(1.45)


def test_shared_layout_exists_only_on_cpu_profiles():
    assert all(lay.placement != "shared" for lay in layouts(4, 4))
    assert layouts(4, 4, cpu=True)[-1] == Layout("shared", 4, 4, "sync", 0)
    assert layouts(3, 3, cpu=True)[-1] == Layout("shared", 3, 3)  # one replica divides any prompt count
    assert all(p.layout.placement != "shared" for p in rank(P, 4))
    assert [p.layout for p in rank(PC, 4) if p.layout.placement == "shared"] == [Layout("shared", 4, 4)]
    with pytest.raises(ValueError, match="shared placement time-shares CPU cores"):
        predict(P, Layout("shared", 2, 2))
    with pytest.raises(ValueError, match="rollout devices = trainer devices"):
        predict(PC, Layout("shared", 1, 2))
    with pytest.raises(ValueError, match="shared runs sync"):
        predict(PC, Layout("shared", 2, 2, "async", 1))


def test_shared_overrides_are_the_cpu_default():
    assert overrides(Layout("shared", 2, 2), cpu=True) == [
        "placement=separate",
        "rollout.num_replicas=1",
        "trainer.world_size=1",
        "mode=sync",
        "rollout.num_cpus=1",
        "rollout.num_threads=2",
        "trainer.num_cpus=1",
        "trainer.num_threads=2",
    ]


def test_shared_ranks_above_async_on_a_profile_like_the_measured_one(tmp_path):
    """grpo_arith on the 2-core box: the default (shared 2:2) measured 5.29 completions/s, async 1:1
    (one core a side) 4.51. A profile of a shared run like fake_run's: gen_dev 0.008, train_dev 0.0063."""
    profile = Profile.from_run(fake_run(tmp_path / "s", replicas=1, world_size=1, threads=0), cores=2)
    laws = {(lay.placement, lay.mode): predict(profile, lay).step_s for lay in layouts(2, 4, cpu=True)}
    # shared: 1.0 + 0.1 + 0.8 + 0.3 + 0.1 = 2.3
    assert laws["shared", "sync"] == pytest.approx(2.3)
    # async 1:1, s = 1.5: max(1.5 x 1.6 + 0.1 + 0.05, 0.1 + 1.5 x 1.26 + 0.3) + 0.1 = max(2.55, 2.29) + 0.1
    assert laws["separate", "async"] == pytest.approx(2.65)
    # sync 1:1: 1.6 + 0.1 + 1.36 + 0.3 + 0.1 = 3.46
    assert laws["separate", "sync"] == pytest.approx(3.46)
    # colocated 2:2: Tg per device 1.0 x 2 x 0.8 = 1.6 s, over 2 replicas 0.8, x c = 2: 1.6;
    # 1.6 + 0.1 + 0.8 + 0.3 + 0.1 + no switch = 2.9 (without c: 2.1, ranked above shared's 2.3)
    assert laws["colocated", "sync"] == pytest.approx(2.9)
    # The plan's ranking, simulated: the sync layouts as the laws; async 1:1 runs the step's training (1.36 s)
    # beside the call, both 1.5x slower (2.04 s, the call 1.36 s along), the sync freezes the call 0.3 s, its
    # last 0.24 s run alone, then scoring 0.1: 2.68 s
    preds = {(p.layout.placement, p.layout.mode): p.step_s for p in rank(profile, 2)}
    assert preds == pytest.approx({**laws, ("separate", "async"): 1.5 * 1.36 + 0.3 + 0.24 + 0.1})
    assert preds["shared", "sync"] < preds["separate", "async"] < preds["colocated", "sync"] < preds["separate", "sync"]
    assert rank(profile, 2)[0].layout == Layout("shared", 2, 2)


def test_a_colocated_cpu_profile_divides_the_slowdown_out(tmp_path):
    """The same work profiled in a colocated CPU run (its generation measured c = 2 times slower) gives the
    same per-device generation cost as a separate run."""
    separate = Profile.from_run(fake_run(tmp_path / "s", replicas=1, world_size=1, threads=1), cores=2)
    colocated_dir = fake_run(
        tmp_path / "c", replicas=1, world_size=1, threads=1, gen=(2.0, 2.4, 1.8), placement="colocated"
    )
    colocated = Profile.from_run(colocated_dir, cores=2)
    assert colocated.gen_dev_s_per_token == pytest.approx(separate.gen_dev_s_per_token)


def test_two_runs_fit_the_per_call_generation_cost(tmp_path):
    # Tg = 0.2 + 0.01 * tokens / r: r=1 -> 2.2 s, r=2 -> 1.2 s
    a = fake_run(tmp_path / "a", replicas=1, world_size=1, gen=(2.2, 2.2, 2.2))
    b = fake_run(tmp_path / "b", replicas=2, world_size=1, gen=(1.2, 1.2, 1.2))
    p = Profile.from_runs([a, b])
    assert (p.gen_call_s, p.gen_dev_s_per_token) == pytest.approx((0.2, 0.01))
    # two runs of one layout (200 vs 190 tokens): no line through noise, Tg is their mean
    c = fake_run(tmp_path / "c", replicas=1, world_size=1, gen=(2.0, 2.0, 2.0), tokens=190.0)
    same = Profile.from_runs([a, c])
    assert same.gen_call_s == 0.0 and same.gen_s(1) == pytest.approx(2.1 * 195 / 195)


def test_the_cpu_probes_fit_thread_scaling_and_the_ranks_costs(tmp_path):
    """Three runs made from Tg = 0.5 + 0.02 * x / (n * g) (x tokens per replica, n threads, g = 0.75), an update
    of 0.005 s/token on one thread (e = 0.8 on two threads; two one-thread ranks add 0.3 s a step) and a sync
    of 0.3 s (0.5 s from two ranks). Update here = update + logprob 0.1; train = update + 0.1 fixed."""
    # the shared 2:2 run of the batch (200 tokens, 4 prompts): Tg = 0.5 + 200 * 0.02 / 1.5; U = 1 / 1.6
    shared = fake_run(tmp_path / "s", 1, 1, threads=0, gen=(0.5 + 4 / 1.5,) * 3, update=0.625 - 0.1)
    # one thread a side at half the batch: Tg = 0.5 + 100 * 0.02 = 2.5; U = 0.005 * 100 = 0.5
    one = fake_run(tmp_path / "o", 1, 1, gen=(2.5,) * 3, tokens=100.0, update=0.4, prompts=2)
    # a 2-thread replica beside 2 one-thread ranks at half the batch: Tg = 0.5 + 2 / 1.5; U = 0.3 + 0.5 / 2
    ranks = fake_run(
        tmp_path / "r", 1, 2, threads=0, trainer_threads=1, gen=(0.5 + 2 / 1.5,) * 3, tokens=100.0, update=0.45,
        sync=0.5, prompts=2,
    )  # fmt: skip
    p = Profile.from_runs([shared, one, ranks], cores=2)
    assert (p.gen_call_s, p.gen_dev_s_per_token, p.gen_efficiency) == pytest.approx((0.5, 0.02, 0.75))
    assert (p.train_dev_s_per_token, p.train_efficiency) == pytest.approx((0.005, 0.8))
    assert (p.rank_efficiency, p.rank_collective_s, p.sync_gather_s) == pytest.approx((1.0, 0.3, 0.2))
    assert (p.tokens, p.prompts_per_step, p.sync_s(1), p.sync_s(2)) == pytest.approx((200, 4, 0.3, 0.5))
    assert p.overhead_s == 0.0  # fake_run's steps are shorter than these phases
    # separate 1:1 sync, a batch no probe ran on one thread: 4.5 + 0.1 + (0.1 + 1.0) + 0.3
    assert predict(p, Layout("separate", 1, 1)).step_s == pytest.approx(6.0)
    # colocated 2:2: c = 2 times Tg(2 replicas) = 2 * 2.5; Tt = 0.1 + 0.3 + 1.0 / 2; Ts from 2 ranks 0.5
    colocated = predict(p, Layout("colocated", 2, 2))
    assert colocated.phases["train"] == pytest.approx(0.9) and colocated.step_s == pytest.approx(6.5)
    assert predict(p, Layout("shared", 2, 2)).step_s == pytest.approx(0.5 + 4 / 1.5 + 0.1 + 0.725 + 0.3)
    # without the one-thread run nothing tells a from g: the shared runs' profile assumes g and e
    assert Profile.from_runs([shared, ranks], cores=2).gen_efficiency == 0.8


def test_the_probes_are_valid_runs_at_half_the_batch():
    from relayrl.config import load_config
    from relayrl.plan.measure import probes

    runs = probes(2, 4)
    ranks = load_config("grpo_arith", runs["ranks"])
    assert (ranks.trainer.world_size, ranks.trainer.num_threads, ranks.rollout.num_threads) == (2, 1, 2)
    one = load_config("grpo_arith", runs["one-thread"])
    assert (one.run.prompts_per_step, one.rollout.num_threads, one.trainer.num_threads) == (2, 1, 1)
    with pytest.raises(ValueError, match="even count"):
        probes(2, 3)


def test_cli_prints_table_and_recommendation(tmp_path, capsys):
    from relayrl.cli import main

    run = fake_run(tmp_path / "run")
    assert main(["plan", str(run), "--devices", "4", "--cores", "0", "--save-profile", str(tmp_path / "p.yaml")]) == 0
    out = capsys.readouterr().out
    # simulated 2:2 async: generation-bound, the call 1.0 + the sync freezing it 0.3 + scoring 0.1 = 1.4 (the
    # laws: max(1.0 + 0.1 + 0.05, (0.1 + 1.26/1.8) + 0.3) + 0.1 = 1.25); colocated 4 = 1.45; 2:2 sync 2.3
    assert (
        "recommended: placement=separate rollout.num_replicas=2 trainer.world_size=2 mode=async "
        "buffer.max_staleness=1" in out
    )
    assert "1.400" in out and "1.450" in out and "2.300" in out
    given = ["plan", "--profile", str(tmp_path / "p.yaml"), "--devices", "4", "--cores", "0"]
    # given figures: both sides twice as slow while they overlap: 2:2 async 2 x 0.8 + 0.3 + 0.2 + 0.1 = 2.2 s
    assert main([*given, "--set", "overlap_slowdown=2"]) == 0
    assert "recommended: placement=colocated" in capsys.readouterr().out
    assert main(["plan", "--devices", "4"]) == 2
    assert "give run directories" in capsys.readouterr().err


@pytest.mark.slow
def test_profile_of_a_real_run_predicts_the_overlap(tiny_llama, tmp_path):
    """A real grpo_tiny run in separate 1:1 sync yields a profile with every cost measured (none zero), and
    the model predicts the overlap from it: without contention (s = 1, as on GPUs) async k=1 is faster than
    sync on the same split, and CPU contention (s = 1.5) can only slow it. Whether async still wins on CPU
    depends on the measured costs (0.5 * Tg + stall against Tt + Ts; on grpo_tiny they nearly tie), so it
    is not asserted. How close predictions come to measured step times depends on the box's load, so that
    figure lives in ``bench/plan_accuracy.py``, not here."""
    from relayrl.plan.measure import TINY_WORK, run_layout

    sync = Layout("separate", 1, 1, "sync")
    run = run_layout("grpo_tiny", sync, 4, [f"model.path={tiny_llama}", *TINY_WORK], tmp_path)
    profile = Profile.from_runs([run], cores=2)
    assert profile.cpu and profile.overhead_s > 0
    assert profile.gen_dev_s_per_token > 0 and profile.train_dev_s_per_token > 0
    async_k1 = Layout("separate", 1, 1, "async", 1)
    no_contention = dataclasses.replace(profile, overlap_slowdown=1.0)
    assert predict(no_contention, async_k1).step_s < predict(no_contention, sync).step_s
    assert predict(profile, async_k1).step_s > predict(no_contention, async_k1).step_s


def test_streaming_scales_generation_by_the_profiles_occupancy():
    half = Profile(**{**P.to_dict(), "gen_occupancy": 0.5})  # the profile's engines ran half full
    stream = Layout("separate", 1, 3, "async", 1, stream=True)
    assert stream.schedule == "async k=1 stream"
    # Tg = 2.2 x 0.5 = 1.1; trainer path Tt(3) + Ts = 1.611 + 0.6: now the trainer is the slower path
    p = predict(half, stream)
    assert p.phases["generate"] == pytest.approx(1.1)
    assert p.step_s == pytest.approx(0.5 + 3 / 2.7 + 0.6 + 0.2) and p.bottleneck == "train"
    assert predict(half, Layout("separate", 1, 3, "async", 1)).bottleneck == "generate"  # chunks: 2.8 s
    full = Profile(**{**P.to_dict(), "gen_occupancy": 1.0})  # nothing to gain from a full batch
    assert predict(full, stream).step_s == pytest.approx(predict(full, Layout("separate", 1, 3, "async", 1)).step_s)
    assert overrides(stream)[-1] == "rollout.stream=true"


def test_streaming_layouts_need_the_occupancy_and_an_overlap():
    assert not any(lay.stream for lay in layouts(4, 4, (1,), stream=False))
    with_stream = [lay for lay in layouts(4, 4, (1, 2), stream=True) if lay.stream]
    assert {(lay.rollout_devices, lay.k) for lay in with_stream} == {
        (r, k) for r in (1, 2, 3) for k in (1, 2) if 4 % r == 0
    }
    assert not any(p.layout.stream for p in rank(P, 4))  # P logged no occupancy
    assert any(p.layout.stream for p in rank(Profile(**{**P.to_dict(), "gen_occupancy": 0.4}), 4))
    with pytest.raises(ValueError, match="occupancy"):
        predict(P, Layout("separate", 1, 1, "async", 1, stream=True))
    with pytest.raises(ValueError, match="streaming"):
        predict(P, Layout("separate", 1, 1, "sync", 0, stream=True))


def test_profile_reads_the_occupancy_of_runs_that_log_it(tmp_path):
    assert Profile.from_run(fake_run(tmp_path / "old")).gen_occupancy is None  # logged before rollout/occupancy
    run = fake_run(tmp_path / "new")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row, occ in zip(rows, (0.9, 0.3, 0.5, 0.4)):  # the warm-up step is left out: median of 0.3, 0.5, 0.4
        row["rollout/occupancy"] = occ
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert Profile.from_run(run).gen_occupancy == pytest.approx(0.4)
