"""Weight sync into a real vLLM engine (RolloutActor in Ray, CPU), through each CPU backend.

One engine serves the whole module: the transport is picked at init, so the same engine takes
shm, then broadcast, then pull. Each test syncs from the driver with the real ``TrainerSync``.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
import torch

from relayrl.config import ModelConfig, RolloutConfig, WeightSyncConfig
from relayrl.data import Prompt
from relayrl.models.digest import model_digest
from relayrl.rollout import start_rollout_actor
from relayrl.rollout.engine import WATCHDOG_STAGES
from relayrl.weightsync.base import StateDictSource
from relayrl.weightsync.client import WeightSyncError
from relayrl.weightsync.store import FetchError
from relayrl.weightsync.sync import TrainerSync
from tests.rollout.reference import hf_logprobs, perturbed

PROBE = [269, 266, 455, 270, 356, 33, 343, 226, 493, 395, 231, 425, 450, 35]
PROMPT = [Prompt(0, "What is 1 + 2? Answer:")]
NOISE = 0.02  # per-element std, about the size of the random init (std 0.02)
TIMEOUT_S = 2.0
BACKENDS = ["shm", "broadcast", "pull"]


@pytest.fixture(scope="module")
def actor(ray_session, tiny_llama):
    handle = start_rollout_actor(
        str(tiny_llama),
        ModelConfig(path=str(tiny_llama), max_model_len=256),
        RolloutConfig(max_tokens=8, kv_cache_gb=0.25),
        seed=0,
    )
    info = ray_session.get(handle.info.remote())
    assert info["model_digest"] == model_digest(tiny_llama)  # what the driver checks every engine's copy against
    yield handle
    ray_session.get(handle.shutdown.remote())
    ray_session.kill(handle)


@pytest.fixture(scope="module", params=BACKENDS)
def pusher(request, actor, tmp_path_factory):
    cfg = WeightSyncConfig(
        backend=request.param,
        timeout_s=TIMEOUT_S,
        bucket_mb=1,
        shm_dir=str(tmp_path_factory.mktemp("shm")),
        pull_dir=str(tmp_path_factory.mktemp("pull")),
    )
    source = StateDictSource({})
    sync = TrainerSync(cfg, source, rank=0, rollouts=[actor], workers=[1])
    yield sync, source
    sync.close()


def push(pusher, weights: dict[str, torch.Tensor], version: int) -> dict[str, float]:
    sync, source = pusher
    source.state_dict = weights
    return sync.sync(version)


def next_version(actor, ray_session) -> int:
    return ray_session.get(actor.weight_version.remote()) + 1


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""vLLM parameter -> the checkpoint tensors it holds, stacked along dim 0 in this order."""


def expected_digests(weights: dict[str, torch.Tensor]) -> dict[str, str]:
    """sha256 of what every engine parameter must hold after loading ``weights`` (fp32, fused as vLLM fuses)."""
    out = {}
    for name, t in weights.items():
        for fused, parts in FUSED.items():
            if f".{parts[0]}." in name:
                stacked = torch.cat([weights[name.replace(parts[0], p)].float() for p in parts])
                out[name.replace(parts[0], fused)] = _sha(stacked)
        if not any(f".{p}." in name for parts in FUSED.values() for p in parts):
            out[name] = _sha(t.float())
    return out


PACKED_DIRECT = {
    f"model.layers.{i}.{m}.weight" for i in (0, 1) for m in ("mlp.gate_up_proj", "mlp.down_proj", "self_attn.o_proj")
}
"""tiny-llama linears whose tensors lie end to end in a payload laid out in ``perturbed``'s (sorted) order."""


def check_round_trip(actor, ray_session, tiny_llama, weights, version, stats) -> None:
    """Every engine parameter holds exactly what was sent; logprobs are the reference model's; tokens carry
    the version. (``commit=reload`` engines keep linear weights only in packed GEMM copies: those have no
    digest, and the logprobs check them.)"""
    digests = ray_session.get(actor.param_digests.remote())
    expected = expected_digests(weights)
    assert {k: v for k, v in expected.items() if k in digests} == {k: digests[k] for k in expected if k in digests}
    assert len(set(expected) & set(digests)) >= 6  # embeddings and norms at least, whatever the path
    got = torch.tensor(ray_session.get(actor.prompt_logprobs.remote(PROBE)))
    ref = hf_logprobs(tiny_llama, PROBE, state_dict={k: v.float() for k, v in weights.items()})
    assert torch.allclose(got, ref, atol=1e-3), (got - ref).abs().max()
    assert ray_session.get(actor.weight_version.remote()) == version == stats["weightsync/version"]
    for t in ray_session.get(actor.generate.remote(PROMPT, 3))[0].trajectories:
        assert [(s.version, s.start, s.end) for s in t.versions] == [(version, 0, len(t.completion_token_ids))]
    assert stats["weightsync/bytes"] >= sum(v.numel() * v.element_size() for v in weights.values())


@pytest.mark.parametrize("wire", [torch.float32, torch.bfloat16])
def test_round_trip_is_bit_exact_and_versioned(pusher, actor, ray_session, tiny_llama, wire):
    """What the engine holds equals what was sent, bit for bit, and new tokens carry the version.

    A bf16 payload lands in the fp32 engine as exactly the bf16 values (the layout was planned in fp32,
    so it travels as fp32). With the default ``weightsync.commit=inplace`` a linear whose tensors lie end
    to end in the payload in the engine's dtype is packed straight from it and its parameter emptied
    (``commit.direct_sources``): here gate/up (adjacent in this dict's order), o_proj and down_proj. Every
    other parameter is compared bit for bit, q/k/v included (not adjacent in this dict: copied as before);
    the logprobs check the packed ones. The tests before this one already loaded a version, so this one
    also proves a second in-place load replaces the first.
    """
    version = next_version(actor, ray_session)
    weights = {k: v.to(wire) for k, v in perturbed(tiny_llama, NOISE, seed=version).items()}
    stats = push(pusher, weights, version)
    digests = ray_session.get(actor.param_digests.remote())
    check_round_trip(actor, ray_session, tiny_llama, weights, version, stats)
    assert "model.layers.0.self_attn.qkv_proj.weight" in digests  # q/k/v not end to end: copied
    assert not PACKED_DIRECT & set(digests)  # packed from the payload, emptied
    assert set(expected_digests(weights)) - PACKED_DIRECT <= set(digests)
    print(
        f"\n{pusher[0].cfg.backend} {wire}: "
        + ", ".join(f"{k.split('/')[1]}={v * 1e3:.1f}ms" for k, v in stats.items() if k.endswith("_s"))
    )


def test_a_layout_that_needs_copies_gives_the_linears_their_weights_back(actor, ray_session, tiny_llama, tmp_path):
    """After direct packs emptied some linears (the test above), a transfer whose layout is bf16 (no run in the
    fp32 engine's dtype) must re-allocate those weights and copy into them: every parameter, the emptied ones
    included, then holds exactly the bf16 values sent."""
    cfg = WeightSyncConfig(backend="shm", timeout_s=TIMEOUT_S, bucket_mb=1, shm_dir=str(tmp_path))
    version = next_version(actor, ray_session)
    weights = perturbed(tiny_llama, NOISE, seed=200 + version)
    sync = TrainerSync(cfg, StateDictSource(weights), rank=0, rollouts=[actor], workers=[1], wire_dtype="bfloat16")
    try:
        stats = sync.sync(version)
    finally:
        sync.close()
    sent = {k: v.to(torch.bfloat16) for k, v in weights.items()}
    check_round_trip(actor, ray_session, tiny_llama, sent, version, stats)
    digests = ray_session.get(actor.param_digests.remote())
    assert set(expected_digests(sent)) <= set(digests)


def test_reload_commit_loads_the_same_model(ray_session, tiny_llama, tmp_path):
    """``weightsync.commit=reload`` (vLLM's reload_weights, tied lm_head re-tied after it): two versions in a
    row land, each equal to the reference model's logprobs."""
    handle = start_rollout_actor(
        str(tiny_llama),
        ModelConfig(path=str(tiny_llama), max_model_len=256),
        RolloutConfig(max_tokens=8, kv_cache_gb=0.25),
        seed=0,
        sync_cfg=WeightSyncConfig(commit="reload"),
    )
    cfg = WeightSyncConfig(backend="shm", commit="reload", timeout_s=30, bucket_mb=1, shm_dir=str(tmp_path))
    source = StateDictSource({})
    sync = TrainerSync(cfg, source, rank=0, rollouts=[handle], workers=[1])
    try:
        assert "model.layers.0.self_attn.qkv_proj.weight" not in ray_session.get(handle.param_digests.remote())
        for version in (1, 2):
            weights = perturbed(tiny_llama, NOISE, seed=300 + version)
            source.state_dict = weights
            check_round_trip(handle, ray_session, tiny_llama, weights, version, sync.sync(version))
    finally:
        sync.close()
        ray_session.get(handle.shutdown.remote())
        ray_session.kill(handle)


class StallingSource(StateDictSource):
    """Yields the first tensors, then stalls like a trainer rank stuck in a gather."""

    def __init__(self, state_dict, stall_s: float, after: int = 3):
        super().__init__(state_dict)
        self.stall_s, self.after = stall_s, after

    def __iter__(self):
        for i, item in enumerate(self.state_dict.items()):
            if i == self.after:
                time.sleep(self.stall_s)
            yield item


def assert_still_serving(actor, ray_session, version: int, logprobs: list[float]) -> None:
    assert ray_session.get(actor.weight_version.remote()) == version
    assert ray_session.get(actor.prompt_logprobs.remote(PROBE)) == logprobs
    for t in ray_session.get(actor.generate.remote(PROMPT, 2), timeout=60)[0].trajectories:
        assert t.completion_token_ids and all(s.version == version for s in t.versions)


def test_stalled_transfer_times_out_and_the_engine_keeps_its_version(pusher, actor, ray_session, tiny_llama):
    sync, source = pusher
    old = next_version(actor, ray_session) - 1
    before = ray_session.get(actor.prompt_logprobs.remote(PROBE))
    weights = perturbed(tiny_llama, NOISE, seed=100)
    stalled = StallingSource(weights, stall_s=TIMEOUT_S + 1.5)
    sync.source = stalled  # the next connect plans from it; the live engine reads it
    if sync.engine is not None:
        sync.engine.source = stalled
    with pytest.raises(WeightSyncError, match=f"weight sync v{old + 1}.*(timed out|took|failed)"):
        sync.sync(old + 1)  # the stalled source would finish (TIMEOUT_S + 1.5 s): only a deadline fails it
    assert_still_serving(actor, ray_session, old, before)
    sync.source = source  # a healthy sync afterwards lands (re-initialising if needed)
    assert push(pusher, weights, old + 1)["weightsync/version"] == old + 1
    assert ray_session.get(actor.weight_version.remote()) == old + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_trainer_mid_transfer_leaves_the_engine_serving(actor, ray_session, tiny_llama, tmp_path, backend):
    """SIGKILL the sending process mid-transfer: nobody is left to abort, so the engine's own
    watchdog must end the update and resume on the old version. The update must be open when the
    sender dies (else there is nothing to abort and the engine serves anyway), and it must be the
    watchdog that closes it."""
    import ray

    @ray.remote(num_cpus=0)
    class Sender:
        def __init__(self, cfg, weights):
            self.sync = TrainerSync(cfg, StallingSource(weights, stall_s=600), 0, [actor], [1])

        def sync_weights(self, version):
            return self.sync.sync(version)

    def state() -> dict:
        return ray_session.get(actor.weight_update_state.remote())

    old = next_version(actor, ray_session) - 1
    before = ray_session.get(actor.prompt_logprobs.remote(PROBE))
    aborts = state()["aborts"]
    cfg = WeightSyncConfig(
        backend=backend, timeout_s=TIMEOUT_S, bucket_mb=1, shm_dir=str(tmp_path), pull_dir=str(tmp_path)
    )
    # attr-defined: ray's stubs keep a decorated class's own type, which has no .remote
    sender = Sender.remote(cfg, perturbed(tiny_llama, NOISE, seed=200))  # type: ignore[attr-defined]
    ref = sender.sync_weights.remote(old + 1)
    deadline = time.time() + 120  # the sender's actor and its connect start first
    while state()["open"] != old + 1 and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(TIMEOUT_S / 2)  # engine paused, transfer under way (the source stalls after 3 tensors)
    ray.kill(sender)
    assert state()["open"] == old + 1, "no update was open when the sender died"
    with pytest.raises(ray.exceptions.RayActorError):
        ray_session.get(ref)
    time.sleep(WATCHDOG_STAGES * TIMEOUT_S + 1)  # the watchdog fires that long after the update's start
    after = state()
    assert after["open"] is None and after["aborts"] == aborts + 1
    assert after["last_abort"] == f"v{old + 1}: no commit within {WATCHDOG_STAGES * TIMEOUT_S:g}s (watchdog)"
    assert_still_serving(actor, ray_session, old, before)


def flip_a_payload_byte(root: Path, version: int) -> None:
    with open(root / f"v{version}" / "payload.bin", "r+b") as f:
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 0x01]))


STORE_DAMAGE = {
    "flipped byte": (flip_a_payload_byte, "fails its xxh3_128 checksum"),
    "missing store": (
        lambda root, version: root.rename(root.with_name("unmounted")),
        "is unreachable from this engine",
    ),
}


@pytest.mark.parametrize("damage", STORE_DAMAGE)
def test_a_damaged_pull_store_is_refused_and_the_engine_keeps_serving(
    actor, ray_session, tiny_llama, tmp_path, damage, monkeypatch
):
    """The trainer publishes the version whole, then the store is damaged before the engine fetches it (a byte of
    the payload flipped; the store gone from the engine's host). The engine refuses in one line before anything is
    staged, the sync aborts, and the engine keeps serving the old version with the old weights (its logprobs are
    the ones before); the same version then lands from a healthy store."""
    root = tmp_path / "store"
    root.mkdir()
    cfg = WeightSyncConfig(backend="pull", pull_dir=str(root), timeout_s=TIMEOUT_S, bucket_mb=1)
    old = next_version(actor, ray_session) - 1
    before = ray_session.get(actor.prompt_logprobs.remote(PROBE))
    sync = TrainerSync(cfg, StateDictSource(perturbed(tiny_llama, NOISE, seed=400 + old)), 0, [actor], [1])
    harm, message = STORE_DAMAGE[damage]
    fetch = sync.client.update_weights

    def damaged_then_fetch(info):
        harm(root, info["version"])
        fetch(info)

    monkeypatch.setattr(sync.client, "update_weights", damaged_then_fetch)
    try:
        with pytest.raises(
            WeightSyncError, match=f"v{old + 1}: stage 'receive' failed on rollout replica 0: .*{message}"
        ) as err:
            sync.sync(old + 1)
        assert "\n" not in str(err.value)
        assert_still_serving(actor, ray_session, old, before)
        if damage == "missing store":
            root.with_name("unmounted").rename(root)
        monkeypatch.setattr(sync.client, "update_weights", fetch)
        assert sync.sync(old + 1)["weightsync/version"] == old + 1
        assert ray_session.get(actor.prompt_logprobs.remote(PROBE)) != before
    finally:
        sync.close()


def test_pull_when_admission_publishes_and_the_engine_fetches_the_newest_on_its_next_call(
    actor, ray_session, tiny_llama, tmp_path
):
    """``weightsync.pull_when=admission``: a sync only publishes (the engine still serves the old version, with
    the old weights); the next call that needs v+1 makes the engine fetch the newest published version, v+2, whose
    weights it then holds bit for bit and whose label its tokens carry. A call needing a version it already has
    fetches nothing. A damaged v+3 is refused in one ``FetchError`` line (its class crosses the engine host and
    Ray, which the scheduler relies on) with the engine still serving v+2, and the store mended, it lands."""
    root = tmp_path / "store"
    root.mkdir()
    cfg = WeightSyncConfig(backend="pull", pull_dir=str(root), pull_when="admission", timeout_s=TIMEOUT_S, bucket_mb=1)
    old = next_version(actor, ray_session) - 1
    before = ray_session.get(actor.prompt_logprobs.remote(PROBE))
    source = StateDictSource(perturbed(tiny_llama, NOISE, seed=500 + old))
    sync = TrainerSync(cfg, source, 0, [actor], [1])
    try:
        sync.sync(old + 1)
        assert (root / f"v{old + 1}" / "payload.bin").is_file()
        assert_still_serving(actor, ray_session, old, before)
        source.state_dict = newest = perturbed(tiny_llama, NOISE, seed=600 + old)
        stats = sync.sync(old + 2)
        assert ray_session.get(actor.weight_version.remote()) == old
        (group,) = ray_session.get(actor.generate.remote(PROMPT, 2, old + 1), timeout=60)
        assert all(s.version == old + 2 for t in group.trajectories for s in t.versions)
        check_round_trip(actor, ray_session, tiny_llama, newest, old + 2, stats)
        aborts = ray_session.get(actor.weight_update_state.remote())["aborts"]
        ray_session.get(actor.generate.remote(PROMPT, 1, old + 2), timeout=60)  # current: nothing to fetch
        sync.sync(old + 3)
        flip_a_payload_byte(root, old + 3)
        with pytest.raises(ray_session.exceptions.RayTaskError) as err:
            ray_session.get(actor.generate.remote(PROMPT, 1, old + 3), timeout=60)
        assert isinstance(err.value.cause, FetchError), err.value
        line = str(err.value.cause)
        assert "\n" not in line and f"could not fetch v{old + 3} or newer" in line and "xxh3_128 checksum" in line
        assert ray_session.get(actor.weight_update_state.remote())["aborts"] == aborts + 1
        assert ray_session.get(actor.weight_version.remote()) == old + 2
        sync.sync(old + 3)  # published again, whole
        ray_session.get(actor.generate.remote(PROMPT, 1, old + 3), timeout=60)
        assert ray_session.get(actor.weight_version.remote()) == old + 3
    finally:
        sync.close()


LONG_PROMPT = [Prompt(1, "Question: " + " ".join(f"{i} plus {i + 1} is" for i in range(12)) + " what? Answer:")]
"""Over one 32-token KV block of the tiny tokenizer, so that ``rollout.prefix_sharing`` caches part of it."""


def test_group_after_a_sync_reads_no_prompt_kv_of_the_old_weights(pusher, actor, ray_session, tiny_llama):
    """``rollout.prefix_sharing`` (on): the same prompt before and after a sync. The second group's behaviour
    logprobs equal a reference model's with the new weights; a prefix cache kept through the commit would
    serve the prompt's first block from the old weights and miss by far more than the tolerance."""
    before = ray_session.get(actor.generate.remote(LONG_PROMPT, 4))[0].trajectories[0]
    assert len(before.prompt_token_ids) > 33
    version = next_version(actor, ray_session)
    weights = perturbed(tiny_llama, NOISE, seed=100 + version)
    push(pusher, weights, version)
    for t in ray_session.get(actor.generate.remote(LONG_PROMPT, 4))[0].trajectories:
        ids = t.prompt_token_ids + t.completion_token_ids
        ref = hf_logprobs(tiny_llama, ids, state_dict=weights)[len(t.prompt_token_ids) - 1 :]
        got = torch.tensor(t.behaviour_logprobs)
        assert torch.allclose(got, ref, atol=1e-3), (got - ref).abs().max()
