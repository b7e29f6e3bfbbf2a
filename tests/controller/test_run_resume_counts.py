"""Prompt accounting across a resume with ``buffer.drop_stale=true``: the scheduler's restored dropped
count survives the buffer's own count restarting at zero. The real ``Scheduler`` and ``ReplayBuffer``
run in this process: ``ray`` in the scheduler module is swapped for a stand-in that calls methods
directly (no Ray, no actors)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import relayrl.controller.scheduler as scheduler_module
from relayrl.config import load_config
from relayrl.controller.buffer import Entry
from relayrl.controller.scheduler import Scheduler


class _Direct:
    """An actor handle stand-in: ``handle.method.remote(*a)`` runs ``obj.method(*a)`` now."""

    def __init__(self, obj):
        self.obj = obj

    def __getattr__(self, name):
        return SimpleNamespace(remote=getattr(self.obj, name))


def _remote(cls):
    """``ray.remote(cls).options(...).remote(*args)`` -> ``_Direct(cls(*args))``."""
    return SimpleNamespace(options=lambda **_: SimpleNamespace(remote=lambda *a: _Direct(cls(*a))))


FAKE_RAY = SimpleNamespace(get=lambda value: value, remote=_remote)


class _Sampler:
    def load_state_dict(self, state: dict) -> None:
        self.state = state


def test_dropped_count_is_kept_across_a_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(scheduler_module, "ray", FAKE_RAY)
    cfg = load_config("grpo_tiny", ["mode=async", "buffer.max_staleness=1", "buffer.drop_stale=true",
                                    "run.prompts_per_step=2", "logging.wandb=disabled"])
    system = SimpleNamespace(rollouts=[object()], sampler=_Sampler())
    sched = Scheduler(cfg, system, SimpleNamespace(path=tmp_path))
    # the checkpoint at step 5: 14 issued, 10 trained, 4 dropped before the crash; 2 seqs a step
    sched.restore({"step": 5, "sampler": {}, "pending": [], "seq": 10,
                   "counts": {"issued": 14, "trained": 10, "dropped": 4}})
    buffer = sched.buffer.obj
    buffer.put(Entry(10, None, [20, 21], min_version=2, max_version=2))    # too stale at v5 (k=1): dropped
    buffer.put(Entry(11, None, [22, 23], min_version=5, max_version=5))
    entries = buffer.take(5, 2)
    sched._account(entries, buffer.stats())
    assert buffer.stats()["buffer/dropped/stale>1"] == 2                   # the buffer counts from zero
    assert sched.counts == {"issued": 14, "trained": 12, "dropped": 6}
    assert json.loads((tmp_path / "prompts.jsonl").read_text()) == {"step": 6, "prompt_ids": [22, 23]}
