"""Prompt accounting across a resume with ``buffer.drop_stale=true``: the restored dropped count survives
the buffer's own count restarting at zero. The real ``StepPolicy`` (the scheduler's decisions, Ray-free)
is restored from a checkpoint's state and fed two scored chunks, the first too stale to train."""

from __future__ import annotations

from relayrl.config import load_config
from relayrl.controller.buffer import Entry
from relayrl.controller.policy import PolicyConfig, StepPolicy
from relayrl.data.sampler import Prompt


class _Sampler:
    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


def test_dropped_count_is_kept_across_a_resume():
    cfg = load_config(
        "grpo_tiny",
        [
            "mode=async",
            "buffer.max_staleness=1",
            "buffer.drop_stale=true",
            "run.prompts_per_step=2",
            "logging.wandb=disabled",
        ],
    )
    policy = StepPolicy(PolicyConfig.from_config(cfg, replicas=1), list, _Sampler())
    # the checkpoint at step 5: 14 issued, 10 trained, 4 dropped before the crash; 2 seqs a step
    policy.load_state_dict(
        {"step": 5, "sampler": {}, "pending": [], "seq": 10, "counts": {"issued": 14, "trained": 10, "dropped": 4}}
    )
    policy.outstanding = {10: [Prompt(20, ""), Prompt(21, "")], 11: [Prompt(22, ""), Prompt(23, "")]}
    policy.on_scored(Entry(10, None, [20, 21], min_version=2, max_version=2))  # too stale at v5 (k=1)
    policy.on_scored(Entry(11, None, [22, 23], min_version=5, max_version=5))
    assert [e.seq for e in policy.take_step().entries] == [11]
    assert policy.on_trained() == [22, 23]
    assert policy.buffer.stats()["buffer/dropped/stale>1"] == 2  # the buffer counts from zero
    assert policy.counts == {"issued": 14, "trained": 12, "dropped": 6}
