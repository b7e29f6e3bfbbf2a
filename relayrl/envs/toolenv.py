"""``ToolEnv``: an environment whose model turns either call typed tools or give the final answer.

An episode, in the model's own chat format (``relayrl.envs.chat``)::

    reset:  [system: instructions + tools, user: question]  -> the prompt, ready for the assistant's turn
    step:   the turn holds a call  -> each call checked and run (off the event loop, ``tool_timeout_s`` each);
                                      the results go back as tool messages; reward ``turn_reward`` (0 by default)
            a malformed call or an unknown tool -> an error result the model reads; the episode goes on
            no call                -> ``finish(action)``: the subclass scores the final answer

A subclass gives ``tools`` (typed functions or bound methods, see ``relayrl.envs.tools``) and ``finish``;
it may override ``instructions`` (system-prompt text), ``question`` (the user message) and ``turn_reward``
(per-turn shaping: the episode's reward is the sum of its turns'). ``metrics`` reports the episode's tool
use (calls, errors) for the run's ``env/*`` metrics.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Any

from relayrl.envs.base import in_thread
from relayrl.envs.chat import ChatTools, chat_tools
from relayrl.envs.sanitize import cut
from relayrl.envs.tools import Tool, ToolCall, ToolError, as_tool, call_tool

MAX_RESULT_CHARS = 1000
"""Tool outputs are cut to this many characters (head and tail kept): they cost context tokens."""


class ToolEnv:
    """Tools offered in the chat template; see the module docstring."""

    tools: Sequence[Callable[..., Any] | Tool] = ()

    def __init__(self, tool_timeout_s: float = 10.0, max_result_chars: int = MAX_RESULT_CHARS) -> None:
        if tool_timeout_s <= 0 or max_result_chars < 16:
            raise ValueError(
                f"tool_timeout_s={tool_timeout_s} must be > 0 and max_result_chars={max_result_chars} >= 16; "
                "fix env.kwargs"
            )
        self.tool_timeout_s, self.max_result_chars = tool_timeout_s, max_result_chars
        self.sample: dict[str, Any] = {}
        self.chat: ChatTools | None = None
        self.calls = self.errors = 0

    # ---- what a subclass gives -------------------------------------------------------------------
    def instructions(self, sample: dict[str, Any]) -> str:
        """System-prompt text before the tools block ("" for none)."""
        return ""

    def question(self, sample: dict[str, Any]) -> str:
        """The user message: the row's ``question``."""
        if not isinstance(sample.get("question"), str):
            raise ValueError(
                f"{type(self).__name__} needs a text 'question' column, the row has {sorted(sample)}; "
                "use a generated task or a dataset with a question column"
            )
        return sample["question"]

    def finish(self, action: str) -> tuple[str, float, bool]:
        """A turn without a tool call: ``(observation, reward, done)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement finish(action) -> (obs, reward, done)")

    def turn_reward(self, calls: list[ToolCall], outputs: list[str]) -> float:
        """Reward of a calling turn (per-turn shaping); 0 by default."""
        return 0.0

    # ---- the Environment protocol ------------------------------------------------------------------
    def setup(self, tokenizer: Any) -> None:
        """Called by the episode runner before ``reset``: the engine's tokenizer decides the chat format."""
        self.chat = chat_tools(tokenizer)

    @functools.cached_property
    def toolset(self) -> dict[str, Tool]:
        """The tools by name (schemas derived once per process, ``relayrl.envs.tools.as_tool``)."""
        return {t.name: t for t in map(as_tool, self.tools)}

    @property
    def stop(self) -> list[str]:
        return self._chat().stop

    def reset(self, sample: dict[str, Any]) -> str:
        self.sample, self.calls, self.errors = dict(sample), 0, 0
        messages = [{"role": "user", "content": self.question(self.sample)}]
        if system := self.instructions(self.sample):
            messages.insert(0, {"role": "system", "content": system})
        return self._chat().prompt(messages, [t.schema for t in self.toolset.values()])

    async def step(self, action: str) -> tuple[str, float, bool]:
        parsed = self._chat().parse(action)
        if parsed.error:
            self.errors += 1
            return self._chat().results([("error", f"error: {parsed.error}")]), 0.0, False
        if not parsed.calls:
            return self.finish(action)
        outputs = [await self.run_call(call) for call in parsed.calls]
        results = [(c.name, out) for c, out in zip(parsed.calls, outputs)]
        return self._chat().results(results), self.turn_reward(parsed.calls, outputs), False

    def metrics(self) -> dict[str, float]:
        """The episode's tool use: calls made (well-formed, known tool) and errors (malformed, unknown, failed)."""
        return {"tool_calls": float(self.calls), "tool_errors": float(self.errors)}

    # ---- running a call ----------------------------------------------------------------------------
    async def run_call(self, call: ToolCall) -> str:
        """One call's output, or ``error: ...``; never raises. The tool runs in a worker thread, bounded by
        ``tool_timeout_s`` (a thread cannot be killed: a tool that can hang should bound itself too)."""
        tool = self.toolset.get(call.name)
        if tool is None:
            self.errors += 1
            return f"error: unknown tool {call.name!r}; available: {', '.join(self.toolset)}"
        self.calls += 1
        try:
            out = await asyncio.wait_for(in_thread(call_tool, tool, call.arguments), self.tool_timeout_s)
        except TimeoutError:
            out, self.errors = f"error: {call.name} timed out after {self.tool_timeout_s:g} s", self.errors + 1
        except ToolError as exc:
            out, self.errors = f"error: {exc}", self.errors + 1
        except Exception as exc:  # noqa: BLE001 - a tool's bug is the model's to read, not a crash
            out, self.errors = f"error: {type(exc).__name__}: {exc}", self.errors + 1
        return cut(out, self.max_result_chars)

    def _chat(self) -> ChatTools:
        if self.chat is None:
            raise RuntimeError(f"{type(self).__name__}.setup(tokenizer) must run before the episode starts")
        return self.chat
