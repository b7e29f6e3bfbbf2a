"""Multi-turn episodes: model turns on a vLLM engine alternating with environment turns.

One episode (``EpisodeRunner.run_episode``), with ``ids`` the token ids so far::

    ids = tokenize(env.reset(sample))                          # the prompt: P tokens
    repeat up to max_turns:
        model turn: sample on ids (TokensPrompt), stop at EOS | max_tokens | env.stop  -> append, mask 1
        obs, r, done = env.step(turn text);  reward += r
        if done or last turn or no room left: stop
        env turn: tokenize(obs) (no special tokens added)                               -> append, mask 0

Plain ``reset``/``step`` run in a worker thread (``_call_env``) so a blocking environment never stalls
the engine's event loop; an exception in either ends the call as an ``EpisodeError``. Each model turn is
seeded from the prompt's seed, the sample index and the turn (``turn_seed``).

The resulting ``Trajectory`` keeps the exact token ids the engine conditioned on (model tokens are
never re-tokenized), so the trainer scores the same sequence the engine sampled. Its fields:

* ``completion_token_ids`` [T]: every turn after the prompt, model and environment tokens in order.
* ``completion_mask`` [T]: 1 on model tokens, 0 on environment tokens (left out of the loss).
* ``behaviour_logprobs`` [T]: the engine's logprob for model tokens; 0.0 (a masked placeholder) for env tokens.
* ``versions``: each model turn's spans as vLLM reports them (a turn that straddles a weight update has
  two), shifted to completion positions. Environment tokens join the span before them: they take the
  version of the model turn they answer, which is what produced the action they depend on. Spans stay
  contiguous over [0, T) and ``min_version`` (staleness) sees every model turn.
* ``env_reward``: the sum of the ``step`` rewards; ``finish_reason``: the last model turn's when the
  environment ended the episode, else ``"length"`` (out of turns or context).
* ``completion_text``: the whole transcript after the prompt (model and environment text).

The last observation is dropped when the episode stops (nothing would be trained after it), so a
completion always ends with a model token.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from relayrl.config import RolloutConfig
from relayrl.data.sampler import Prompt
from relayrl.envs.base import Environment, in_thread
from relayrl.rollout.outputs import ModelTurn, model_turn
from relayrl.types import Trajectory, TrajectoryGroup, VersionSpan

SampleTurn = Callable[[list[int], int, list[str], int | None], Awaitable[ModelTurn]]
"""``(context token ids, max new tokens, stop strings, seed) -> ModelTurn``: one request to the engine."""


def turn_seed(prompt_seed: int | None, sample_idx: int, turn: int) -> int | None:
    """The seed of one model turn of episode ``sample_idx``: a hash of (prompt seed, sample, turn), so an
    episode replays the same turns from the same weights and observations (None: unseeded)."""
    if prompt_seed is None:
        return None
    digest = hashlib.sha256(f"relayrl-turn/{prompt_seed}/{sample_idx}/{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % 2**62


@dataclass
class Episode:
    """Accumulates an episode's completion turn by turn (see the module docstring for the fields)."""

    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    versions: list[VersionSpan] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    finish_reason: str = "length"
    turns: int = 0
    timed_out: bool = False
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.tokens

    def add_model_turn(self, turn: ModelTurn) -> None:
        if len(turn.logprobs) != len(turn.token_ids):
            raise RuntimeError(
                f"engine returned {len(turn.logprobs)} logprobs for {len(turn.token_ids)} tokens; request logprobs=0"
            )
        offset = len(self.tokens)
        self.versions += [VersionSpan(s.version, offset + s.start, offset + s.end) for s in turn.versions]
        self.tokens += turn.token_ids
        self.logprobs += turn.logprobs
        self.mask += [1] * len(turn.token_ids)
        self.texts.append(turn.text)
        self.finish_reason, self.turns = turn.finish_reason, self.turns + 1

    def add_env_turn(self, token_ids: list[int], text: str) -> None:
        """Environment tokens: mask 0, logprob 0.0, and the version of the model turn before them."""
        if self.versions:
            last = self.versions[-1]
            self.versions[-1] = VersionSpan(last.version, last.start, last.end + len(token_ids))
        self.tokens += token_ids
        self.logprobs += [0.0] * len(token_ids)
        self.mask += [0] * len(token_ids)
        self.texts.append(text)

    def trajectory(self, prompt_id: int, sample_idx: int, seconds: float) -> Trajectory:
        return Trajectory(
            prompt_id=prompt_id,
            sample_idx=sample_idx,
            prompt_token_ids=list(self.prompt_ids),
            completion_token_ids=list(self.tokens),
            behaviour_logprobs=list(self.logprobs),
            completion_text="".join(self.texts),
            finish_reason=self.finish_reason if self.done else "length",
            versions=list(self.versions),
            gen_seconds=seconds,
            completion_mask=list(self.mask),
            env_reward=self.reward,
            env_metrics={**self.metrics, "turns": float(self.turns), "timed_out": float(self.timed_out)},
        )


class EpisodeError(RuntimeError):
    """An environment's ``reset`` or ``step`` raised: the task's own error, raised to the caller as an
    ordinary exception (the rollout actor and its engine stay up), with the environment's message."""


async def _call_env(env: Environment, method: str, arg: Any, where: str, timeout_s: float | None = None) -> Any:
    """``env.<method>(arg)`` without blocking the event loop: ``async def`` methods are awaited, plain ones
    run in the environment thread pool (``relayrl.envs.base.in_thread``), so a slow or blocking environment
    cannot stall the engine's other episodes, its weight syncs or its watchdog. Each environment instance is
    used by one episode, one call at a time, so a plain method never runs on two threads at once.

    ``timeout_s`` (the episode's time left) raises ``TimeoutError``; any exception, ``SystemExit`` included (it
    would otherwise end the actor), becomes an ``EpisodeError``.
    """
    fn = getattr(env, method)

    async def call() -> Any:
        result = await fn(arg) if inspect.iscoroutinefunction(fn) else await in_thread(fn, arg)
        return await result if inspect.isawaitable(result) else result

    try:
        return await asyncio.wait_for(call(), timeout_s)
    except (asyncio.CancelledError, TimeoutError):
        raise
    except BaseException as exc:  # the env's failure is reported, never allowed to end the actor
        raise EpisodeError(
            f"environment {type(env).__name__}.{method} failed on {where}: {type(exc).__name__}: {exc}"
        ) from exc


def check_prompts(prompts: list[Prompt], group_size: int) -> None:
    """What every generate call needs (single- and multi-turn): a group of >= 1 and ``Prompt`` records."""
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be >= 1; set algorithm.group_size")
    for p in prompts:
        if not isinstance(p, Prompt):
            raise TypeError(
                f"prompt {p!r} is a {type(p).__name__}; pass relayrl.data.Prompt(prompt_id, "
                "prompt, columns, seed) records"
            )


class EpisodeRunner:
    """Runs episodes of an environment against one engine (``sample_turn``), ``max_turns`` model turns at most.

    ``tokenizer``: the engine's (``encode(text, add_special_tokens=...)``); the prompt is encoded as vLLM
    encodes a text prompt (special tokens added), observations without special tokens (they continue
    a sequence). ``max_tokens`` bounds each model turn, ``max_model_len`` the whole context.
    """

    def __init__(
        self,
        sample_turn: SampleTurn,
        tokenizer: Any,
        max_turns: int,
        max_tokens: int,
        max_model_len: int,
        episode_timeout_s: float | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 1; set env.max_turns")
        self.sample_turn, self.tokenizer = sample_turn, tokenizer
        self.max_turns, self.max_tokens, self.max_model_len = max_turns, max_tokens, max_model_len
        self.episode_timeout_s = episode_timeout_s
        self.special_ids = set(getattr(tokenizer, "all_special_ids", None) or [])

    async def run_group(self, prompt: Prompt, group_size: int, make_env: Callable[[], Environment]) -> TrajectoryGroup:
        """``group_size`` concurrent episodes of ``prompt``, a fresh env each."""
        check_prompts([prompt], group_size)
        columns = dict(prompt.columns)
        sample = {**columns, "prompt": prompt.prompt}
        results = await asyncio.gather(
            *(self.run_episode(make_env(), dict(sample), prompt.prompt_id, i, prompt.seed) for i in range(group_size))
        )
        return TrajectoryGroup(prompt.prompt_id, results[0][0], columns, [traj for _, traj in results])

    async def run_episode(
        self, env: Environment, sample: dict[str, Any], prompt_id: int, sample_idx: int, seed: int | None = None
    ) -> tuple[str, Trajectory]:
        """One episode; returns (the first model input text, the trajectory). ``seed``: the prompt's (see
        ``turn_seed``). Past ``episode_timeout_s`` no new turn starts and a running environment call is
        abandoned; the episode ends as it stands (``timed_out``)."""
        t0, where = time.perf_counter(), f"prompt {prompt_id} sample {sample_idx}"
        deadline = None if self.episode_timeout_s is None else time.monotonic() + self.episode_timeout_s
        if callable(getattr(env, "setup", None)):
            await _call_env(env, "setup", self.tokenizer, where)
        try:
            first = await _call_env(env, "reset", sample, where, _left(deadline))
        except TimeoutError:
            raise EpisodeError(f"environment {type(env).__name__}.reset timed out on {where}") from None
        episode = Episode(prompt_ids=list(self.tokenizer.encode(first)))
        if len(episode.prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt {prompt_id} is {len(episode.prompt_ids)} tokens, no room to generate within "
                f"model.max_model_len={self.max_model_len}; raise model.max_model_len"
            )
        stop = list(getattr(env, "stop", None) or [])
        try:
            await self._turns(env, episode, stop, deadline, seed, sample_idx, where)
        except TimeoutError:
            episode.timed_out = True
        episode.metrics = _env_metrics(env)
        return first, episode.trajectory(prompt_id, sample_idx, time.perf_counter() - t0)

    async def _turns(
        self,
        env: Environment,
        episode: Episode,
        stop: list[str],
        deadline: float | None,
        seed: Any,
        idx: int,
        where: str,
    ) -> None:
        """Model and environment turns until the environment is done, turns or context run out, or the deadline."""
        while not episode.done and episode.turns < self.max_turns:
            room = self.max_model_len - len(episode.context)
            if room < 1:
                break
            turn = await self.sample_turn(
                episode.context, min(self.max_tokens, room), stop, turn_seed(seed, idx, episode.turns)
            )
            episode.add_model_turn(turn)
            obs, reward, done = await _call_env(
                env, "step", turn.text, f"{where} turn {episode.turns}", _left(deadline)
            )
            episode.reward += float(reward)
            episode.done = bool(done)
            if episode.done or episode.turns == self.max_turns:
                break
            obs_ids = list(self.tokenizer.encode(obs, add_special_tokens=False)) if obs else []
            if obs_ids and turn.token_ids and obs_ids[0] == turn.token_ids[-1] and obs_ids[0] in self.special_ids:
                obs_ids = obs_ids[1:]  # the model already wrote the end-of-turn token the observation opens with
            if len(episode.context) + len(obs_ids) >= self.max_model_len:
                break  # no room for the observation and another model token
            _left(deadline)  # out of time: end on this model turn, not on an observation nothing answers
            episode.add_env_turn(obs_ids, obs)


def _left(deadline: float | None) -> float | None:
    """Seconds to ``deadline`` (None: no deadline); ``TimeoutError`` once it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _env_metrics(env: Environment) -> dict[str, float]:
    """The environment's own ``metrics()`` (tool calls, errors), if it has them."""
    metrics = getattr(env, "metrics", None)
    return {k: float(v) for k, v in metrics().items()} if callable(metrics) else {}


def vllm_sample_turn(final_output: Callable[[Any, Any], Awaitable[Any]], cfg: RolloutConfig) -> SampleTurn:
    """A ``SampleTurn`` over vLLM: one ``n=1`` request on ``TokensPrompt(context)``, with the rollout's
    temperature/top-p, the turn's seed and the sampled tokens' logprobs (the engine reports processed ones)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    async def sample_turn(context: list[int], max_tokens: int, stop: list[str], seed: int | None) -> ModelTurn:
        params = SamplingParams(
            n=1,
            logprobs=0,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=max_tokens,
            stop=stop or None,
            include_stop_str_in_output=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
            seed=seed,
        )
        final = await final_output(TokensPrompt(prompt_token_ids=list(context)), params)
        return model_turn(final.outputs[0])

    return sample_turn
