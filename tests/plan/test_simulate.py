"""The simulator (``relayrl.plan.simulate``) drives the real ``StepPolicy`` with a simulated clock; its cost
models (``relayrl.plan.costs``) are formulas checked here by hand. Pure Python: no Ray, no engines."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import relayrl.plan.simulate as simulate_module
from relayrl.config import load_config
from relayrl.controller import policy as policy_module
from relayrl.controller.buffer import Admission, ReplayBuffer
from relayrl.controller.loop import Loop
from relayrl.controller.policy import StepPolicy
from relayrl.plan import cost_model as M
from relayrl.plan import costs as C
from relayrl.plan.cost_model import AnalyticCosts, ConstantCosts
from relayrl.plan.costs import Cluster, Hardware, Workload
from relayrl.plan.model import Layout, predict
from relayrl.plan.profile import Profile
from relayrl.plan.simulate import Death, SimResult, Simulator, Span, policy_config, simulate, simulate_config


def spans(result: SimResult, what: str, lane: str | None = None) -> list[Span]:
    return [s for s in result.spans if s.what == what and (lane is None or s.lane == lane)]


def overlaps(a: list[Span], b: list[Span]) -> list[tuple[Span, Span]]:
    return [(x, y) for x in a for y in b if min(x.end, y.end) - max(x.start, y.start) > 1e-12]


# ---- (a) sync mode -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_sync_step_is_generate_plus_train_plus_sync_and_the_trainer_idles_the_generate_time(replicas):
    """k = 0, gen 1.0, train 2.0, sync 0.5: every step is 3.5 s; the trainer waits exactly the 1.0 s of
    generation each step; the replicas idle through train and sync."""
    result = simulate(policy_config(replicas, 4, "sync"), ConstantCosts(1.0, 2.0, 0.5), steps=5)
    assert [s.step_s for s in result.steps] == [3.5] * 5
    assert [s.trainer_idle_s for s in result.steps] == [1.0] * 5
    assert [s.rollout_idle_s for s in result.steps] == [replicas * 2.5] * 5
    assert [(s.train_start, s.train_end, s.end) for s in result.steps[:2]] == [(1.0, 3.0, 3.5), (4.5, 6.5, 7.0)]
    assert result.staleness == {0: 5 * 4}  # strictly on-policy
    assert result.wall_s == 17.5


def test_sync_step_with_scoring_and_analytic_costs_adds_the_terms():
    """Scoring sits between generate and train; an analytic call alone on its engine costs ``generate_s``."""
    result = simulate(policy_config(2, 4, "sync"), ConstantCosts(1.0, 2.0, 0.5, score=0.25), steps=3)
    assert [s.step_s for s in result.steps] == [3.75] * 3
    hw, wl = ROUND_HW, ROUND_WL
    cluster = Cluster(hw, 1, 1)
    result = simulate(policy_config(1, wl.prompts_per_step, "sync"), AnalyticCosts(cluster, wl), steps=3)
    expected = C.generate_s(hw, wl, wl.prompts_per_step) + C.train_s(cluster, wl) + C.sync_s(cluster, wl)
    assert all(math.isclose(s.step_s, expected) for s in result.steps)


# ---- (b) async mode ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 2])
def test_async_k1_rollout_idles_train_minus_gen_and_no_group_exceeds_staleness_1(replicas):
    """k = 1, gen 1.0 < train 3.0, no sync cost: after the first step the trainer never waits, each step
    lasts the train time, and every replica idles exactly 3.0 - 1.0 s a step. Staleness comes from the
    policy's own entries (``staleness_histogram``, what the StepLog logs): at most 1, and 1 in steady state."""
    gen, train = 1.0, 3.0
    result = simulate(policy_config(replicas, 4, "async", k=1), ConstantCosts(gen, train, 0.0), steps=8)
    steady = result.steps[1:]
    assert all(math.isclose(s.step_s, train) for s in steady)
    assert all(math.isclose(s.trainer_idle_s, 0.0, abs_tol=1e-12) for s in steady)
    assert all(math.isclose(s.rollout_idle_s, replicas * (train - gen)) for s in steady)
    assert max(s.staleness["staleness/max"] for s in result.steps) == 1.0
    assert all(s.staleness == {"staleness/1": 4.0, "staleness/max": 1.0, "staleness/mean": 1.0} for s in steady)
    assert max(result.staleness) == 1 and not result.policy.buffer.dropped


def test_async_k1_with_a_sync_cost_idles_train_plus_sync_minus_gen():
    """With a 0.5 s sync the step is train + sync and the rollout idles train + sync - gen (no call is in
    flight while the engines are paused)."""
    result = simulate(policy_config(1, 2, "async", k=1), ConstantCosts(1.0, 3.0, 0.5), steps=6)
    assert all(math.isclose(s.step_s, 3.5) and math.isclose(s.rollout_idle_s, 2.5) for s in result.steps[1:])
    assert not spans(result, "paused")


def test_async_generation_bound_pays_the_sync_pause_on_the_rollout_path():
    """gen 3.0 > train 1.0 + sync 0.5: a call is running at every sync, the sync freezes it for 0.5 s, so a
    step is 3.5 s (the planner's rollout path s·Tg + Tr + stall)."""
    result = simulate(policy_config(1, 2, "async", k=1), ConstantCosts(3.0, 1.0, 0.5), steps=6)
    assert all(math.isclose(s.step_s, 3.5) for s in result.steps[2:])
    paused = spans(result, "paused", "rollout/0")
    assert paused and all(math.isclose(p.end - p.start, 0.5) for p in paused)


# ---- (c) colocated -------------------------------------------------------------------------------------------


def test_colocated_never_overlaps_generation_and_training():
    """Colocated time-shares the devices: no generate call overlaps a train, sync or hand-over, and a step is
    gen + switch + train + switch + sync."""
    costs = ConstantCosts([1.0, 1.5, 0.5], 2.0, 0.5, score=0.1, switch=0.25)
    result = simulate(policy_config(3, 6, "sync", colocated=True), costs, steps=6)
    generating = spans(result, "generate")
    trainer = [s for s in result.spans if s.lane == "trainer"]
    assert generating and trainer and not overlaps(generating, trainer)
    assert {s.what for s in trainer} == {"train", "sync", "switch"}
    # every step waits for its slowest call (1.5) and its scoring (0.1)
    assert all(math.isclose(s.step_s, 1.5 + 0.1 + 0.25 + 2.0 + 0.25 + 0.5) for s in result.steps)


def test_colocated_async_still_never_overlaps():
    """The policy, not the mode, keeps colocated apart: k = 2 lets chunks queue up, never beside a step."""
    result = simulate(policy_config(2, 4, "async", k=2, colocated=True), ConstantCosts([0.7, 1.3], 1.0, 0.2), steps=8)
    trainer = [s for s in result.spans if s.lane == "trainer"]
    assert not overlaps(spans(result, "generate"), trainer)


# ---- (d) the real policy -------------------------------------------------------------------------------------


def test_the_policy_is_the_controllers_own_object():
    """No copy: the simulator holds a ``relayrl.controller.policy.StepPolicy`` (not a subclass) whose
    admission and buffer are the controller's classes, and it defines no policy class of its own."""
    result = simulate(policy_config(2, 4, "async", k=1), ConstantCosts(1.0, 1.0), steps=2)
    assert type(result.policy) is StepPolicy is policy_module.StepPolicy
    assert type(result.policy.admission) is Admission and type(result.policy.buffer) is ReplayBuffer
    assert simulate_module.StepPolicy is policy_module.StepPolicy
    own = [
        v for v in vars(simulate_module).values() if isinstance(v, type) and v.__module__ == simulate_module.__name__
    ]
    assert not [cls for cls in own if issubclass(cls, (StepPolicy, Admission, ReplayBuffer))]
    assert result.policy.version == 2 and result.policy.counts["trained"] == 8


def test_the_scheduler_and_the_simulator_run_one_loop():
    """No copy of the loop either: both are ``controller/loop.py``'s ``Loop``, and neither defines the loop's
    own methods (the turn, launching, starting a step, replacing a replica); each only supplies effects."""
    from relayrl.controller.scheduler import Scheduler  # imports ray: only this test needs it

    shared = {"run_loop", "_launch", "_start_training", "_replace_replica"}
    for cls in (Scheduler, Simulator):
        assert issubclass(cls, Loop)
        assert not shared & set(vars(cls)), cls
        assert not getattr(cls, "__abstractmethods__", set()), cls  # every effect is supplied


def test_the_loop_calls_the_policy_as_the_scheduler_does(monkeypatch):
    """Each turn of the loop calls ``launches`` then ``take_step`` (as ``Scheduler.run_steps``), then hands one
    result over: ``on_scored``, ``on_failed`` (via a replaced replica) or ``on_trained``."""
    calls: list[str] = []
    for name in ("launches", "take_step", "on_scored", "on_failed", "on_trained"):
        original = getattr(StepPolicy, name)

        def spy(self, *args, _name=name, _original=original):
            calls.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(StepPolicy, name, spy)
    simulate(policy_config(2, 4, "async", k=1), ConstantCosts([1.0, 2.0], 1.5, restart=0.1), 4, deaths=[Death(0.5, 1)])
    assert calls[:2] == ["launches", "take_step"] and "on_failed" in calls
    turns = "".join({"launches": "L", "take_step": "T"}.get(c, "x") for c in calls)
    assert turns.replace("LTx", "").replace("LT", "") == "", turns  # every turn: L, T, at most one result


# ---- failures, streaming, properties ---------------------------------------------------------------------------


def test_a_dead_replica_is_replaced_once_and_its_chunk_generated_again_under_its_seq():
    """Replica 1 dies at 0.5 s with its chunk (seq 1) running: the driver notices, restarts it (0.2 s, the
    driver waits), and the policy hands seq 1 back to it first; nothing is lost or repeated."""
    result = simulate(
        policy_config(2, 4, "sync"), ConstantCosts(1.0, 1.0, restart=0.2), steps=3, deaths=[Death(0.5, 1)]
    )
    assert result.restarts == 1
    restart = spans(result, "restart")
    assert [(s.lane, s.label, s.start, s.end) for s in restart] == [("rollout/1", 1, 0.5, 0.7)]
    seq1 = [s for s in spans(result, "generate", "rollout/1") if s.label == 1]
    assert [(s.start, s.end) for s in seq1] == [(0.0, 0.5), (0.7, 1.7)]
    assert [s.seqs for s in result.steps] == [[0, 1], [2, 3], [4, 5]]
    assert result.policy.counts == {"issued": 12, "trained": 12, "dropped": 0}


def test_streaming_calls_share_their_engine_and_queue_past_its_batch():
    """Memory-bound decode (a step costs the same at any batch): two one-group calls that fit one engine's batch
    finish together in the time of one; with room for one they take turns (the second shows a queued span)."""
    hw, wl = ROUND_HW, Workload(1e9, 100, 1000, prompts_per_step=2, group_size=4, max_num_seqs=8)
    alone = C.generate_s(hw, wl, 1)
    pc = policy_config(1, 2, "sync", stream=True, slots=2)
    shared = simulate(pc, AnalyticCosts(Cluster(hw), wl), steps=1)
    generated = spans(shared, "generate")
    assert [s.start for s in generated] == [0.0, 0.0]
    assert [s.end for s in generated] == pytest.approx([alone, alone])
    narrow = Workload(1e9, 100, 1000, prompts_per_step=2, group_size=4, max_num_seqs=4)
    queued = simulate(pc, AnalyticCosts(Cluster(hw), narrow), steps=1)
    ends = sorted(s.end for s in spans(queued, "generate"))
    assert ends == pytest.approx([alone, 2 * alone])
    assert len(spans(queued, "queued")) == 1


class WaveCosts(ConstantCosts):
    """Given ``CallCost``s in launch order, decode steps lasting ``step(b)`` at batch b, an engine of 4 sequences."""

    def __init__(self, calls: list[M.CallCost], step: Callable[[int], float]):
        super().__init__(0.0, 0.0, engine_seqs=4)
        self.calls, self.step = iter(calls), step

    def call(self, groups: int) -> M.CallCost:
        return next(self.calls)

    def decode_step_s(self, batch: int) -> float:
        return self.step(batch)


def test_sequences_that_end_free_their_slots_for_a_queued_call():
    """An engine of 4 slots, 1 s a decode step. A holds all 4 for 10 steps, but 2 of its sequences end after
    4: B (2 sequences, 3 steps), queued behind A, starts then, at 4 s, and ends at 7 s; A still ends at 10 s.
    Without the release B would start at 10 s."""
    calls = [M.CallCost(4, 0.0, 10.0, ((4.0, 2),)), M.CallCost(2, 0.0, 3.0)]
    result = simulate(policy_config(1, 2, "sync", stream=True, slots=2), WaveCosts(calls, lambda b: 1.0), steps=1)
    assert [t for s in spans(result, "generate") for t in (s.start, s.end)] == pytest.approx([0.0, 10.0, 4.0, 7.0])
    assert [t for s in spans(result, "queued") for t in (s.start, s.end)] == pytest.approx([0.0, 4.0])


def test_a_calls_tail_decodes_at_the_batch_left():
    """Decode steps cost 0.25 s a sequence in the batch. 4 sequences, 8 steps, 3 ending after 4: 4 steps at
    b = 4 (1 s each) then 4 at b = 1 (0.25 s each): 5 s, where holding all 4 slots would take 8 s."""
    calls = [M.CallCost(4, 0.0, 8.0, ((4.0, 3),))]
    result = simulate(policy_config(1, 1, "sync"), WaveCosts(calls, lambda b: 0.25 * b), steps=1)
    assert [s.end for s in spans(result, "generate")] == pytest.approx([5.0])


def test_release_waves_by_hand():
    """Sorted lengths cut into runs of equal count, each freeing its slots at its longest; what ends with the
    call's longest is left to the call's end, and runs ending at one length merge."""
    assert M.release_waves([8, 1, 2, 3, 4, 5, 6, 7], 4) == ((2, 2), (4, 2), (6, 2))
    assert M.release_waves([5, 5, 5, 5], 4) == ()
    assert M.release_waves([1, 1, 2, 9], 4) == ((1, 2), (2, 1))
    assert M.release_waves([3, 1, 2], 8) == ((1, 1), (2, 1))


def test_overlap_slowdown_slows_both_sides_while_they_overlap():
    """s = 2 (a CPU box): a call overlapping training runs at half speed, and the step trains at half speed
    while it runs. gen 1, train 4, k = 1, 1 replica: each step's call overlaps training for its whole (doubled)
    2 s, so training gets 2 s at half speed (1 s of work) + 3 s alone: 5 s a step."""
    result = simulate(policy_config(1, 2, "async", k=1), ConstantCosts(1.0, 4.0, overlap_slowdown=2.0), steps=6)
    assert all(math.isclose(s.step_s, 5.0) for s in result.steps[2:])
    assert all(math.isclose(g.end - g.start, 2.0) for g in spans(result, "generate")[2:])


def test_pause_while_training_freezes_the_engines_during_the_step():
    result = simulate(policy_config(1, 2, "async", k=1), ConstantCosts(1.0, 3.0), steps=5, pause_while_training=True)
    train = spans(result, "train")
    busy = spans(result, "busy")
    assert not overlaps(train, busy)


def test_checkpoint_stalls_the_driver_every_n_steps():
    result = simulate(policy_config(1, 2, "sync"), ConstantCosts(1.0, 1.0, checkpoint=0.5), 4, checkpoint_every=2)
    assert [(s.start, s.end) for s in spans(result, "checkpoint")] == [(4.0, 4.5), (8.5, 9.0)]
    assert [s.step_s for s in result.steps] == [2.0, 2.0, 2.5, 2.0]  # a save opens the next step's window


@pytest.mark.parametrize(
    "layout, pc",
    [
        (Layout("separate", 1, 1, "sync"), policy_config(1, 4, "sync")),
        (Layout("separate", 2, 1, "sync"), policy_config(2, 4, "sync")),
        (Layout("separate", 1, 1, "async", 1), policy_config(1, 4, "async", 1)),
        (Layout("separate", 2, 1, "async", 1), policy_config(2, 4, "async", 1)),
        (Layout("colocated", 1, 1, "sync"), policy_config(1, 4, "sync", colocated=True)),
    ],
)
@pytest.mark.parametrize("gen, train, sync", [(3.0, 1.0, 0.5), (1.0, 3.0, 0.5), (2.0, 2.0, 0.25)])
def test_constant_costs_reproduce_the_planners_formulas(layout, pc, gen, train, sync):
    """On GPUs with constant costs the event loop's steady step is today's planner law (``plan.model.predict``),
    the sync's engine pause being the async rollout path's stall."""
    r = layout.rollout_devices
    profile = Profile(100, 10, 4, gen * r / 100, train / 100, sync_fixed_s=sync, stall_s=sync, switch_s=0.3)
    result = simulate(pc, ConstantCosts(gen, train, sync, switch=0.3), steps=12)
    assert result.step_s(skip=3) == pytest.approx(predict(profile, layout).step_s)


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(0, 3),
    replicas=st.integers(1, 3),
    chunk=st.integers(1, 2),
    gen=st.lists(st.floats(0.05, 5.0), min_size=1, max_size=5),
    train=st.floats(0.05, 5.0),
    sync=st.floats(0.0, 1.0),
    score=st.floats(0.0, 0.5),
    colocated=st.booleans(),
    deaths=st.lists(st.tuples(st.floats(0.0, 30.0), st.integers(0, 2)), max_size=3),
)
def test_any_timing_keeps_the_bound_the_order_and_the_accounting(
    k, replicas, chunk, gen, train, sync, score, colocated, deaths
):
    """Whatever the costs and deaths: steps take seqs in start order without gaps, nothing trains staler than k,
    the accounting holds (the policy checks it after every step), colocated never overlaps."""
    pc = policy_config(replicas, replicas * chunk, "async", k=k, colocated=colocated)
    kills = [Death(t, r % replicas) for t, r in deaths]
    result = simulate(pc, ConstantCosts(gen, train, sync, score=score, restart=0.1), steps=6, deaths=kills)
    seqs = [q for s in result.steps for q in s.seqs]
    assert seqs == list(range(len(seqs)))
    assert max(result.staleness) <= k
    assert result.policy.counts["trained"] == 6 * replicas * chunk
    assert all(b.start <= b.end for b in result.spans)
    if colocated:
        assert not overlaps(spans(result, "generate"), [s for s in result.spans if s.lane == "trainer"])


def test_a_run_config_is_simulated_with_the_schedulers_policy_config():
    cfg = load_config("grpo_tiny", ["mode=async", "buffer.max_staleness=2", "run.steps=4", "run.checkpoint_every=0"])
    result = simulate_config(cfg, ConstantCosts(1.0, 2.0, 0.1))
    assert result.policy.pc == policy_module.PolicyConfig.from_config(cfg, cfg.rollout.num_replicas)
    assert len(result.steps) == 4 and max(result.staleness) <= 2


def test_stalled_policy_raises_the_schedulers_error():
    """buffer.capacity below a step: admission stops and nothing can fill a step, as in a real run."""
    with pytest.raises(RuntimeError, match="scheduler stalled at v0"):
        simulate(policy_config(1, 4, "async", k=1, capacity=2), ConstantCosts(1.0, 1.0), steps=2)


# ---- the cost formulas, by hand ---------------------------------------------------------------------------------

ROUND_HW = Hardware(peak_flops=1e15, hbm_bytes_per_s=1e12, mfu=0.5, gen_mfu=0.5, hbm_efficiency=1.0)
ROUND_WL = Workload(params=1e9, prompt_len=100, response_len=1000, prompts_per_step=8, group_size=4, max_num_seqs=16)


def test_cost_formulas_by_hand():
    """P = 1e9, 2 bytes/param, F = 1e15 FLOP/s at 50 %, 1e12 B/s HBM (fully used):"""
    hw, wl = ROUND_HW, ROUND_WL
    # decode step: max(2e9 B / 1e12 B/s = 2 ms, 2 * 1e9 * b / 5e14 = 4 µs * b): memory bound below b = 500
    assert C.decode_step_s(hw, wl, 16) == pytest.approx(2e-3)
    assert C.decode_step_s(hw, wl, 1000) == pytest.approx(4e-3)
    assert C.saturation_batch(hw, wl) == pytest.approx(500)
    assert C.decode_tokens_per_s(hw, wl, 100) == pytest.approx(100 / 2e-3)
    assert C.decode_tokens_per_s(hw, wl, 5000) == pytest.approx(5e14 / 2e9)  # the ceiling F·mfu / 2P
    # prefill of 8 groups x 100 prompt tokens: 2 * 1e9 * 800 / 5e14 = 3.2 ms
    assert C.prefill_s(hw, wl, 8) == pytest.approx(3.2e-3)
    # 8 groups x 4 = 32 sequences, 16 at a time: 2 waves of 1000 steps at 2 ms
    assert C.generate_s(hw, wl, 8) == pytest.approx(3.2e-3 + 2 * 1000 * 2e-3)
    # training: T = 8 * (100 + 4 * 1000) = 32800 tokens; 6 * 1e9 * 32800 / (1e15 * 0.5 * 2 devices)
    assert wl.train_tokens == 32800
    assert C.train_s(Cluster(hw, 2, 2), wl) == pytest.approx(6e9 * 32800 / 1e15)
    # sync: 2e9 B over NVLink (one node) or IB (16 devices > 8 a node), + latency
    assert C.sync_s(Cluster(hw, 4, 4, sync_latency_s=0.01), wl) == pytest.approx(2e9 / 450e9 + 0.01)
    assert C.sync_s(Cluster(hw, 8, 8), wl) == pytest.approx(2e9 / 50e9)
    # checkpoint: 14 bytes/param at 2e9 B/s
    assert C.checkpoint_s(Cluster(hw), wl) == pytest.approx(7.0)


def test_kv_reads_move_or_remove_the_saturation_batch():
    """Each sequence reads its KV cache every step: c = 100 + 1000 / 2 = 600 context tokens. At 1000 B a token
    that is 0.6 MB a sequence a step (0.6 µs of HBM time against 4 µs of FLOPs), so decode turns compute bound
    later: at W / (2P·B_hbm/F − c·kv) = 2e9 / (4e6 − 6e5) ≈ 588. At 10 kB a token (6 µs > 4 µs) it never does."""
    wl = Workload(1e9, 100, 1000, 8, 4, kv_bytes_per_token=1000)
    assert C.saturation_batch(ROUND_HW, wl) == pytest.approx(2e9 / (4e6 - 6e5))
    assert C.decode_step_s(ROUND_HW, wl, 10) == pytest.approx((2e9 + 10 * 600 * 1000) / 1e12)
    assert C.saturation_batch(ROUND_HW, Workload(1e9, 100, 1000, 8, 4, kv_bytes_per_token=10_000)) == math.inf


def test_analytic_costs_scale_training_by_the_groups_a_step_took():
    cluster = Cluster(ROUND_HW, 1, 1)
    costs = AnalyticCosts(cluster, ROUND_WL)
    full = C.train_s(cluster, ROUND_WL)
    assert costs.train_s(8) == pytest.approx(full) and costs.train_s(16) == pytest.approx(2 * full)
    call = costs.call(8)
    assert (call.seqs, call.steps) == (32, 2000) and call.fixed_s == pytest.approx(C.prefill_s(ROUND_HW, ROUND_WL, 8))
    assert call.releases == ()  # fixed lengths: every sequence ends with the call


def test_drawn_lengths_free_a_fitting_calls_slots_in_waves():
    """Lognormal lengths: a call that fits the engine's batch (4 x 4 <= 16) frees its slots in at most
    ``RELEASE_WAVES`` waves before its longest; a larger one (8 x 4 > 16) holds them until it ends."""
    wl = Workload(1e9, 100, 1000, 8, 4, max_num_seqs=16, response_cv=0.6)
    costs = AnalyticCosts(Cluster(ROUND_HW, 1, 1), wl)
    fits = costs.call(4)
    at = [a for a, _ in fits.releases]
    assert 1 <= len(fits.releases) <= M.RELEASE_WAVES and at == sorted(at) and at[-1] < fits.steps
    assert sum(n for _, n in fits.releases) < fits.seqs == 16
    assert costs.call(8).releases == ()
    with pytest.raises(ValueError, match="placement"):
        Cluster(placement="shared")
