"""shm weight sync into a real vLLM engine (RolloutActor in Ray, CPU): exact, versioned, repeatable."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import torch

from relayrl.config import ModelConfig, RolloutConfig
from relayrl.rollout import start_rollout_actor
from relayrl.weightsync import ShmSender
from tests.rollout.reference import hf_logprobs, perturbed

PROBE = [269, 266, 455, 270, 356, 33, 343, 226, 493, 395, 231, 425, 450, 35]
PROMPT = [{"prompt_id": 0, "prompt": "What is 1 + 2? Answer:", "columns": {}}]
NOISE = 0.02   # per-element std, about the size of the random init (std 0.02)


@pytest.fixture(scope="module")
def actor(ray_session, tiny_llama):
    handle = start_rollout_actor(str(tiny_llama), ModelConfig(path=str(tiny_llama), max_model_len=256),
                                 RolloutConfig(max_tokens=8, kv_cache_gb=0.25), seed=0)
    ray_session.get(handle.info.remote())
    yield handle
    ray_session.get(handle.shutdown.remote())
    ray_session.kill(handle)


@pytest.fixture(scope="module")
def sender():
    shm_dir = Path(tempfile.mkdtemp(prefix="relayrl-test-", dir="/dev/shm"))
    yield ShmSender(str(shm_dir))
    shutil.rmtree(shm_dir)


@pytest.fixture(scope="module")
def synced_v1(actor, sender, ray_session, tiny_llama):
    """Engine logprobs before and after one sync of perturbed weights at version 1."""
    before = torch.tensor(ray_session.get(actor.prompt_logprobs.remote(PROBE)))
    weights = perturbed(tiny_llama, NOISE, seed=1)
    handle = sender.send(weights, version=1)
    timings = ray_session.get(actor.update_weights.remote(handle, 1))
    print(f"\nsync v1 ({handle.nbytes / 2**20:.2f} MiB, {handle.num_tensors} tensors): "
          + ", ".join(f"{k}={v * 1e3:.1f}ms" for k, v in timings.items()))
    after = torch.tensor(ray_session.get(actor.prompt_logprobs.remote(PROBE)))
    return weights, before, after


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()


def test_engine_matches_transformers_after_sync(synced_v1, tiny_llama):
    weights, before, after = synced_v1
    assert torch.allclose(before, hf_logprobs(tiny_llama, PROBE), atol=1e-3)
    expected = hf_logprobs(tiny_llama, PROBE, state_dict=weights)
    assert torch.allclose(after, expected, atol=1e-3), (after - expected).abs().max()
    assert (after - before).abs().max() > 1e-2


def test_new_tokens_carry_the_synced_version(synced_v1, actor, ray_session):
    assert ray_session.get(actor.weight_version.remote()) == 1
    for t in ray_session.get(actor.generate.remote(PROMPT, 3))[0].trajectories:
        assert [(s.version, s.start, s.end) for s in t.versions] == [(1, 0, len(t.completion_token_ids))]


def test_sync_is_bit_exact(synced_v1, actor, ray_session, tiny_llama):
    """Parameters the engine keeps in checkpoint layout (embedding, norms) equal what was sent, bit for bit.

    (The CPU backend keeps linear weights only in a packed copy; the logprob test covers those.)
    """
    weights, _, _ = synced_v1
    digests = ray_session.get(actor.param_digests.remote())
    expected = {k: _sha(v) for k, v in weights.items() if k.endswith(("embed_tokens.weight", "norm.weight"))}
    assert len(expected) == 6 and {k: digests.get(k) for k in expected} == expected
    original = perturbed(tiny_llama, 0.0, seed=0)
    assert digests["model.embed_tokens.weight"] != _sha(original["model.embed_tokens.weight"])


def test_second_sync_lands_and_removes_the_previous_file(synced_v1, actor, sender, ray_session, tiny_llama):
    v1_files = list(sender.dir.iterdir())
    weights = perturbed(tiny_llama, NOISE, seed=2)
    t0 = time.perf_counter()
    ray_session.get(actor.update_weights.remote(sender.send(weights, version=2), 2))
    print(f"\nsync v2 round trip from the driver: {(time.perf_counter() - t0) * 1e3:.1f}ms")
    got = torch.tensor(ray_session.get(actor.prompt_logprobs.remote(PROBE)))
    assert torch.allclose(got, hf_logprobs(tiny_llama, PROBE, state_dict=weights), atol=1e-3)
    assert ray_session.get(actor.weight_version.remote()) == 2
    assert [p.name for p in sender.dir.iterdir()] == ["relayrl-%s-v2.safetensors" % sender.tag]
    assert not any(p.exists() for p in v1_files)
