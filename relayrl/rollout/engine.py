"""The engine side of a rollout: one vLLM ``AsyncLLM`` and the calls the controller and trainers make on it.

``Rollout`` runs where its ``RolloutActor`` puts it (``relayrl.rollout.actor``): in the actor's own process,
or, for a CPU engine with ``rollout.forkserver``, in an engine host forked from the preloaded server
(``relayrl.rollout.host``). Both import it from here, below either of them, so neither imports the other
back. vLLM itself is imported only when a ``Rollout`` is built, with the engine arguments of
``relayrl.rollout.engine_args``.

Every completion token is tagged with the weight version that sampled it; vLLM itself reports
these as contiguous spans (``CompletionOutput.weight_versions``), so a completion that straddles
an in-flight update carries two spans. Behaviour logprobs are those of the *sampling*
distribution (``logprobs_mode="processed_logprobs"``: after temperature and top-p), which is
what importance ratios pi/mu need.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Literal, TypeVar

from relayrl.config import ModelConfig, RolloutConfig, WeightSyncConfig, has_cuda
from relayrl.data.lengths import row_max_tokens
from relayrl.data.sampler import Prompt
from relayrl.envs import env_factory
from relayrl.logs import show_on_console
from relayrl.rollout.engine_args import engine_args
from relayrl.rollout.episode import EpisodeRunner, check_prompts, vllm_sample_turn
from relayrl.rollout.occupancy import Occupancy, engine_memory_gb
from relayrl.rollout.outputs import model_turn, parse_version
from relayrl.rollout.queuepoll import POLL_ENV
from relayrl.types import Trajectory, TrajectoryGroup
from relayrl.vllm_import import import_vllm
from relayrl.weightsync.names import KEEP_ENV

WATCHDOG_STAGES = 3  # an open weight update is aborted after this many stage timeouts
FETCH_TRIES = 3  # a fetch whose version was retired while it read (pull_keep) tries the newer one, this often
DEATH_POLL_S = 0.1  # how often an engine call in flight checks that its engine is alive
T = TypeVar("T")

PauseMode = Literal["abort", "wait", "keep"]
"""How ``Rollout.pause`` treats running requests (vLLM's ``pause_generation`` modes)."""


class Rollout:
    """One vLLM ``AsyncLLM`` and the calls the controller and trainers make on it (``RolloutActor`` runs it in
    its own process or in an engine host)."""

    def __init__(
        self,
        model_path: str,
        model_cfg: ModelConfig,
        rollout_cfg: RolloutConfig,
        seed: int,
        sync_cfg: WeightSyncConfig | None = None,
    ):
        from relayrl.rollout.cleanup import cleanup_engine_segments, use_engine_ipc_dir

        show_on_console()  # INFO lines to this process's stdout: the actor's, which Ray streams
        # On this engine's host, before it starts: the message-queue segments, semaphores and socket directories
        # of engines that died here (a replica this one replaces, earlier runs killed with SIGKILL) go; live
        # ones' stay. This engine's sockets go in a directory of its own, removed at its shutdown.
        self.shm_removed = len(cleanup_engine_segments().removed)
        self.ipc_dir, self.ipc_removed = use_engine_ipc_dir()
        self.rollout_cfg, self.model_path = rollout_cfg, model_path
        self.sync_cfg = sync_cfg or WeightSyncConfig()
        os.environ[KEEP_ENV] = str(int(self.sync_cfg.commit == "inplace"))  # read by the engine's processes
        if rollout_cfg.forkserver:
            os.environ[POLL_ENV] = str(rollout_cfg.queue_poll_us)  # read by the processes the server forks
        import_vllm()
        from vllm.v1.engine.async_llm import AsyncLLM

        self.batch = Occupancy()  # sequences running at each engine step (``occupancy``)
        self.engine = AsyncLLM.from_engine_args(
            engine_args(model_path, model_cfg, rollout_cfg, seed, self.sync_cfg), stat_loggers=[self.batch.logger()]
        )
        self._paused = False
        self._pause_here = False
        self._update: tuple[int, float] | None = None  # (version, start time) of the open weight update
        self._watchdog: asyncio.Task | None = None
        self._pull: tuple[str, str] | None = None  # (store directory, layout digest) of a pull transfer's init
        self._fetching = asyncio.Lock()  # one fetch at a time; calls waiting on it find the version current
        self.aborts = 0  # updates aborted by anyone: trainer, driver or watchdog
        self.last_abort = ""  # the latest one: "v<version>: <reason>"

    async def _call(self, call: Awaitable[T]) -> T:
        return await unless_dead(self.engine, call)

    def info(self) -> dict[str, Any]:
        """vLLM workers in this engine, dead engines' shared-memory segments and socket directories removed before
        it started, this engine's socket directory (None: vLLM's default, the temp dir), the pid
        of this process (the engine's client: the actor's or its engine host's) and the digest of the model
        directory it loaded on this node (``relayrl.models.digest``)."""
        from relayrl.models.digest import model_digest

        return {
            "workers": self.engine.vllm_config.parallel_config.world_size,
            "shm_segments_removed": self.shm_removed,
            "ipc_dirs_removed": self.ipc_removed,
            "ipc_dir": self.ipc_dir,
            "client_pid": os.getpid(),
            "model_digest": model_digest(self.model_path),
        }

    async def generate(self, prompts: list[Prompt], group_size: int, min_version: int = 0) -> list[TrajectoryGroup]:
        """Sample ``group_size`` completions for each prompt, concurrently.

        With ``seed`` (the sampler sets it), sample ``i`` is drawn with its own generator seeded ``seed + i``
        (vLLM gives each of a request's ``n`` children ``seed + index``), independent of the engine's seed,
        its other requests and its history: a restarted replica or a resumed run samples the same tokens
        from the same weights. Without it, the engine's random state is used. A prompt's ``temperature``
        overrides ``rollout.temperature`` for it (0: greedy; evaluation during training uses it). ``min_version``:
        the engine first fetches the newest published version if it serves an older one (``fetch_version``)."""
        check_prompts(prompts, group_size)
        await self.fetch_version(min_version)
        return list(await asyncio.gather(*(self._generate_group(p, group_size) for p in prompts)))

    async def _generate_group(self, prompt: Prompt, group_size: int) -> TrajectoryGroup:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        cfg = self.rollout_cfg
        temperature = cfg.temperature if prompt.temperature is None else prompt.temperature
        max_tokens = row_max_tokens(prompt.columns, cfg.max_tokens)
        params = SamplingParams(
            n=group_size,
            logprobs=0,
            temperature=temperature,
            top_p=cfg.top_p,
            max_tokens=max_tokens,
            min_tokens=min(cfg.min_tokens, max_tokens),
            output_kind=RequestOutputKind.FINAL_ONLY,
            seed=prompt.seed,
        )
        t0 = time.perf_counter()
        if cfg.prefix_sharing and group_size > 1:  # the prompt's KV, computed once, cached for the group
            warm = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY)
            await self._final_output(prompt.prompt, warm)
        final = await self._final_output(prompt.prompt, params)
        seconds = time.perf_counter() - t0
        trajs = [
            _trajectory(prompt.prompt_id, final.prompt_token_ids, c, seconds)
            for c in sorted(final.outputs, key=lambda c: c.index)
        ]
        return TrajectoryGroup(prompt.prompt_id, prompt.prompt, dict(prompt.columns), trajs)

    async def generate_episodes(
        self,
        prompts: list[Prompt],
        group_size: int,
        env_name: str,
        max_turns: int,
        env_kwargs: dict[str, Any] | None = None,
        episode_timeout_s: float | None = None,
        min_version: int = 0,
    ) -> list[TrajectoryGroup]:
        """Multi-turn: ``group_size`` episodes per prompt of environment ``env_name`` (``relayrl.envs``: a
        built-in name or ``module:Class``, built with ``env_kwargs``), model and environment turns alternating
        for up to ``max_turns`` model turns, each episode ending by ``episode_timeout_s``. Environment tokens are
        masked (``relayrl.rollout.episode``). ``min_version`` as in ``generate``."""
        await self.fetch_version(min_version)
        runner = EpisodeRunner(
            vllm_sample_turn(self._final_output, self.rollout_cfg),
            self.engine.tokenizer,
            max_turns,
            self.rollout_cfg.max_tokens,
            self.engine.model_config.max_model_len,
            episode_timeout_s,
        )
        make_env = env_factory(env_name, env_kwargs)
        return list(await asyncio.gather(*(runner.run_group(p, group_size, make_env) for p in prompts)))

    async def _final_output(self, prompt: Any, params: Any) -> Any:
        final = None
        async for out in self.engine.generate(prompt, params, request_id=uuid.uuid4().hex):
            final = out
        if final is None:
            raise RuntimeError("vLLM returned no output for a request; was the engine paused with mode=abort?")
        return final

    # ---- weight sync: the engine side of the transaction (see relayrl.weightsync.base) ---------
    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        """Set up (or re-set up, after an abort broke it) the transfer channel on every worker."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        request = WeightTransferInitRequest(init_info=init_info)
        await self._call(self.engine.init_weight_transfer_engine(request))
        if init_info.get("transport") == "pull":  # this engine can fetch versions itself (``fetch_version``)
            from relayrl.weightsync.layout import FlatLayout

            self._pull = (init_info["channel"]["dir"], FlatLayout.from_dict(init_info["layout"]).digest)

    async def fetch_version(self, min_version: int) -> None:
        """``weightsync.pull_when=admission``: if this engine serves a version below ``min_version``, fetch the
        newest one in the pull store through the same transaction a sync runs (pause, receive and check, commit;
        abort keeps the old weights). A failure raises ``FetchError`` in one line, the engine unchanged; a version
        retired by a newer publish while it was read is tried again as the newer one (``FETCH_TRIES``)."""
        if min_version <= 0 or await self.weight_version() >= min_version:
            return
        from relayrl.weightsync.client import last_line
        from relayrl.weightsync.store import FetchError, newer, newest_version

        async with self._fetching:
            for attempt in range(1, FETCH_TRIES + 1):
                if await self.weight_version() >= min_version:  # a call that waited on the lock found it fetched
                    return
                tried = -1
                try:
                    if self._pull is None:
                        raise RuntimeError("no pull store was set up here (weightsync.backend=pull initialises it)")
                    tried = newest_version(Path(self._pull[0]), min_version)
                    await self._fetch(tried, self._pull[1])
                    return
                except Exception as exc:  # noqa: BLE001 - any failure aborts and becomes one FetchError line
                    await self.abort_weight_update(f"fetch failed: {exc}")
                    if attempt < FETCH_TRIES and self._pull and newer(Path(self._pull[0]), tried):
                        continue
                    raise FetchError(f"could not fetch v{min_version} or newer: {last_line(exc)}") from None

    async def _fetch(self, version: int, digest: str) -> None:
        await self.start_weight_update(version, self.sync_cfg.timeout_s)
        await self.update_weights({"version": version, "digest": digest})
        await self.finish_weight_update(version)

    async def start_weight_update(self, version: int, timeout_s: float) -> None:
        """Pause (``keep``: running requests freeze, nothing is lost) and open an update of ``version``.

        Pausing makes version tags exact: no token is sampled with new weights under the old label.
        A watchdog aborts the update if neither commit nor abort arrives within ``WATCHDOG_STAGES *
        timeout_s`` (the trainer and the driver may both be gone), so the engine never stays paused.
        """
        if self._update is not None:
            await self.abort_weight_update(f"v{self._update[0]} was still open when v{version} started")
        self._pause_here = not self._paused
        if self._pause_here:
            # The engine-core call behind ``pause_generation``: the wrapper then sleeps 20 ms only so that
            # outputs already sampled reach their callers first ("not required for correctness", says
            # vLLM), and a sync's fixed cost is a few ms, so the sleep would dominate small models.
            await self._call(self.engine.engine_core.pause_scheduler_async(mode="keep", clear_cache=False))
        self._update = (version, time.perf_counter())
        self._watchdog = asyncio.create_task(self._expire(self._update, WATCHDOG_STAGES * timeout_s))
        await self._call(self.engine.start_weight_update())

    async def update_weights(self, update_info: dict[str, Any]) -> None:
        """Transfer + verify on every worker; the model is not touched until ``finish_weight_update``."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        await self._call(self.engine.update_weights(WeightTransferUpdateRequest(update_info=update_info)))

    async def finish_weight_update(self, version: int) -> float:
        """Commit: load the verified payload, label new tokens ``version``, resume. Returns the stall (s)."""
        if self._update is None or self._update[0] != version:
            raise RuntimeError(
                f"commit of v{version} without an open update of it (open: {self._update}); "
                "it was aborted, possibly by the watchdog"
            )
        await self._drop_prefix_cache(f"commit of v{version}")
        await self._call(self.engine.finish_weight_update(weight_version=str(version)))
        return await self._close_update()

    async def _drop_prefix_cache(self, why: str) -> None:
        """Empty vLLM's prefix cache (``rollout.prefix_sharing``) before the weights change: raises, and so
        fails the commit with the old weights kept, if a running request holds cached blocks."""
        if self.rollout_cfg.prefix_sharing and not await self._call(self.engine.reset_prefix_cache()):
            raise RuntimeError(
                f"{why}: vLLM could not empty its prefix cache (requests are running); "
                "set rollout.prefix_sharing=false for runs that update weights mid-generation"
            )

    async def abort_weight_update(self, reason: str = "") -> float:
        """Drop the staged payload and resume on the previous weights and label. Idempotent."""
        if self._update is None:
            return 0.0
        self.aborts += 1
        self.last_abort = f"v{self._update[0]}: {reason}"
        try:
            await self._call(self.engine.collective_rpc("relayrl_abort_weight_update"))
        finally:
            stall = await self._close_update()
        return stall

    async def _close_update(self) -> float:
        assert self._update is not None, "both callers close an open update"
        _, t0 = self._update
        self._update = None
        if self._watchdog is not None and self._watchdog is not asyncio.current_task():
            self._watchdog.cancel()
        if self._pause_here:
            await self._call(self.engine.resume_generation())
        return time.perf_counter() - t0

    async def _expire(self, update: tuple[int, float], after_s: float) -> None:
        await asyncio.sleep(after_s)
        if self._update is update:
            await self.abort_weight_update(f"no commit within {after_s:g}s (watchdog)")

    def weight_update_state(self) -> dict[str, Any]:
        """The open update's version (None: none open), how many updates were aborted, and the latest
        abort (``v<version>: <reason>``; the watchdog's ends in "(watchdog)"): what tells who ended an
        update whose trainer died, in tests and for an engine whose version did not move."""
        return {"open": self._update[0] if self._update else None, "aborts": self.aborts, "last_abort": self.last_abort}

    def occupancy(self) -> dict[str, float]:
        """Engine steps since the last call, the mean sequences running and waiting in them, and the memory
        the engine holds now (``relayrl.rollout.occupancy``)."""
        return {**self.batch.take(), "memory_gb": engine_memory_gb(has_cuda())}

    async def weight_version(self) -> int:
        """The version label new tokens are tagged with."""
        return parse_version(await self._call(self.engine.get_weight_version()))

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """``[T-1]``: log p(token_i | tokens_<i) for i = 1..T-1 under the engine's current weights."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=1, prompt_logprobs=0, temperature=1.0, output_kind=RequestOutputKind.FINAL_ONLY
        )
        final = await self._final_output(TokensPrompt(prompt_token_ids=list(token_ids)), params)
        return [pos[tok].logprob for tok, pos in zip(token_ids[1:], list(final.prompt_logprobs)[1:])]

    async def cpu_binding(self) -> dict[str, Any]:
        """CPU engines: the first worker's cores, torch threads and pid (``relayrl_cpu_binding``); for tests."""
        return (await self._call(self.engine.collective_rpc("relayrl_cpu_binding")))[0]

    async def modules_loaded(self, names: list[str]) -> dict[str, list[bool]]:
        """Which of ``names`` are imported here (the engine's client) and in the engine's first worker
        (``relayrl_modules_loaded``); for tests."""
        worker = (await self._call(self.engine.collective_rpc("relayrl_modules_loaded", args=(names,))))[0]
        return {"client": [name in sys.modules for name in names], "worker": worker}

    async def param_digests(self) -> dict[str, str]:
        """sha256 per engine parameter (first worker); tests use it to check syncs are bit-exact."""
        return (await self._call(self.engine.collective_rpc("relayrl_param_digests")))[0]

    async def pause(self, mode: PauseMode = "keep") -> None:
        """Stop scheduling. ``keep`` freezes running requests (they finish after ``resume``);
        ``abort`` ends them; ``wait`` lets them finish first."""
        await self._call(self.engine.pause_generation(mode=mode, clear_cache=mode != "keep"))
        self._paused = True

    async def resume(self) -> None:
        await self._call(self.engine.resume_generation())
        self._paused = False

    async def sleep(self) -> None:
        """Colocated mode, before training: free the engine's memory (vLLM sleep level 1: weights offloaded,
        KV cache dropped). On CPU vLLM ignores it (with a warning): the bundle's cores are simply idle."""
        await self._call(self.engine.sleep(level=1, mode="wait"))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self._call(self.engine.wake_up(tags))
        await self._drop_prefix_cache("wake-up")  # sleep dropped the KV memory the cache points into

    def shutdown(self) -> None:
        from relayrl.rollout.cleanup import remove_ipc_dir

        self.engine.shutdown()
        remove_ipc_dir(self.ipc_dir)


async def unless_dead(engine: Any, call: Awaitable[T]) -> T:
    """Await an ``AsyncLLM`` control call (pause, weight transfer, ``collective_rpc``...), raising vLLM's
    ``EngineDeadError`` as soon as ``engine`` is dead. vLLM fails the requests in flight when its engine
    core dies but leaves such a call waiting forever: a sync caught by an engine's death would hold the
    run for ``weightsync.timeout_s``, and a caller without a deadline for good."""
    task = asyncio.ensure_future(call)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DEATH_POLL_S)
            if not task.done() and engine.errored:
                raise engine.dead_error
        return task.result()
    finally:
        task.cancel()


def _trajectory(prompt_id: int, prompt_token_ids: list[int], completion: Any, seconds: float) -> Trajectory:
    """One vLLM ``CompletionOutput`` -> ``Trajectory`` (parsed by ``outputs.model_turn``)."""
    turn = model_turn(completion)
    return Trajectory(
        prompt_id=prompt_id,
        sample_idx=completion.index,
        prompt_token_ids=list(prompt_token_ids),
        completion_token_ids=turn.token_ids,
        behaviour_logprobs=turn.logprobs,
        completion_text=turn.text,
        finish_reason=turn.finish_reason,
        versions=turn.versions,
        gen_seconds=seconds,
    )
