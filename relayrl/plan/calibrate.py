"""The simulator fed a measured profile: ``ProfileCosts`` turns ``relayrl plan``'s ``Profile`` (medians of a run
on this box) into the simulator's ``CostModel`` for one planner ``Layout``, so a layout's step time can be
simulated from the same measurements the planner's closed-form laws use, and both checked against real runs
(``bench/plan_accuracy.py``).

The costs, per call and step, are the planner's terms (``relayrl.plan.model``): a generate call of g groups
costs ``gen_call_s + gen_dev_s_per_token · tokens_per_group · g / (threads · g_eff)`` (times the colocated
slowdown c when colocated); its scoring ``reward_s``; a step's training ``Tt(t)``; a sync ``Ts``; a colocated
hand-over ``switch_s``; the driver's per-step overhead ``O``. Calls do not slow each other through the batch
(the profile was measured at its own batch), and separate async layouts on CPU cores run both sides s times
slower while they overlap (``model.overlap_slowdown``). The simulator adds what the laws leave out: the order
in which calls finish, admission and the staleness bound, engine pauses at each sync. A streaming layout's
calls cost the laws' Tg · u (``model.stream_speedup``) and run in chunks, as the streaming law does.

``rank`` is ``relayrl plan``'s ranking: every layout of ``model.layouts`` simulated with these costs, so the
plan's order is the simulator's (``relayrl simulate --rank`` ranks the same way from analytic costs). Where the
laws and the simulator differ, the simulator is the one that schedules the calls: in a generation-bound async
layout each sync freezes the running call for the whole sync (the laws add the profile's measured ``stall_s``),
and the driver's overhead overlaps generation (the laws add O to every step).
"""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.controller.policy import PolicyConfig
from relayrl.plan.cost_model import CallCost
from relayrl.plan.model import (
    Layout,
    Prediction,
    colocated_slowdown,
    layouts,
    overlap_slowdown,
    predict,
    stream_speedup,
)
from relayrl.plan.profile import Profile
from relayrl.plan.simulate import SimResult, simulate


@dataclass
class ProfileCosts:
    """A ``CostModel`` from a measured ``Profile`` for ``layout`` (module docstring)."""

    profile: Profile
    layout: Layout

    engine_seqs: int = 1 << 30

    @property
    def overlap_slowdown(self) -> float:
        return overlap_slowdown(self.profile, self.layout) if self.layout.overlaps else 1.0

    @property
    def completions_per_group(self) -> int:
        return max(1, round(self.profile.completions / self.profile.prompts_per_step))

    @property
    def tokens_per_completion(self) -> float:
        return self.profile.tokens / max(self.profile.completions, 1.0)

    def call(self, groups: int) -> CallCost:
        p, lay = self.profile, self.layout
        tokens = p.tokens / p.prompts_per_step * groups
        # one replica's cost of this call: devices = its threads (gen_s divides the call's tokens by them)
        seconds = p.gen_call_s + (p.gen_s(lay.threads, lay.threads) - p.gen_call_s) * tokens / p.tokens
        if lay.placement == "colocated":
            seconds *= colocated_slowdown(p)
        if lay.stream:
            seconds *= stream_speedup(p)
        return CallCost(groups * self.completions_per_group, seconds, 0.0)

    def decode_step_s(self, batch: int) -> float:
        return 0.0

    def score_s(self, groups: int) -> float:
        return self.profile.reward_s

    def train_s(self, groups: int) -> float:
        p = self.profile
        whole = p.train_s(self.layout.trainer_devices, self.layout.threads)
        return p.train_fixed_s + (whole - p.train_fixed_s) * groups / p.prompts_per_step

    def sync_s(self) -> float:
        return self.profile.sync_s(self.layout.ranks)

    def checkpoint_s(self) -> float:
        return 0.0

    def switch_s(self) -> float:
        return self.profile.switch_s if self.layout.placement == "colocated" else 0.0

    def restart_s(self) -> float:
        return 0.0

    def overhead_s(self) -> float:
        return self.profile.overhead_s


def layout_policy(profile: Profile, layout: Layout) -> PolicyConfig:
    """The ``PolicyConfig`` a run of ``layout`` gets: one replica a rollout device (shared: one replica)."""
    replicas = 1 if layout.placement == "shared" else layout.rollout_devices
    k = layout.k if layout.mode == "async" else 0
    return PolicyConfig(k, profile.prompts_per_step, replicas, colocated=layout.placement == "colocated")


def simulate_layout(profile: Profile, layout: Layout, steps: int = 8) -> SimResult:
    """``steps`` simulated steps of ``layout`` with the profile's costs."""
    return simulate(layout_policy(profile, layout), ProfileCosts(profile, layout), steps)


def rank(profile: Profile, devices: int, ks: tuple[int, ...] = (1,), steps: int = 8) -> list[Prediction]:
    """Every layout of ``devices`` devices (``model.layouts``), simulated ``steps`` steps with the profile's costs,
    fastest median step (after two warm-up steps) first; ties: smaller k (fresher data). Step, throughput and
    idle fractions are the simulator's; the bottleneck and the phases are the laws' (``model.predict``)."""
    stream = profile.gen_occupancy is not None
    found = layouts(devices, profile.prompts_per_step, ks, profile.cpu, stream)
    if not found:
        raise ValueError(
            f"no layout of {devices} devices divides run.prompts_per_step={profile.prompts_per_step}; "
            "use more devices or a prompts_per_step divisible by the replica count"
        )
    preds = [simulated(profile, lay, steps) for lay in found]
    return sorted(preds, key=lambda p: (round(p.step_s, 9), p.layout.k))


def simulated(profile: Profile, layout: Layout, steps: int = 8) -> Prediction:
    """``layout``'s row of the plan: the laws' prediction with the simulator's step, throughput and idle."""
    laws = predict(profile, layout)
    result = simulate_layout(profile, layout, steps)
    steady = result.steps[2:] or result.steps
    step = result.step_s(skip=2)
    idle_rollout = sum(s.rollout_idle_s / s.replicas / s.step_s for s in steady) / len(steady)
    idle_trainer = sum(s.trainer_idle_s / s.step_s for s in steady) / len(steady)
    return Prediction(
        layout,
        step,
        profile.completions / step,
        profile.tokens / step,
        laws.bottleneck,
        idle_rollout,
        idle_trainer,
        laws.phases,
        laws.step_s,
    )
