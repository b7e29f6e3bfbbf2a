"""Tool calls in the model's own chat format: tools into the prompt, calls out of a turn, results back.

``ChatTools(tokenizer)`` picks one of three formats from the tokenizer's chat template:

* ``hermes``: the template renders ``tools=`` and shows calls as ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>`` (Qwen2/2.5/3, Hermes, SmolLM3 and most ChatML-family instruct models).
* ``json``: the template renders ``tools=`` and shows calls as a bare JSON object ``{"name": ...,
  "parameters": {...}}`` filling the turn (Llama 3.1-3.3).
* ``default``: the template has no tools section (SmolLM2, the tiny test models). relayrl writes a
  Hermes-style block into the system message itself (``DEFAULT_TOOLS_PROMPT``), calls are parsed as in
  ``hermes``, and each result goes back as a ``tool`` message holding ``<tool_response>...</tool_response>``.

Results are rendered by the template too: the text between the model's call and its next turn is the
template's own rendering of the tool messages plus the generation prompt, found as the difference of two
renderings (``results``). It starts with the template's end-of-turn marker (``<|im_end|>\\n``), because a
Hermes turn is stopped right after ``</tool_call>``; the episode runner drops that marker when the model
already wrote it. Tool output is untrusted text: ``escape`` breaks up every special token and format tag
in it, so a result can never forge a role marker or a fake ``</tool_response>``.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from relayrl.envs.sanitize import escape_controls, neutralize_markers
from relayrl.envs.tools import ToolCall

FORMATS = ("hermes", "json", "default")

DEFAULT_TOOLS_PROMPT = (
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
"""The tools block of the ``default`` format (Hermes function-calling style), ``{tools}``: one JSON schema per line."""

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
FORMAT_TAGS = (CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE, "<tools>", "</tools>", "<|python_tag|>")
"""Tags a tool's output must not carry verbatim (``escape``), besides the tokenizer's special tokens."""

_SENTINEL = "RELAYRL-TURN-7f3a"
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe", "description": "p", "parameters": {"type": "object", "properties": {}}},
}
_HERMES_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class Parsed:
    """What a model turn asked for: its tool calls (none: a final answer), or why its call was malformed."""

    calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None


class ChatTools:
    """One tokenizer's tool-call format; see the module docstring. Build with ``chat_tools(tokenizer)``."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.format = detect_format(tokenizer)
        self._markers = tuple(
            sorted({*FORMAT_TAGS, *(t for t in _special_tokens(tokenizer) if len(t) > 1)}, key=len, reverse=True)
        )

    @property
    def stop(self) -> list[str]:
        """Strings that end a model turn besides EOS: a Hermes call's closing tag, so the call is answered at once."""
        return [] if self.format == "json" else [CALL_CLOSE]

    def prompt(self, messages: list[dict[str, Any]], schemas: list[dict[str, Any]]) -> str:
        """The first model input: ``messages`` (system, user ...) with the tools, ready for the assistant's turn."""
        if self.format == "default" and schemas:
            block = DEFAULT_TOOLS_PROMPT.format(tools="\n".join(json.dumps(s) for s in schemas))
            messages = _with_system(messages, block)
            return self._render(messages, add_generation_prompt=True)
        return self._render(messages, add_generation_prompt=True, tools=schemas or None)

    def parse(self, text: str) -> Parsed:
        """The calls in one model turn (see ``parse_hermes`` / ``parse_json``)."""
        return parse_json(text) if self.format == "json" else parse_hermes(text)

    def results(self, outputs: list[tuple[str, str]]) -> str:
        """The text after a calling turn: one tool message per ``(name, output)`` (escaped); see ``continue_with``."""
        return self.continue_with([self._tool_message(name, self.escape(out)) for name, out in outputs])

    def reply(self, text: str) -> str:
        """The text after a turn the environment answers as the user (feedback, a next question); see
        ``continue_with``. ``text`` is the environment's own, not escaped."""
        return self.continue_with([{"role": "user", "content": text}])

    def continue_with(self, messages: list[dict[str, Any]]) -> str:
        """The model turn's end-of-turn marker, ``messages`` and the generation prompt of the model's next turn,
        exactly as the template renders them after an assistant turn."""
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        before = self._render(base)
        after = self._render(base + messages, add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError(
                "the chat template renders earlier turns differently once tool messages follow; "
                "relayrl cannot append results to a running episode with it (use a template that renders "
                "each message independently)"
            )
        return before[before.rindex(_SENTINEL) + len(_SENTINEL) :] + after[len(before) :]

    def escape(self, text: str) -> str:
        """Untrusted text made safe to show inside a tool message: control characters escaped, and every role
        marker, tool tag and special token of this tokenizer broken up (``<|im_end|>`` -> ``< |im_end|>``), so
        the tokenizer reads it as plain text and the model sees no forged turn boundary
        (``relayrl.envs.sanitize``)."""
        return neutralize_markers(escape_controls(text), self._markers)

    def _tool_message(self, name: str, content: str) -> dict[str, Any]:
        if self.format == "default":
            content = f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}"
        return {"role": "tool", "name": name, "content": content}

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False, **kw: Any) -> str:
        return _render(self.tokenizer, messages, add_generation_prompt, **kw)


@functools.lru_cache(maxsize=8)
def _cached(tokenizer: Any) -> ChatTools:
    return ChatTools(tokenizer)


def chat_tools(tokenizer: Any) -> ChatTools:
    """``ChatTools`` for ``tokenizer``, built once per tokenizer object (detection renders the template)."""
    return _cached(tokenizer)


def detect_format(tokenizer: Any) -> str:
    """``default`` when rendering with ``tools=`` changes nothing (or fails), else ``hermes`` when the template
    speaks of ``<tool_call>``, else ``json``."""
    probe = [{"role": "user", "content": "hi"}]
    plain = _render(tokenizer, probe, True)
    try:
        with_tools = _render(tokenizer, probe, True, tools=[_PROBE_TOOL])
    except Exception:  # noqa: BLE001 - a template that cannot take tools has no tools section
        return "default"
    if with_tools == plain:
        return "default"
    template = tokenizer.chat_template
    text = json.dumps(template) if isinstance(template, dict) else str(template)
    return "hermes" if CALL_OPEN in text else "json"


def parse_hermes(text: str) -> Parsed:
    """Every ``<tool_call>{json}</tool_call>`` in ``text``; an opened call that never closes, or a body that is not
    ``{"name": str, "arguments": object}`` JSON, is an error the model reads back."""
    bodies = _HERMES_CALL.findall(text)
    if not bodies:
        if CALL_OPEN in text:
            return Parsed(error="the tool call was not closed: end it with the closing tag")
        return Parsed()
    calls = []
    for body in bodies:
        call = _call_from_json(body.strip())
        if isinstance(call, str):
            return Parsed(error=call)
        calls.append(call)
    return Parsed(calls)


def parse_json(text: str) -> Parsed:
    """Llama 3.x style: the turn is one JSON object ``{"name": ..., "parameters": {...}}`` (after an optional
    ``<|python_tag|>``); a turn that does not start with ``{`` is a final answer."""
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return Parsed()
    call = _call_from_json(body)
    return Parsed(error=call) if isinstance(call, str) else Parsed([call])


def _call_from_json(body: str) -> ToolCall | str:
    """A ``ToolCall`` from a call's JSON, or the one-line reason it is malformed."""
    hint = 'write {"name": "<tool>", "arguments": {...}}'
    try:
        obj, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as exc:
        return f"the tool call is not valid JSON ({exc.msg} at character {exc.pos}); {hint}"
    if body[end:].strip():
        return f"the tool call has text after its JSON object; {hint}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return f"the tool call needs a string 'name'; {hint}"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"the tool call's arguments are not a JSON object; {hint}"
    if not isinstance(args, dict):
        return f"the tool call's arguments must be a JSON object; {hint}"
    return ToolCall(obj["name"], args)


def _with_system(messages: list[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    """``messages`` with ``block`` appended to the system message (one is added first when there is none)."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{block}".strip())
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def _special_tokens(tokenizer: Any) -> list[str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return [str(t) for t in decoder.values()] + list(getattr(tokenizer, "all_special_tokens", []))


def _render(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool, **kw: Any) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kw)
