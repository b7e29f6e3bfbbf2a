"""The simulator's swarm (``relayrl.plan.swarm_events``): replicas of different speeds, joins and leaves,
driven through the real ``StepPolicy``. Hand-worked on constant costs, then the shipped spot scenario."""

from __future__ import annotations

import math

import pytest

from relayrl.plan import costs as C
from relayrl.plan.cost_model import AnalyticCosts, ConstantCosts
from relayrl.plan.costs import Cluster
from relayrl.plan.scenario import find_cluster, rank_layouts, scenario
from relayrl.plan.simulate import policy_config, simulate
from relayrl.plan.specs import cluster_spec
from relayrl.plan.swarm_events import Swarm, SwarmEvent
from tests.plan.test_scenario import recipe
from tests.plan.test_simulate import ROUND_HW, ROUND_WL


def trained_once(result) -> None:
    """Accounting holds and every seq was trained once, in start order."""
    result.policy.check_accounting()
    seqs = [seq for s in result.steps for seq in s.seqs]
    assert seqs == list(range(len(seqs)))


# ---- speeds -------------------------------------------------------------------------------------------------


def test_a_replica_at_half_speed_takes_twice_as_long():
    """One replica at speed 0.5, generate 1 s, train 2 s, sync 0.5 s: every step is 2 + 2 + 0.5 = 4.5 s. An
    analytic call alone on a speed-2 engine takes half of ``generate_s`` (prefill and decode steps both /2)."""
    result = simulate(policy_config(1, 2, "sync"), ConstantCosts(1.0, 2.0, 0.5), 3, swarm=Swarm((0.5,)))
    assert [s.step_s for s in result.steps] == [4.5] * 3
    cluster, wl = Cluster(ROUND_HW, 1, 1), ROUND_WL
    pc = policy_config(1, wl.prompts_per_step, "sync")
    result = simulate(pc, AnalyticCosts(cluster, wl), 3, swarm=Swarm((2.0,)))
    expected = C.generate_s(ROUND_HW, wl, wl.prompts_per_step) / 2 + C.train_s(cluster, wl) + C.sync_s(cluster, wl)
    assert all(math.isclose(s.step_s, expected) for s in result.steps)


def test_work_lands_in_proportion_to_speed():
    """Speeds 1 and 0.5, stream (one group a call), 6 slots each, engine_seqs 1 (a replica runs one call at a
    time: 1 s on the fast one, 2 s on the slow one), B = 6, sync, train 1 s.

    Step 1: no rate measured, so placement alternates, 3 and 3. The fast one is done at 3 s, copies the slow
    one's two unfinished chunks and wins the last (5 s < 6 s): generate 5 s, step 6 s, fast 4 of 6 groups.
    From step 2 placement uses the measured rates (1 and 0.5 groups/s): (running + 1) / rate puts 4 on the fast
    one and 2 on the slow one, both done at 4 s: every step is 5 s. The equal split of step 1 would keep it
    at 6 s (and at 7 s without the copy). The fast replica trains 2/3 of the groups, not half."""
    pc = policy_config(2, 6, "sync", stream=True, slots=6)
    result = simulate(pc, ConstantCosts(1.0, 1.0, engine_seqs=1), 10, swarm=Swarm((1.0, 0.5)))
    assert [s.step_s for s in result.steps] == [6.0] + [5.0] * 9
    fast = result.groups_by_replica[0] / sum(result.groups_by_replica.values())
    assert fast == pytest.approx(2 / 3) and not 0.45 < fast < 0.55
    assert result.policy.reissued >= 1  # step 1's copies: one won, one lost
    trained_once(result)


# ---- joins and leaves -----------------------------------------------------------------------------------------


def test_a_leave_hands_the_call_back_and_it_is_generated_again():
    """Two replicas, one group a call (B = 2), generate 4 s, train 1 s. Replica 1 leaves at 1 s: its call is
    handed back and regenerated on replica 0 after its own (4 + 4 s): step 1 is 9 s, with 1 + 1/9 replicas up
    on average; step 2 runs both chunks on replica 0: 9 s again, with one replica."""
    swarm = Swarm(events=(SwarmEvent(at=1.0, leave=(1,)),))
    result = simulate(policy_config(2, 2, "sync"), ConstantCosts(4.0, 1.0), 2, swarm=swarm)
    assert [s.step_s for s in result.steps] == [9.0, 9.0]
    assert result.steps[0].replicas == pytest.approx(1 + 1 / 9) and result.steps[1].replicas == 1.0
    assert result.groups_by_replica == {0: 4} and result.policy.replicas.live == {0}
    trained_once(result)


def test_half_leave_at_step_5_and_come_back_at_10():
    """4 replicas, B = 8 (chunks of 2), generate 1 s, train 1 s, a join's start-up (restart_s) 0.5 s. Steps 1-5:
    one round, 2 s. After step 5 the two newest (3, then 2: equal rates) leave: 4 chunks on 2 replicas, two
    rounds, 3 s. After step 10 two join as 4 and 5, serving 0.5 s later: step 11 runs two chunks at once, the
    other two from 0.5 s (ending at 1.5 s): 2.5 s, with 2 + 2 · 2 / 2.5 = 3.6 replicas on average. Then 2 s."""
    swarm = Swarm(events=(SwarmEvent(step=5, leave=2), SwarmEvent(step=10, join=2)))
    result = simulate(policy_config(4, 8, "sync"), ConstantCosts(1.0, 1.0, restart=0.5), 15, swarm=swarm)
    assert [s.step_s for s in result.steps] == [2.0] * 5 + [3.0] * 5 + [2.5] + [2.0] * 4
    assert [s.replicas for s in result.steps] == pytest.approx([4] * 5 + [2] * 5 + [3.6] + [4] * 4)
    assert result.policy.replicas.live == {0, 1, 4, 5}
    assert result.groups_by_replica == {0: 40, 1: 40, 2: 10, 3: 10, 4: 10, 5: 10}
    assert [s for s in result.spans if s.what == "restart"] and result.policy.counts["trained"] == 120
    trained_once(result)


def test_the_shipped_spot_scenario_dips_at_step_20_and_recovers_after_40():
    """h100-2x8-spot: 4 of 8 replicas leave after step 20 and 4 join after step 40, serving restart_s = 90 s
    later. Steps 21-40 run on 4 replicas and are longer than steps 1-20 (generation takes twice as long, train
    and sync do not); the steps that start once the joiners serve are back at 8 replicas and the step time of
    1-20. No group is trained twice; the joiners take new ids (8-11)."""
    cfg = recipe("run.prompts_per_step=64", "rollout.max_tokens=1024", "run.steps=60", "run.checkpoint_every=0")
    spec = find_cluster("h100-2x8-spot")
    result = scenario(cfg, spec).run()
    steps = result.steps
    before, during = steps[:20], steps[20:40]
    serving_again = steps[39].end + spec.cluster.restart_s
    after = [s for s in steps if s.start >= serving_again]
    assert all(s.replicas == 8 for s in before) and all(s.replicas == 4 for s in during)
    assert min(s.step_s for s in during) > 1.3 * max(s.step_s for s in before)
    assert after and len(after) >= 15 and all(s.replicas == 8 for s in after)
    assert [s.step_s for s in after] == pytest.approx([before[-1].step_s] * len(after))
    assert all(s.replicas == 4 for s in steps[40:] if s.end <= serving_again)
    assert result.policy.replicas.live == {0, 1, 2, 3, 8, 9, 10, 11} and set(result.groups_by_replica) == set(range(12))
    assert all(s.groups == 64 for s in steps) and result.staleness == {0: 60 * 64}
    trained_once(result)


# ---- the cluster file ---------------------------------------------------------------------------------------------


def test_the_swarm_section_is_checked_against_the_cluster():
    """One speed a replica; events need separate placement; an event is a step or a time, a leave or a join;
    --rank refuses a swarm."""
    spec = cluster_spec({"rollout_gpus": 2, "swarm": {"speeds": [1, 0.5], "events": [{"step": 3, "leave": 1}]}})
    assert spec.swarm == Swarm((1.0, 0.5), (SwarmEvent(step=3, leave=1),))
    with pytest.raises(ValueError, match=r"swarm\.speeds lists 3 replicas, the cluster has 2"):
        cluster_spec({"rollout_gpus": 2, "swarm": {"speeds": [1, 1, 1]}})
    with pytest.raises(ValueError, match="placement: separate"):
        cluster_spec({"placement": "colocated", "swarm": {"events": [{"step": 1, "join": 1}]}})
    with pytest.raises(ValueError, match="valid: speeds, events"):
        cluster_spec({"swarm": {"speed": [1]}})
    with pytest.raises(ValueError, match="exactly one of step"):
        SwarmEvent(step=1, at=2.0, join=1)
    with pytest.raises(ValueError, match="exactly one of leave"):
        SwarmEvent(step=1)
    with pytest.raises(ValueError, match="--rank ranks fixed layouts"):
        rank_layouts(recipe(), spec)
