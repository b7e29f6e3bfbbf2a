"""Weight sync into a vLLM engine split by pipeline (``rollout.pp_size=2``, CPU): two workers, each holding one
of tiny-llama's two layers (the first also the embedding, the last the norm and LM head).

Each worker receives the whole version and keeps its own layers; the engine commits only when both have it. What
the tests assert: after a sync the engine scores exactly like transformers with the weights sent (so both stages
took theirs), and a transfer that stalls past its deadline leaves both stages on the old version.
"""

from __future__ import annotations

import pytest
import torch

from relayrl.config import ModelConfig, RolloutConfig, WeightSyncConfig
from relayrl.rollout import start_rollout_actor
from relayrl.weightsync.base import StateDictSource
from relayrl.weightsync.client import WeightSyncError
from relayrl.weightsync.sync import TrainerSync
from tests.rollout.reference import hf_logprobs, perturbed
from tests.weightsync.test_engine_sync import NOISE, PROBE, PROMPT, TIMEOUT_S, StallingSource, assert_still_serving

pytestmark = pytest.mark.slow  # a compiled two-worker engine: ~45 s to start on CPU
STAGES = 2


@pytest.fixture(scope="module")
def pp_actor(ray_session, tiny_llama):
    rollout = RolloutConfig(max_tokens=8, kv_cache_gb=0.25, pp_size=STAGES, enforce_eager=False)
    handle = start_rollout_actor(str(tiny_llama), ModelConfig(path=str(tiny_llama), max_model_len=256), rollout, 0)
    info = ray_session.get(handle.info.remote())
    assert info["workers"] == STAGES  # one receiver per pipeline stage
    yield handle
    ray_session.get(handle.shutdown.remote())
    ray_session.kill(handle)


@pytest.mark.parametrize("backend", ["shm", "broadcast"])
def test_every_stage_takes_its_layers_of_a_version(pp_actor, ray_session, tiny_llama, tmp_path, backend):
    version = ray_session.get(pp_actor.weight_version.remote()) + 1
    weights = perturbed(tiny_llama, NOISE, seed=version)
    before = torch.tensor(ray_session.get(pp_actor.prompt_logprobs.remote(PROBE)))
    cfg = WeightSyncConfig(backend=backend, timeout_s=30, bucket_mb=1, shm_dir=str(tmp_path))
    sync = TrainerSync(cfg, StateDictSource(weights), rank=0, rollouts=[pp_actor], workers=[STAGES])
    try:
        stats = sync.sync(version)
    finally:
        sync.close()
    got = torch.tensor(ray_session.get(pp_actor.prompt_logprobs.remote(PROBE)))
    ref = hf_logprobs(tiny_llama, PROBE, state_dict=weights)
    assert torch.allclose(got, ref, atol=1e-3), (got - ref).abs().max()
    assert (got - before).abs().max() > 1e-2  # the version changed what the engine computes
    assert ray_session.get(pp_actor.weight_version.remote()) == version == stats["weightsync/version"]
    for t in ray_session.get(pp_actor.generate.remote(PROMPT, 2))[0].trajectories:
        assert [s.version for s in t.versions] == [version]


def test_a_stalled_transfer_leaves_both_stages_on_the_old_version(pp_actor, ray_session, tiny_llama, tmp_path):
    old = ray_session.get(pp_actor.weight_version.remote())
    before = ray_session.get(pp_actor.prompt_logprobs.remote(PROBE))
    cfg = WeightSyncConfig(backend="shm", timeout_s=TIMEOUT_S, bucket_mb=1, shm_dir=str(tmp_path))
    stalled = StallingSource(perturbed(tiny_llama, NOISE, seed=500), stall_s=TIMEOUT_S + 1.5)
    sync = TrainerSync(cfg, stalled, rank=0, rollouts=[pp_actor], workers=[STAGES])
    try:
        with pytest.raises(WeightSyncError, match=f"weight sync v{old + 1}.*(timed out|took|failed)"):
            sync.sync(old + 1)
    finally:
        sync.close()
    assert_still_serving(pp_actor, ray_session, old, before)
