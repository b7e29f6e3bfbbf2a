"""The simulator fed a measured profile (``plan/calibrate.py``): on sync layouts, where nothing overlaps, it must
give exactly the planner's closed-form step; on async layouts it schedules the same terms itself."""

from __future__ import annotations

import dataclasses
import re

import pytest

from relayrl.plan.calibrate import ProfileCosts, layout_policy, simulate_layout
from relayrl.plan.model import Layout, predict
from relayrl.plan.profile import Profile
from tests.plan.test_plan import P

# A CPU profile shaped like grpo_arith's on this box: 8 prompts x 4 completions, 640 tokens a step.
PROFILE = Profile(
    tokens=640,
    completions=32,
    prompts_per_step=8,
    gen_dev_s_per_token=0.004,
    train_dev_s_per_token=0.003,
    gen_call_s=0.2,
    reward_s=0.05,
    train_fixed_s=0.3,
    sync_fixed_s=0.4,
    stall_s=0.1,
    overhead_s=0.25,
    switch_s=0.6,
    cpu=True,
)


@pytest.mark.parametrize(
    "layout",
    [Layout("separate", 1, 1, "sync"), Layout("shared", 2, 2, "sync"), Layout("colocated", 2, 2, "sync")],
    ids=str,
)
def test_a_sync_layout_simulates_to_the_planners_step(layout):
    assert simulate_layout(PROFILE, layout).step_s(skip=2) == pytest.approx(predict(PROFILE, layout).step_s)


# The same with what the CPU probes fit: two one-thread ranks add 0.5 s a step and 0.2 s a sync.
PROBED = Profile(**{**PROFILE.to_dict(), "rank_efficiency": 1.0, "rank_collective_s": 0.5, "sync_gather_s": 0.2})


@pytest.mark.parametrize("layout", [Layout("separate", 1, 2, "sync"), Layout("colocated", 2, 2, "sync")], ids=str)
def test_the_ranks_costs_reach_the_simulator_as_they_reach_the_laws(layout):
    """colocated 2:2: gen 2 * (0.2 + 0.004 * 320) = 2.96, score 0.05, train 0.3 + 0.5 + 0.003 * 320 = 1.76,
    sync 0.4 + 0.2, two switches 1.2, overhead 0.25: 6.82 s."""
    assert simulate_layout(PROBED, layout).step_s(skip=2) == pytest.approx(predict(PROBED, layout).step_s)
    if layout.placement == "colocated":
        assert predict(PROBED, layout).step_s == pytest.approx(2.96 + 0.05 + 1.76 + 0.6 + 1.2 + 0.25)


def test_a_sync_step_by_hand():
    """separate 1:1 sync: gen 0.2 + 0.004 * 640 = 2.76, score 0.05, train 0.3 + 0.003 * 640 = 2.22, sync 0.4,
    overhead 0.25: 5.68 s."""
    result = simulate_layout(PROFILE, Layout("separate", 1, 1, "sync"))
    assert result.step_s(skip=2) == pytest.approx(2.76 + 0.05 + 2.22 + 0.4 + 0.25)


def test_async_k1_overlaps_so_it_is_faster_than_sync_but_not_faster_than_its_slower_side():
    sync = simulate_layout(PROFILE, Layout("separate", 1, 1, "sync")).step_s(skip=2)
    result = simulate_layout(PROFILE, Layout("separate", 1, 1, "async", 1))
    assert result.step_s(skip=2) < sync
    assert result.step_s(skip=2) >= PROFILE.gen_s(1) + PROFILE.reward_s  # one replica still generates every call
    assert max(s.staleness["staleness/max"] for s in result.steps) == 1.0  # the policy's own bound, reached


def test_costs_per_call_scale_with_the_groups_and_the_policy_takes_the_layouts_replicas():
    costs = ProfileCosts(PROFILE, Layout("separate", 2, 1, "sync"))
    assert costs.completions_per_group == 4
    assert costs.call(4).fixed_s == pytest.approx(0.2 + 0.004 * 640 / 2)  # half the step's tokens on 1 thread
    assert layout_policy(PROFILE, Layout("separate", 2, 1, "async", 1)).replicas == 2
    assert layout_policy(PROFILE, Layout("shared", 2, 2, "sync")).replicas == 1


# test_plan's round profile with a short measured stall (0.05 s) and slower generation (0.022 s/token): 4 devices.
# Tg(1) = 0.2 + 0.022 * 100 = 2.4, Tg(2) = 1.3, Tg(4) = 0.75; Tt(t) = 0.5 + 0.03 * 100 / (t * 0.9) beyond one
# rank: Tt(2) = 2.1667, Tt(3) = 1.6111, Tt(4) = 1.3333; Ts = 0.1 + 1e9 / 2e9 = 0.6; Tr 0.1, O 0.2, switch 0.25.
SHORT_STALL = dataclasses.replace(P, gen_dev_s_per_token=0.022, stall_s=0.05)


def test_the_plan_ranks_as_the_simulator_where_the_laws_disagree(tmp_path, capsys):
    """The laws put 1:3 async first: 2.4 + 0.1 + stall 0.05 + O 0.2 = 2.75 against 2:2 async's trainer path
    2.1667 + 0.6 + 0.2 = 2.9667. The simulator schedules the calls: 1:3's one replica runs a 2.4 s call that each
    sync freezes for the whole 0.6 s, then scores it (0.1) before the next: 3.1 s, while 2:2 stays trainer-bound at
    2.9667 s (the driver's O runs beside the next call there, not after it). ``relayrl plan`` ranks, prints and
    recommends the simulator's order. Sync layouts are the laws' sums: colocated 0.75 + 0.1 + 1.3333 + 0.6 + 2 x
    0.25 + 0.2 = 3.4833; 2:2 sync 1.3 + 0.1 + 2.1667 + 0.6 + 0.2 = 4.3667; 1:3 sync 2.4 + 0.1 + 1.6111 + 0.6 + 0.2
    = 4.9111."""
    from relayrl.cli import main
    from relayrl.plan import layouts, rank
    from relayrl.plan.report import save_profile

    by_laws = sorted(layouts(4, 4), key=lambda lay: predict(SHORT_STALL, lay).step_s)
    assert by_laws[:2] == [Layout("separate", 1, 3, "async", 1), Layout("separate", 2, 2, "async", 1)]
    assert predict(SHORT_STALL, by_laws[0]).step_s == pytest.approx(2.75)
    got = [(p.layout.placement, p.layout.split(), p.layout.schedule, round(p.step_s, 4)) for p in rank(SHORT_STALL, 4)]
    assert got == [
        ("separate", "2:2", "async k=1", 2.9667),
        ("separate", "1:3", "async k=1", 3.1),
        ("colocated", "4:4", "sync", 3.4833),
        ("separate", "2:2", "sync", 4.3667),
        ("separate", "1:3", "sync", 4.9111),
    ]
    save_profile(SHORT_STALL, str(tmp_path / "p.yaml"))
    assert main(["plan", "--profile", str(tmp_path / "p.yaml"), "--devices", "4", "--cores", "0"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("│") for line in out.splitlines() if re.match(r"│\s*\d+\s*│", line)]  # the table's rows
    assert [row[5].strip() for row in rows] == ["2.967", "3.100", "3.483", "4.367", "4.911"]  # its step s column
    assert "recommended: placement=separate rollout.num_replicas=2 trainer.world_size=2 mode=async" in out
