"""The scorer's rollout statistics on a hand-made batch: lengths, truncation, empty completions, versions."""

from __future__ import annotations

from relayrl.controller.rollout_stats import rollout_metrics
from relayrl.types import Trajectory, TrajectoryGroup, VersionSpan


def traj(tokens: int, finish: str, versions: list[tuple[int, int, int]], text: str = "x") -> Trajectory:
    return Trajectory(
        prompt_id=0,
        sample_idx=0,
        prompt_token_ids=[1],
        completion_token_ids=[5] * tokens,
        behaviour_logprobs=[-1.0] * tokens,
        completion_text=text,
        finish_reason=finish,
        versions=[VersionSpan(v, a, b) for v, a, b in versions],
    )


def test_rollout_metrics_by_hand():
    groups = [
        TrajectoryGroup(0, "p", {}, [traj(4, "length", [(2, 0, 2), (3, 2, 4)]), traj(0, "stop", [], "")]),
        TrajectoryGroup(1, "q", {}, [traj(2, "stop", [(2, 0, 2)]), traj(1, "stop", [(2, 0, 1)], " \n")]),
    ]
    m = rollout_metrics(groups)
    assert m["rollout/completions"] == 4 and m["rollout/tokens"] == 7 and m["rollout/len_mean"] == 1.75
    assert m["rollout/truncated_frac"] == 0.25 and m["rollout/empty_frac"] == 0.5  # 1 of 4 cut; "" and " \n" empty
    assert (m["rollout/min_version"], m["rollout/max_version"]) == (0.0, 3.0)  # an empty one has no span: 0


def test_all_empty_completions_still_give_versions():
    m = rollout_metrics([TrajectoryGroup(0, "p", {}, [traj(0, "stop", [], ""), traj(0, "stop", [], "")])])
    assert (m["rollout/empty_frac"], m["rollout/tokens"], m["rollout/max_version"]) == (1.0, 0.0, 0.0)
