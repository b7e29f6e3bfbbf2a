"""Multi-turn episodes: the runner on a scripted engine (hand-worked), then on a real vLLM engine, then end to end."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from typing import ClassVar

import pytest
import torch

from relayrl.config import ModelConfig, RolloutConfig, load_config
from relayrl.data import Prompt
from relayrl.envs.calculator import FEEDBACK, CalculatorEnv
from relayrl.rollout.episode import EpisodeError, EpisodeRunner, ModelTurn
from relayrl.trainer.batch import build_train_batch
from relayrl.types import TrajectoryGroup, VersionSpan
from tests.rollout.reference import hf_logprobs


# ---------------------------------------------------------------------------- scripted engine (no vLLM)
class CharTokenizer:
    """One id per character (its code point); the prompt gets a BOS id 1, as vLLM adds special tokens."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


class ScriptedEngine:
    """Returns the given turns in order and records (context, max_tokens, stop) of every request."""

    def __init__(self, turns: list[ModelTurn]):
        self.turns, self.calls, self.seeds = list(turns), [], []

    async def __call__(self, context: list[int], max_tokens: int, stop: list[str], seed: int | None) -> ModelTurn:
        self.calls.append((list(context), max_tokens, stop))
        self.seeds.append(seed)
        return self.turns.pop(0)


class ScriptedEnv:
    """reset -> the prompt; step i -> steps[i]; records the actions."""

    stop: ClassVar[list[str]] = ["</x>"]

    def __init__(self, steps: list[tuple[str, float, bool]]):
        self.steps, self.actions, self.sample = list(steps), [], None

    def reset(self, sample):
        self.sample = sample
        return sample["prompt"]

    def step(self, action):
        self.actions.append(action)
        return self.steps.pop(0)


def _turn(tokens, logprobs, text, versions, finish="stop"):
    return ModelTurn(tokens, logprobs, text, finish, versions)


def _run(runner: EpisodeRunner, env, prompt="ab"):
    return asyncio.run(runner.run_episode(env, {"prompt": prompt, "answer": "7"}, prompt_id=3, sample_idx=1))


def test_two_turn_episode_hand_worked():
    """prompt "ab" -> [1, 97, 98]; model [10, 11]; env "cd" -> [99, 100]; model [12] (sampled after an update)."""
    engine = ScriptedEngine(
        [
            _turn([10, 11], [-0.1, -0.2], "x</x>", [VersionSpan(0, 0, 2)]),
            _turn([12], [-0.3], "y", [VersionSpan(1, 0, 1)]),
        ]
    )
    env = ScriptedEnv([("cd", 0.5, False), ("ignored", 1.0, True)])
    first, t = _run(EpisodeRunner(engine, CharTokenizer(), max_turns=4, max_tokens=8, max_model_len=64), env)
    assert first == "ab" and t.prompt_token_ids == [1, 97, 98]
    assert t.completion_token_ids == [10, 11, 99, 100, 12]
    assert t.completion_mask == [1, 1, 0, 0, 1]
    assert t.behaviour_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    # env tokens 2..3 join the span of the model turn before them (v0); the second turn is v1
    assert t.versions == [VersionSpan(0, 0, 4), VersionSpan(1, 4, 5)] and t.min_version == 0
    assert t.env_reward == 1.5 and t.finish_reason == "stop" and t.completion_text == "x</x>cdy"
    assert env.actions == ["x</x>", "y"]  # the env saw each turn's text
    assert engine.calls == [([1, 97, 98], 8, ["</x>"]), ([1, 97, 98, 10, 11, 99, 100], 8, ["</x>"])]


def test_turns_are_seeded_per_prompt_sample_and_turn():
    """A prompt seed gives every model turn its own seed, the same in a replay; no prompt seed: unseeded."""

    def seeds(prompt_seed):
        engine = ScriptedEngine([_turn([10 + i], [-0.1], "p", [VersionSpan(0, 0, 1)]) for i in range(4)])
        runner = EpisodeRunner(engine, CharTokenizer(), max_turns=2, max_tokens=8, max_model_len=64)
        prompt = Prompt(5, "q", seed=prompt_seed)
        asyncio.run(runner.run_group(prompt, 2, lambda: ScriptedEnv([("o", 0.0, False)] * 2)))
        return engine.seeds

    first = seeds(123)
    assert first == seeds(123) and len(set(first)) == 4  # 2 samples x 2 turns, all distinct
    assert set(first).isdisjoint(seeds(124)) and seeds(None) == [None] * 4


def test_turn_straddling_an_update_keeps_both_spans():
    engine = ScriptedEngine(
        [
            _turn([5], [-1.0], "a", [VersionSpan(2, 0, 1)]),
            _turn([6, 7, 8], [-1.0] * 3, "b", [VersionSpan(2, 0, 1), VersionSpan(3, 1, 3)]),
        ]
    )
    env = ScriptedEnv([("o", 0.0, False), ("", 0.0, True)])
    _, t = _run(EpisodeRunner(engine, CharTokenizer(), 4, 8, 64), env)
    assert t.versions == [VersionSpan(2, 0, 2), VersionSpan(2, 2, 3), VersionSpan(3, 3, 5)]
    assert t.completion_mask == [1, 0, 1, 1, 1]


def test_out_of_turns_drops_the_last_observation_and_says_length():
    engine = ScriptedEngine(
        [_turn([10], [-0.1], "p", [VersionSpan(0, 0, 1)]), _turn([11], [-0.2], "q", [VersionSpan(0, 0, 1)])]
    )
    env = ScriptedEnv([("o1", 0.25, False), ("o2", 0.5, False)])
    _, t = _run(EpisodeRunner(engine, CharTokenizer(), max_turns=2, max_tokens=8, max_model_len=64), env)
    assert t.completion_token_ids == [10, ord("o"), ord("1"), 11]  # "o2" is never appended
    assert t.completion_mask == [1, 0, 0, 1] and t.finish_reason == "length" and t.env_reward == 0.75
    assert len(env.actions) == 2  # the last turn was still scored


def test_context_limit_bounds_turns_and_observations():
    """max_model_len 8, prompt 3 ids: turn 1 may take 5; after 2 tokens and a 2-id observation only 1 is left."""
    engine = ScriptedEngine(
        [_turn([10, 11], [-0.1, -0.2], "p", [VersionSpan(0, 0, 2)]), _turn([12], [-0.3], "q", [VersionSpan(0, 0, 1)])]
    )
    env = ScriptedEnv([("cd", 0.0, False), ("efgh", 0.0, False)])
    _, t = _run(EpisodeRunner(engine, CharTokenizer(), max_turns=5, max_tokens=6, max_model_len=8), env)
    assert [max_tokens for _, max_tokens, _ in engine.calls] == [5, 1]
    assert t.completion_token_ids == [10, 11, 99, 100, 12]  # "efgh" would not fit: episode ends
    assert t.finish_reason == "length" and len(env.actions) == 2
    with pytest.raises(ValueError, match="prompt 3 is 8 tokens, no room"):
        _run(EpisodeRunner(engine, CharTokenizer(), 5, 6, 8), env, prompt="abcdefg")


def test_async_env_and_a_failing_env():
    class AsyncEnv(ScriptedEnv):
        async def step(self, action):
            await asyncio.sleep(0)
            return super().step(action)

    engine = ScriptedEngine([_turn([10], [-0.1], "p", [VersionSpan(0, 0, 1)])])
    _, t = _run(EpisodeRunner(engine, CharTokenizer(), 2, 8, 64), AsyncEnv([("", 2.0, True)]))
    assert t.env_reward == 2.0 and t.completion_mask == [1]

    class Broken(ScriptedEnv):
        def step(self, action):
            raise KeyError("answer")

    engine = ScriptedEngine([_turn([10], [-0.1], "p", [VersionSpan(0, 0, 1)])])
    with pytest.raises(EpisodeError, match=r"Broken\.step failed on prompt 3 sample 1 turn 1: KeyError"):
        _run(EpisodeRunner(engine, CharTokenizer(), 2, 8, 64), Broken([]))

    class Exits(ScriptedEnv):
        def reset(self, sample):
            raise SystemExit(3)  # would end the rollout actor if it escaped

    with pytest.raises(EpisodeError, match=r"Exits\.reset failed on prompt 3 sample 1: SystemExit: 3"):
        _run(EpisodeRunner(ScriptedEngine([]), CharTokenizer(), 2, 8, 64), Exits([]))


class BlockingEnv(ScriptedEnv):
    """A plain ``step`` that blocks its thread until another coroutine of the same loop releases it."""

    def __init__(self):
        super().__init__([("", 1.0, True)])
        self.entered, self.release = threading.Event(), threading.Event()
        self.released_while_blocked = False

    def step(self, action):
        self.entered.set()
        # hang guard only: on the event loop this wait could never be released, and the test fails below
        self.released_while_blocked = self.release.wait(timeout=10)
        return super().step(action)


def test_a_blocking_env_step_leaves_the_event_loop_free():
    """Structural: the step can only return released if a coroutine on the loop ran while it blocked."""
    env = BlockingEnv()
    ticks = []

    async def other_coroutine():
        while not env.entered.is_set():
            await asyncio.sleep(0.001)
        ticks.append("ran while step blocked")
        env.release.set()

    async def both():
        engine = ScriptedEngine([_turn([10], [-0.1], "p", [VersionSpan(0, 0, 1)])])
        runner = EpisodeRunner(engine, CharTokenizer(), 2, 8, 64)
        episode = runner.run_episode(env, {"prompt": "ab"}, prompt_id=0, sample_idx=0)
        return (await asyncio.gather(episode, other_coroutine()))[0]

    _, t = asyncio.run(both())
    assert env.released_while_blocked and ticks == ["ran while step blocked"] and t.env_reward == 1.0


def test_group_makes_a_fresh_env_per_episode_and_trains_on_model_tokens_only():
    turns = [_turn([10 + i, 20 + i], [-0.5, -0.5], "m", [VersionSpan(0, 0, 2)]) for i in range(4)]
    envs = []

    def make_env():
        envs.append(ScriptedEnv([("ok", 0.0, False), ("", float(len(envs) % 2), True)]))
        return envs[-1]

    runner = EpisodeRunner(ScriptedEngine(turns), CharTokenizer(), max_turns=3, max_tokens=4, max_model_len=64)
    prompt = Prompt(9, "q", {"answer": "7"})
    group = asyncio.run(runner.run_group(prompt, 2, make_env))
    assert len(envs) == 2 and envs[0].sample == {"answer": "7", "prompt": "q"}
    assert group.prompt == "q" and group.columns == {"answer": "7"}
    assert [t.sample_idx for t in group.trajectories] == [0, 1]
    assert [t.env_reward for t in group.trajectories] == [0.0, 1.0]
    batch = build_train_batch([group], pad_token_id=0)
    # prompt [1, ord("q")]: P = 2; completion = 2 model, 2 env ("ok"), 2 model tokens -> mask 1 1 0 0 1 1
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0, 0, 1, 1]] * 2
    with pytest.raises(ValueError, match="group_size=0 must be >= 1"):
        asyncio.run(runner.run_group(prompt, 0, make_env))


# ---------------------------------------------------------------------------- real vLLM engine, calculator env
TEMPERATURE = 0.7
MAX_TOKENS = 12
MAX_TURNS = 3
QUESTIONS = [(f"What is {a} + {b}? Reply with 'Answer: N'.", str(a + b)) for a, b in ((3, 4), (12, 30))]
PROMPTS = [
    Prompt(i, f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n", {"question": q, "answer": a})
    for i, (q, a) in enumerate(QUESTIONS)
]


@pytest.fixture(scope="module")
def actor(ray_session, tiny_llama):
    from relayrl.rollout import start_rollout_actor

    handle = start_rollout_actor(
        str(tiny_llama),
        ModelConfig(path=str(tiny_llama), max_model_len=1024),  # the calculator's tools block: ~680 tokens
        RolloutConfig(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, kv_cache_gb=0.25, num_cpus=0.5),
        seed=0,
    )
    ray_session.get(handle.info.remote())
    yield handle
    ray_session.get(handle.shutdown.remote())
    ray_session.kill(handle)


@pytest.fixture(scope="module")
def episodes(actor, ray_session):
    t0 = time.perf_counter()
    groups = ray_session.get(actor.generate_episodes.remote(PROMPTS, 3, "calculator", MAX_TURNS))
    print(f"\n{sum(len(g.trajectories) for g in groups)} episodes in {time.perf_counter() - t0:.2f}s")
    return groups


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal values: (value, start, end)."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs


def _replay(group: TrajectoryGroup, t, tok) -> tuple[float, bool]:
    """Step a fresh CalculatorEnv through the trajectory's model turns: each observation it returns must be
    the env tokens recorded after that turn, and no turn may follow the one that ended the episode.
    Returns (the summed step rewards, whether the env ended the episode): what ``env_reward`` must be."""
    env, total, done = CalculatorEnv(), 0.0, False
    env.setup(tok)
    assert env.reset({**group.columns, "prompt": group.prompt}) == group.prompt
    runs = _runs(t.completion_mask)  # model and env runs alternate, model first and last
    for i, (is_model, start, end) in enumerate(runs):
        if not is_model:
            continue
        assert not done, "a model turn followed the turn that ended the episode"
        turn = t.completion_token_ids[start:end]
        obs, reward, done = asyncio.run(env.step(tok.decode(turn, skip_special_tokens=True)))
        total += reward
        if i + 1 < len(runs):
            _, obs_start, obs_end = runs[i + 1]
            expected = tok.encode(obs, add_special_tokens=False)
            if turn[-1] == tok.eos_token_id:  # the model wrote the end-of-turn token the observation opens with
                assert expected[0] == tok.eos_token_id
                expected = expected[1:]
            assert t.completion_token_ids[obs_start:obs_end] == expected
    return total, done


def test_env_tokens_are_masked_exactly_where_observations_are(episodes, tiny_llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    env_tokens = 0
    for g, p in zip(episodes, PROMPTS):
        assert '"name": "calculator"' in g.prompt and g.columns == p.columns
        for t in g.trajectories:
            T, mask = len(t.completion_token_ids), t.completion_mask
            assert len(mask) == len(t.behaviour_logprobs) == T and set(mask) <= {0, 1}
            assert t.prompt_token_ids == tok.encode(g.prompt)
            runs = _runs(mask)
            model_runs = [r for r in runs if r[0] == 1]
            env_runs = [r for r in runs if r[0] == 0]
            assert runs[0][0] == 1 and runs[-1][0] == 1  # starts and ends with the model
            assert 1 <= len(model_runs) <= MAX_TURNS and len(env_runs) == len(model_runs) - 1
            for _, start, end in env_runs:  # each zero run is one observation
                obs = tok.decode(t.completion_token_ids[start:end])
                assert FEEDBACK in obs or "<tool_response>" in obs, obs
                assert obs.endswith("<|im_start|>assistant\n"), obs
                assert t.behaviour_logprobs[start:end] == [0.0] * (end - start)
                env_tokens += end - start
            model_lps = [lp for lp, m in zip(t.behaviour_logprobs, mask) if m]
            assert all(math.isfinite(lp) and lp < 0 for lp in model_lps)
            assert all(len(range(s, e)) <= MAX_TOKENS for _, s, e in model_runs)
            assert t.versions[0].start == 0 and t.versions[-1].end == T and {s.version for s in t.versions} == {0}
            assert all(a.end == b.start for a, b in zip(t.versions, t.versions[1:]))
            reward, done = _replay(g, t, tok)
            assert t.env_reward == reward and (done or t.finish_reason == "length")
    assert env_tokens > 0, "no episode had an environment turn"


class IllegalMoveEnv:
    """Raises ValueError on every move: a deterministic task error, not an engine failure."""

    def reset(self, sample):
        return sample["prompt"]

    def step(self, action):
        raise ValueError("illegal move; the game accepts only 'Answer: N'")


def test_an_env_value_error_is_a_task_error_and_the_actor_lives(actor, ray_session):
    """The env's exception reaches the caller as the generate call's error (RayTaskError, not RayActorError)
    with the env's message, and the actor and its engine still answer: nothing for the driver to restart."""
    from ray.exceptions import RayActorError, RayTaskError

    call = actor.generate_episodes.remote(PROMPTS[:1], 2, "tests.rollout.test_episode:IllegalMoveEnv", 2)
    with pytest.raises(RayTaskError) as err:
        ray_session.get(call)
    assert not isinstance(err.value, RayActorError)
    assert isinstance(err.value.cause, EpisodeError)
    assert "IllegalMoveEnv.step failed on prompt 0" in str(err.value.cause)
    assert "ValueError: illegal move; the game accepts only 'Answer: N'" in str(err.value.cause)
    assert ray_session.get(actor.weight_version.remote(), timeout=60) == 0


def test_later_turns_were_sampled_conditioned_on_the_env_tokens(episodes, tiny_llama):
    """Behaviour logprobs of every model token match transformers on the full prompt+completion sequence, so
    the engine saw exactly the recorded ids (observations included) before each turn."""
    t = max((t for g in episodes for t in g.trajectories), key=lambda t: t.completion_mask.count(0))
    assert t.completion_mask.count(0) > 0
    P = len(t.prompt_token_ids)
    ref = hf_logprobs(tiny_llama, t.prompt_token_ids + t.completion_token_ids, temperature=TEMPERATURE)[P - 1 :]
    model = torch.tensor(t.completion_mask, dtype=torch.bool)
    got = torch.tensor(t.behaviour_logprobs)
    assert torch.allclose(got[model], ref[model], atol=1e-3), (got[model] - ref[model]).abs().max()


def test_train_batch_from_episodes_masks_env_tokens(episodes):
    groups = [TrajectoryGroup(g.prompt_id, g.prompt, g.columns, g.trajectories) for g in episodes]
    for g in groups:
        for i, t in enumerate(g.trajectories):
            t.reward = float(i)
    batch = build_train_batch(groups, pad_token_id=0)
    trajs = [t for g in groups for t in g.trajectories]
    masks = [t.completion_mask or [] for t in trajs]  # each set: the episodes have env turns
    for b, (t, mask) in enumerate(zip(trajs, masks)):
        positions = batch.loss_mask[b].nonzero().squeeze(1)
        model_ids = [tok for tok, m in zip(t.completion_token_ids, mask, strict=True) if m]
        assert batch.input_ids[b, positions + 1].tolist() == model_ids
    assert batch.loss_mask.sum() == sum(sum(mask) for mask in masks)
    assert batch.loss_mask.sum() < sum(len(t.completion_token_ids) for t in trajs)


# ---------------------------------------------------------------------------- end to end: driver + tiny recipe
@pytest.mark.slow
def test_multi_turn_training_run(ray_session, tiny_llama, tmp_path):
    """agent_calc_tiny for 2 steps: episodes through scoring (env_reward), training and weight sync.

    The trainer's ``tokens`` is its loss-mask sum; ``rollout/tokens`` counts every completion token. A random
    model never calls the tool or answers, so each observation is the calculator's feedback message as rendered
    by the chat template (one token shorter when the model's turn ended with the end-of-turn token it opens with):
    the difference must lie within those bounds for the step's (turns - 1) observations per episode.
    """
    from relayrl.controller import train
    from relayrl.envs import CalculatorEnv
    from relayrl.models import load_tokenizer

    tok = load_tokenizer(tiny_llama)
    env = CalculatorEnv()
    env.setup(tok)
    feedback = len(tok.encode(env.chat.reply(FEEDBACK), add_special_tokens=False))
    cfg = load_config(
        "agent_calc_tiny",
        [f"model.path={tiny_llama}", f"run.output_dir={tmp_path}", "trainer.num_cpus=0.5", "rollout.num_cpus=0.5"],
    )
    t0 = time.perf_counter()
    result = train(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    print(
        f"\n2-step multi-turn run {time.perf_counter() - t0:.1f}s; "
        + "; ".join(f"tokens {r['policy/tokens']:.0f}/{r['rollout/tokens']:.0f}" for r in rows)
    )
    assert [r["step"] for r in rows] == [1, 2]
    from relayrl.monitor.schema import SCHEMA

    assert {m.name for m in SCHEMA if m.when == "env"} <= set(rows[0]), "an env/* metric was not logged"
    for r in rows:
        assert r["rollout/completions"] == cfg.run.prompts_per_step * cfg.algorithm.group_size
        env_tokens = r["rollout/tokens"] - r["policy/tokens"]
        observations = round((r["env/turns"] - 1) * r["rollout/completions"])
        assert observations > 0 and r["env/tool_call_rate"] == 0.0 and r["env/tool_errors"] == 0.0
        assert (feedback - 1) * observations <= env_tokens <= feedback * observations, (env_tokens, feedback)
        # the headline is the weighted sum of the per-function means (env_reward 1.0, digit_fraction 0.1), so a
        # digit_fraction that never reached the total, or an env reward not summed into it, breaks the equality
        assert r["reward/env_reward"] == 0.0 and 0.0 <= r["reward/digit_fraction"] <= 1.0
        assert r["reward/mean"] == pytest.approx(r["reward/env_reward"] + 0.1 * r["reward/digit_fraction"])
        assert r["rollout/min_version"] == r["step"] - 1 and r["weightsync/version"] == r["step"]
        for key in ("policy/loss", "policy/grad_norm", "timing/generate", "timing/train", "timing/sync"):
            assert math.isfinite(r[key]), key


# -------------------------------------------------------------- scripted engine (no vLLM): concurrency, tools, timeouts
def test_two_episodes_interleave_while_one_env_step_blocks():
    """Episode A's plain step blocks its thread until episode B has taken its second and third model turns, and
    B's first step waits until A's step has started: B's turns can only happen while A's step is blocked if
    environment work runs off the event loop (on it, both waits would time out and the order below break)."""
    events: list[str] = []  # appended from the loop and from env threads: list.append is atomic
    a_in_step, b_done = threading.Event(), threading.Event()

    class StepBlocksUntilBIsDone(ScriptedEnv):
        def step(self, action):
            if not self.actions:
                events.append("A step starts")
                a_in_step.set()
                events.append("A step ends" if b_done.wait(timeout=5) else "A step gave up")  # hang guard only
            return super().step(action)

    class WaitsForA(ScriptedEnv):
        def step(self, action):
            if not self.actions:
                a_in_step.wait(timeout=5)
            return super().step(action)

    async def engine(context, max_tokens, stop, seed):
        who = chr(context[1])  # CharTokenizer: [BOS, ord(first prompt character), ...]
        n = 1 + sum(e.startswith(f"{who} turn") for e in events)
        events.append(f"{who} turn {n}")
        if (who, n) == ("B", 3):
            b_done.set()
        await asyncio.sleep(0)  # a real engine yields while it samples
        return _turn([20 + n], [-0.1], "m", [VersionSpan(0, 0, 1)])

    runner = EpisodeRunner(engine, CharTokenizer(), max_turns=4, max_tokens=8, max_model_len=64)
    env_a = StepBlocksUntilBIsDone([("o", 0.0, False), ("", 1.0, True)])
    env_b = WaitsForA([("o", 0.0, False), ("o", 0.0, False), ("", 2.0, True)])

    async def both():
        return await asyncio.gather(
            runner.run_episode(env_a, {"prompt": "A"}, prompt_id=0, sample_idx=0),
            runner.run_episode(env_b, {"prompt": "B"}, prompt_id=1, sample_idx=0),
        )

    (_, a), (_, b) = asyncio.run(both())
    order = events.index
    assert order("A step starts") < order("B turn 2") < order("B turn 3") < order("A step ends") < order("A turn 2")
    assert (a.env_reward, b.env_reward) == (1.0, 2.0) and a.completion_mask == [1, 0, 1]
    assert b.completion_mask == [1, 0, 1, 0, 1]


def _adder_env():
    """A ToolEnv with one typed tool, ``add``; its final answer is right when it says 7."""
    from relayrl.envs.toolenv import ToolEnv

    class AdderEnv(ToolEnv):
        def __init__(self):
            super().__init__(tool_timeout_s=5)
            self.tools = (self.add,)

        def add(self, a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: the first
                b: the second
            """
            return a + b

        def finish(self, action):
            return "", float(action.strip() == "Answer: 7"), True

    return AdderEnv()


@pytest.fixture(scope="module")
def qwen_tokenizer():
    from tests.envs.templates import QWEN_TEMPLATE, tiny_tokenizer

    return tiny_tokenizer(QWEN_TEMPLATE)


@pytest.mark.parametrize("ended_with_eos", [False, True])
def test_tool_episode_masks_exactly_the_observation(ended_with_eos, qwen_tokenizer):
    """A real tokenizer and a ToolEnv: a call turn, the tool's result, the answer. Mask 1 exactly on the model's
    ids and 0 exactly on the result's. The result opens with ``<|im_end|>`` (a Hermes turn stops at
    ``</tool_call>``); when the model's turn ended with that token itself (EOS), the observation's copy is
    dropped: either way the sequence is the template's own rendering of the conversation, token for token."""
    tok = qwen_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    call, answer = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>', "Answer: 7"
    ids1 = tok.encode(call, add_special_tokens=False) + ([im_end] if ended_with_eos else [])
    ids2 = [*tok.encode(answer, add_special_tokens=False), im_end]
    engine = ScriptedEngine(
        [
            _turn(ids1, [-0.5] * len(ids1), call, [VersionSpan(0, 0, len(ids1))]),
            _turn(ids2, [-0.25] * len(ids2), answer, [VersionSpan(0, 0, len(ids2))]),
        ]
    )
    env = _adder_env()
    runner = EpisodeRunner(engine, tok, max_turns=3, max_tokens=64, max_model_len=4096)
    sample = {"question": "What is 3 + 4?", "prompt": "unused"}
    first, t = asyncio.run(runner.run_episode(env, sample, prompt_id=0, sample_idx=0))

    obs = env.chat.results([("add", "7")])
    obs_ids = tok.encode(obs, add_special_tokens=False)
    assert obs_ids[0] == im_end and obs.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n7\n")
    env_ids = obs_ids[1:] if ended_with_eos else obs_ids
    assert t.prompt_token_ids == tok.encode(first)
    assert t.completion_token_ids == ids1 + env_ids + ids2
    assert t.completion_mask == [1] * len(ids1) + [0] * len(env_ids) + [1] * len(ids2)
    assert t.behaviour_logprobs == [-0.5] * len(ids1) + [0.0] * len(env_ids) + [-0.25] * len(ids2)
    assert engine.calls[1][0] == t.prompt_token_ids + ids1 + env_ids  # what the second turn conditioned on
    assert engine.calls[0][2] == ["</tool_call>"]
    # the whole sequence is the template's rendering of the structured conversation (the last "\n" follows EOS)
    tool_call = {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}
    conversation = [
        {"role": "user", "content": "What is 3 + 4?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call]},
        {"role": "tool", "name": "add", "content": "7"},
        {"role": "assistant", "content": answer},
    ]
    schemas = [tool.schema for tool in env.toolset.values()]
    rendered = tok.apply_chat_template(conversation, tools=schemas, tokenize=False)
    assert tok.decode(t.prompt_token_ids + t.completion_token_ids) + "\n" == rendered
    assert t.env_reward == 1.0 and t.finish_reason == "stop"
    assert t.env_metrics == {"tool_calls": 1.0, "tool_errors": 0.0, "turns": 2.0, "timed_out": 0.0}


def test_episode_timeout_abandons_a_hanging_step_and_ends_on_a_model_token():
    """The second step hangs: past episode_timeout_s the runner stops waiting (the thread is left to finish),
    keeps what it had (the first step's reward and observation) and ends on the model's last turn."""
    release = threading.Event()

    class HangsOnSecondStep(ScriptedEnv):
        async def reset(self, sample):  # on the loop: no thread start-up eats into the deadline
            return super().reset(sample)

        def step(self, action):
            if self.actions:
                release.wait(timeout=30)
            return super().step(action)

        def metrics(self):
            return {"steps_seen": float(len(self.actions))}

    engine = ScriptedEngine(
        [_turn([10, 11], [-0.1, -0.2], "p", [VersionSpan(0, 0, 2)]), _turn([12], [-0.3], "q", [VersionSpan(0, 0, 1)])]
    )
    env = HangsOnSecondStep([("cd", 0.5, False), ("", 1.0, True)])
    runner = EpisodeRunner(engine, CharTokenizer(), max_turns=4, max_tokens=8, max_model_len=64, episode_timeout_s=2.0)
    t0 = time.perf_counter()
    try:
        _, t = _run(runner, env)
        seconds = time.perf_counter() - t0
    finally:
        release.set()
    assert seconds < 15  # the hanging step was abandoned, not waited for (it would take 30 s)
    assert t.env_metrics == {"steps_seen": 1.0, "turns": 2.0, "timed_out": 1.0}
    assert t.completion_token_ids == [10, 11, 99, 100, 12] and t.completion_mask == [1, 1, 0, 0, 1]
    assert t.env_reward == 0.5 and t.finish_reason == "length"


def test_a_step_returning_after_the_deadline_leaves_no_trailing_observation():
    """A step that returns late with an observation (here an ``async def`` that blocks instead of awaiting, so
    its timeout cannot fire; a thread finishing just before the deadline is the same race): the episode ends on
    the model's turn, its reward kept and the observation dropped, as any episode ending after a step does."""

    class LateStep(ScriptedEnv):
        async def reset(self, sample):
            return super().reset(sample)

        async def step(self, action):
            time.sleep(1.0)  # blocks the loop past the deadline: bad practice, but it must not break the trajectory
            return super().step(action)

    engine = ScriptedEngine([_turn([10, 11], [-0.1, -0.2], "p", [VersionSpan(0, 0, 2)])])
    runner = EpisodeRunner(engine, CharTokenizer(), max_turns=4, max_tokens=8, max_model_len=64, episode_timeout_s=0.3)
    _, t = _run(runner, LateStep([("cd", 0.5, False)]))
    assert t.env_metrics == {"turns": 1.0, "timed_out": 1.0} and t.env_reward == 0.5
    assert t.completion_token_ids == [10, 11] and t.completion_mask == [1, 1] and t.versions == [VersionSpan(0, 0, 2)]
