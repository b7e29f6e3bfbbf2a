"""Tool calls in model text and a base class for environments that answer them.

A model calls a tool in either of two spellings (the closing tag ends its turn, see ``ToolEnv.stop``)::

    <tool>calc: 3*7</tool>        generic: tool name, colon, arguments
    <calc>3*7</calc>              short: the tool's name is the tag

and the environment appends the tool's output as ``<result>21</result>`` for the model to continue
from. A turn without a tool call is the model's final answer, which the subclass scores (``finish``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

Tool = Callable[[str], str]
"""A tool takes the call's argument text and returns the text the model reads back."""

RESULT_FORMAT = "<result>{}</result>\n"
"""How a tool's output is shown to the model (``{}`` is the output)."""

MAX_RESULT_CHARS = 200
"""Tool outputs (and error messages) are cut to this many characters: they cost context tokens."""


class ToolError(ValueError):
    """A tool could not do what the call asked; its message (one line) is shown to the model."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: str


_GENERIC = re.compile(r"<tool>\s*([A-Za-z_][\w.-]*)\s*:(.*?)</tool>", re.DOTALL)


def parse_tool_call(text: str, tool_names: list[str] | tuple[str, ...]) -> ToolCall | None:
    """The first complete tool call in ``text``, in either spelling, or None.

    The first one, because a turn stops at the first closing tag (the stop strings), so it is the call
    that ended the turn. The generic spelling accepts any name (an unknown one gets an error reply);
    the short spelling only the names in ``tool_names`` (``<b>x</b>`` is not a tool call).
    """
    found = []
    if m := _GENERIC.search(text):
        found.append((m.start(), ToolCall(m.group(1), m.group(2).strip())))
    if tool_names:
        names = "|".join(re.escape(n) for n in tool_names)
        if m := re.search(rf"<({names})>(.*?)</\1>", text, re.DOTALL):
            found.append((m.start(), ToolCall(m.group(1), m.group(2).strip())))
    return min(found, key=lambda f: f[0])[1] if found else None


def _one_line(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ToolEnv:
    """An ``Environment`` whose model turns either call a tool (answered, episode goes on) or finish.

    Subclasses set ``tools`` (name -> ``Tool``) and implement ``finish(action) -> (observation, reward,
    done)`` for turns without a tool call; they may override ``prompt(sample)`` to change the first
    model input. Tool calls earn reward 0: the episode's reward comes from ``finish``.
    """

    tools: ClassVar[dict[str, Tool]] = {}

    def __init__(self) -> None:
        self.sample: dict[str, Any] = {}

    @property
    def stop(self) -> list[str]:
        """Closing tags of both spellings: the model's turn ends right after a call."""
        return ["</tool>", *(f"</{name}>" for name in self.tools)]

    def reset(self, sample: dict[str, Any]) -> str:
        self.sample = dict(sample)
        return self.prompt(self.sample)

    def prompt(self, sample: dict[str, Any]) -> str:
        return sample["prompt"]

    def step(self, action: str) -> tuple[str, float, bool]:
        call = parse_tool_call(action, tuple(self.tools))
        if call is None:
            return self.finish(action)
        return RESULT_FORMAT.format(self.call(call)), 0.0, False

    def call(self, call: ToolCall) -> str:
        """Run one call; any failure becomes ``error: ...`` for the model to read (never an exception)."""
        tool = self.tools.get(call.name)
        if tool is None:
            return _one_line(f"error: unknown tool {call.name!r}; available: {', '.join(self.tools)}")
        try:
            return _one_line(tool(call.args))
        except ToolError as exc:
            return _one_line(f"error: {exc}")
        except Exception as exc:  # noqa: BLE001 - a user tool's bug is the model's problem to read, not a crash
            return _one_line(f"error: {type(exc).__name__}: {exc}")

    def finish(self, action: str) -> tuple[str, float, bool]:
        raise NotImplementedError(f"{type(self).__name__} must implement finish(action) -> (obs, reward, done)")
