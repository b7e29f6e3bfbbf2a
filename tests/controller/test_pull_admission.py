"""``weightsync.pull_when=admission``: a sync publishes each version to the pull store and each replica fetches
it when a call needs it. One tiny run on Ray (real vLLM engine, trainer rank, reward pool) shows the tokens
were sampled by the version each step needed; the scheduler's answer to a replica that cannot fetch is checked
on the real ``StepPolicy`` with the Ray plumbing left out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from relayrl.controller.faults import GenerateError
from relayrl.controller.policy import PolicyConfig, StepPolicy
from relayrl.controller.scheduler import Scheduler
from relayrl.monitor.schema import schema_gaps
from relayrl.weightsync.store import FetchError, version_dirs
from tests.controller.test_buffer import Counter
from tests.controller.tiny_run import train_tiny


@pytest.mark.slow
def test_a_sync_run_that_pulls_on_admission_samples_every_step_with_its_version(ray_session, tiny_llama, tmp_path):
    """mode=sync (Echo's sequential pull): every step's tokens carry the version the step trains on (staleness 0,
    which the engine's own version labels decide), so the replica fetched each version before generating. The
    post-sync probe and the evaluation (every 2 steps) fetch before they ask, and agree with the trainer; v1 and v3
    reach the engine only through the calls that need them;
    the store keeps the newest ``pull_keep`` versions; the sync logs its publish and none of the push's stages."""
    store = tmp_path / "store"
    store.mkdir()
    run = train_tiny(
        tiny_llama,
        tmp_path / "runs",
        [
            "weightsync.backend=pull",
            "weightsync.pull_when=admission",
            f"weightsync.pull_dir={store}",
            "weightsync.verify_every=2",
            "eval.every=2",
            "eval.samples=2",
        ],
    )
    assert [r["step"] for r in run.rows if "eval/mean_reward" in r] == [0, 2, 4]  # before step 1, then every 2
    rows = [r for r in run.rows if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["weightsync/version"] == r["step"] and r["staleness/max"] == 0 for r in rows)
    assert [r["step"] for r in rows if r.get("mismatch/mean_abs", 1.0) < 0.05] == [2, 4]
    assert sorted(version_dirs(store)) == [3, 4]
    keys = {k for r in run.rows for k in r}
    undocumented, missing = schema_gaps(keys, {"verify", "first_sync", "first_step", "publish", "eval"})
    assert undocumented == [] and missing == []
    assert not any("weightsync/commit_s" in r for r in rows)


def _scheduler(replicas: int) -> Scheduler:
    """A ``Scheduler`` holding only what ``_cannot_fetch`` reads: a real policy with one chunk generating."""
    policy = StepPolicy(PolicyConfig(max_staleness=0, prompts_per_step=2, replicas=replicas), Counter(1).next_batch)
    s = Scheduler.__new__(Scheduler)
    s.policy, s.idle = policy, []
    s.members = SimpleNamespace(serving=policy.replicas.serving())  # type: ignore[assignment] # a stand-in
    return s


def test_a_replica_that_cannot_fetch_hands_its_call_back_and_leaves(monkeypatch):
    """Two replicas: the one whose fetch failed gets no more work and its chunk is generated again (same seq) by
    the other; its slot is freed. Alone, it stops the run with one line naming the replica and the cause."""
    s = _scheduler(2)
    (flight, other) = s.policy.launches([0, 1], 0.0)
    error = FetchError("could not fetch v1 or newer: pull v1: fails its xxh3_128 checksum")
    s._cannot_fetch(flight, error)
    assert s.policy.replicas.serving() == [other.replica] and s.idle == [flight.replica]
    (again,) = s.policy.launches([other.replica], 1.0)
    assert again.seq == flight.seq and again.prompt_ids == flight.prompt_ids and again.replica == other.replica

    alone = _scheduler(1)
    (flight,) = alone.policy.launches([0], 0.0)
    with pytest.raises(GenerateError, match="xxh3_128 checksum") as err:
        alone._cannot_fetch(flight, error)
    assert "\n" not in str(err.value)
