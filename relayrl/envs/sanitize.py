"""Untrusted text made safe to append to a model's context: tool outputs, program output, retrieved passages.

``sanitize_output`` is the one function for that: decoded, control characters escaped, every chat-template
role marker and tool tag broken up (so an output can never open or close a turn), and cut to a budget
keeping head and tail. ``ChatTools.escape`` (``relayrl.envs.chat``) applies the same marker rules with the
tokenizer's own special tokens added.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MARKER_TAGS = (
    "tool_call",
    "tool_calls",
    "tool_response",
    "tool_result",
    "tool_results",
    "tool",
    "tools",
    "result",
    "function",
    "function_call",
    "think",
    "start_of_turn",
    "end_of_turn",
    "start_of_image",
    "s",
)
"""``<name>``/``</name>`` tags that chat templates and tool protocols give meaning to (Qwen, Hermes, Gemma,
Llama 2, Llama 3.1's ``<function=name>``), broken up wherever they appear as tags (``<tag>``, ``</tag>``,
``<tag x>``)."""
BRACKET_MARKERS = (
    "INST",
    "SYS",
    "TOOL_CALLS",
    "TOOL_RESULTS",
    "AVAILABLE_TOOLS",
    "SYSTEM_PROMPT",
    "THINK",
)
"""Mistral-style ``[NAME]``/``[/NAME]`` control tokens, broken up likewise."""

_PIPE_OPEN = re.compile(r"<(?=[|\uff5c])")  # <|im_start|>, <|eot_id|>, DeepSeek's fullwidth-bar markers
_TAG = re.compile(rf"<(?=/?(?:{'|'.join(MARKER_TAGS)})(?:[\s/>=]))", re.IGNORECASE)
_BRACKET = re.compile(rf"\[(?=/?(?:{'|'.join(BRACKET_MARKERS)})\])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")  # C0 but \t \n, DEL, C1, lone surrogates


def sanitize_output(text: str | bytes, limit: int, *, markers: Iterable[str] = ()) -> str:
    """``text`` made safe to append to a model's context: at most ``limit`` characters, printable, and
    unable to open or close a chat turn or a tool block.

    * bytes are decoded as UTF-8 with errors replaced; ``\\r\\n`` becomes ``\\n``;
    * control characters (all but tab and newline), DEL, C1 controls and lone surrogates become visible
      escapes (``\\x07``, ``\\ud800``): a tokenizer sees no raw control bytes, and nothing fails to encode;
    * role markers are broken up by a space after their first character, so no marker survives verbatim:
      ``<|...`` (``<|im_start|>``, ``<|eot_id|>``, ``<|start_header_id|>``, DeepSeek's ``<`` + U+FF5C ...), the tags
      in ``MARKER_TAGS`` (``</tool_response>``, ``<tool_call>``, ``</result>``, ...), the ``[INST]``-style
      names in ``BRACKET_MARKERS``, and any string in ``markers`` (e.g. a tokenizer's special tokens);
    * text over ``limit`` keeps its head and its tail around ``...[N chars cut]...``.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    extra = sorted({m for m in markers if len(m) > 1}, key=len, reverse=True)
    text = neutralize_markers(escape_controls(text.replace("\r\n", "\n")), extra)
    limit = budget = max(limit, 0)
    # a cut can leave a tag's start against the note (``<tool_call`` + newline): break it too, within ``limit``
    while len(out := neutralize_markers(cut(text, budget), extra)) > limit:
        budget -= len(out) - limit
    return out


def escape_controls(text: str) -> str:
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)


def neutralize_markers(text: str, markers: list[str] | tuple[str, ...] = ()) -> str:
    """Break up every role marker in ``text`` (see ``sanitize_output``) with a space after its first
    character; repeated until none is left, so a break that forms a new marker is broken too."""
    while True:
        out = _BRACKET.sub("[ ", _TAG.sub("< ", _PIPE_OPEN.sub("< ", text)))
        for marker in markers:
            out = out.replace(marker, f"{marker[0]} {marker[1:]}")
        if out == text:
            return out
        text = out


def cut(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else its head and tail around a note of what was cut."""
    if len(text) <= limit:
        return text
    room = limit - len(f"\n...[{len(text)} chars cut]...\n")  # the note is no longer than this
    if room < 2:
        return text[: max(limit, 0)]
    head, tail = text[: room // 2], text[len(text) - (room - room // 2) :]
    return f"{head}\n...[{len(text) - room} chars cut]...\n{tail}"
