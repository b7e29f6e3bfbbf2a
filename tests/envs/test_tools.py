"""Typed tools (``relayrl.envs.tools``) and how ``ToolEnv`` runs a call: schemas, argument checks, failures."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from relayrl.envs.chat import ChatTools
from relayrl.envs.sanitize import cut
from relayrl.envs.toolenv import ToolEnv
from relayrl.envs.tools import ToolCall, ToolError, as_tool, call_tool, check_arguments
from tests.envs.templates import tiny_tokenizer


def forecast(city: str, days: int = 1, metric: bool = True, scale: float = 1.0, tags: list[str] | None = None) -> str:
    """Report the weather of a city.

    Args:
        city: the city's name, e.g. Oslo
        days: how many days ahead
        metric: Celsius rather than Fahrenheit
        scale: a factor on every temperature
        tags: labels to attach
    """
    return f"{city} {days} {metric} {scale} {tags}"


FORECAST_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "forecast",
        "description": "Report the weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "the city's name, e.g. Oslo"},
                "days": {"type": "integer", "description": "how many days ahead"},
                "metric": {"type": "boolean", "description": "Celsius rather than Fahrenheit"},
                "scale": {"type": "number", "description": "a factor on every temperature"},
                "tags": {
                    "type": "array",
                    "items": {"type": "string"},
                    "nullable": True,
                    "description": "labels to attach",
                },
            },
            "required": ["city"],
        },
    },
}


# ---- schemas -------------------------------------------------------------------------------------------


def test_schema_from_type_hints_and_google_docstring():
    tool = as_tool(forecast)
    assert tool.schema == FORECAST_SCHEMA  # no "return" entry: chat templates do not expect one
    assert tool.name == "forecast" and tool.parameters == FORECAST_SCHEMA["function"]["parameters"]
    assert as_tool(tool) is tool and as_tool(forecast).schema is tool.schema  # derived once per function


class Index:
    def __init__(self, docs: list[str]):
        self.docs = docs

    def search(self, query: str, k: int = 1) -> str:
        """Find documents containing a word.

        Args:
            query: the word to look for
            k: at most this many documents
        """
        return "\n".join([d for d in self.docs if query in d][:k])


def test_bound_method_has_no_self_and_runs_on_its_instance():
    a, b = Index(["red apple", "red car"]), Index(["blue sea"])
    tool = as_tool(a.search)
    assert tool.schema == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Find documents containing a word.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "the word to look for"},
                    "k": {"type": "integer", "description": "at most this many documents"},
                },
                "required": ["query"],
            },
        },
    }
    assert call_tool(tool, {"query": "red", "k": 2}) == "red apple\nred car"
    assert call_tool(as_tool(b.search), {"query": "sea"}) == "blue sea"  # same schema, its own instance


def untyped(expression):
    """Evaluate.

    Args:
        expression: the text
    """


def undocumented(expression: str) -> str:  # type: ignore[empty-body]
    """Evaluate."""


@pytest.mark.parametrize("fn", [untyped, undocumented])
def test_schema_failures_name_the_fix(fn):
    with pytest.raises(ValueError, match=rf"tool {fn.__name__}: cannot derive its schema .*type hint.*'Args:' line"):
        as_tool(fn)


# ---- argument checks -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, match",
    [
        (["Oslo"], "forecast: arguments must be a JSON object, got list"),
        ("Oslo", "forecast: arguments must be a JSON object, got str"),
        ({"city": "Oslo", "when": 1}, "forecast: unknown argument 'when'; it takes city, days, metric, scale, tags"),
        ({"days": 2}, "forecast: missing argument 'city'"),
        ({"city": 3}, r"forecast: argument 'city' must be string, got int"),
        ({"city": "Oslo", "days": "2"}, "argument 'days' must be integer, got str"),
        ({"city": "Oslo", "days": True}, "argument 'days' must be integer, got bool"),  # bool is not an integer
        ({"city": "Oslo", "days": 2.5}, "argument 'days' must be integer, got float"),
        ({"city": "Oslo", "scale": False}, "argument 'scale' must be number, got bool"),
        ({"city": "Oslo", "metric": 1}, "argument 'metric' must be boolean, got int"),
        ({"city": "Oslo", "tags": "rain"}, "argument 'tags' must be array, got str"),
        ({"city": None}, "argument 'city' must be string, got NoneType"),  # null only where the hint allows it
    ],
)
def test_bad_arguments_are_tool_errors(arguments, match):
    with pytest.raises(ToolError, match=match):
        check_arguments(as_tool(forecast), arguments)
    with pytest.raises(ToolError, match=match):  # call_tool checks before the function runs
        call_tool(as_tool(forecast), arguments)


def test_good_arguments_pass_and_whole_floats_become_integers():
    tool = as_tool(forecast)
    assert check_arguments(tool, {"city": "Oslo"}) == {"city": "Oslo"}
    checked = check_arguments(tool, {"city": "Oslo", "days": 3.0, "scale": 2, "metric": False, "tags": ["a"]})
    assert checked == {"city": "Oslo", "days": 3, "scale": 2, "metric": False, "tags": ["a"]}
    assert type(checked["days"]) is int  # JSON 3.0 is the integer 3
    assert check_arguments(tool, {"city": "Oslo", "tags": None}) == {"city": "Oslo", "tags": None}  # Optional


def test_call_tool_gives_text():
    def count(word: str) -> int:
        """Count letters.

        Args:
            word: any word
        """
        return len(word)

    def nothing(word: str) -> None:
        """Do nothing.

        Args:
            word: any word
        """

    assert call_tool(as_tool(count), {"word": "four"}) == "4"
    assert call_tool(as_tool(nothing), {"word": "x"}) == "None"
    assert call_tool(as_tool(forecast), {"city": "Oslo", "days": 2.0}) == "Oslo 2 True 1.0 None"


# ---- ToolEnv runs calls ----------------------------------------------------------------------------------


def echo(text: str) -> str:
    """Repeat the text.

    Args:
        text: what to repeat
    """
    return text


def refuse(city: str) -> str:
    """Refuse politely.

    Args:
        city: a city
    """
    raise ToolError(f"no weather station in {city}")


def buggy(key: str) -> str:
    """Look a key up in an empty table.

    Args:
        key: the key
    """
    table: dict[str, str] = {}
    return table[key]


def slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "awake"


def flood(n: int) -> str:
    """Print a lot.

    Args:
        n: how many characters
    """
    return "x" * n


class Toolbox(ToolEnv):
    tools = (echo, refuse, buggy, slow, flood)

    def finish(self, action):
        return "", float(action.strip() == "done"), True


def _run(env: ToolEnv, name: str, **arguments) -> tuple[str, float]:
    t0 = time.perf_counter()
    out = asyncio.run(env.run_call(ToolCall(name, arguments)))
    return out, time.perf_counter() - t0


def test_run_call_turns_every_failure_into_text_and_counts_it():
    env = Toolbox(tool_timeout_s=0.2, max_result_chars=100)
    assert _run(env, "echo", text="hi")[0] == "hi"
    assert _run(env, "nope")[0] == "error: unknown tool 'nope'; available: echo, refuse, buggy, slow, flood"
    assert _run(env, "refuse", city="Oslo")[0] == "error: no weather station in Oslo"
    assert _run(env, "echo", txt="hi")[0] == "error: echo: unknown argument 'txt'; it takes text"
    assert _run(env, "buggy", key="k")[0] == "error: KeyError: 'k'"  # the tool's own bug, reported
    out, seconds = _run(env, "slow", seconds=2.0)
    assert out == "error: slow timed out after 0.2 s" and seconds < 1.0  # not waiting for the thread
    out, _ = _run(env, "flood", n=100_000)
    assert len(out) <= 100 and out.startswith("xxx") and out.endswith("xxx") and "chars cut" in out
    # calls: the known tools called (echo twice, refuse, buggy, slow, flood); errors: all but echo and flood
    assert env.metrics() == {"tool_calls": 6.0, "tool_errors": 5.0}


def test_bad_settings_and_a_missing_setup():
    with pytest.raises(ValueError, match="tool_timeout_s=0 must be > 0"):
        Toolbox(tool_timeout_s=0)
    with pytest.raises(ValueError, match="max_result_chars=8 >= 16"):
        Toolbox(max_result_chars=8)
    with pytest.raises(RuntimeError, match=r"Toolbox\.setup\(tokenizer\) must run before the episode starts"):
        Toolbox().reset({"question": "q"})
    env = Toolbox()
    env.setup(tiny_tokenizer("{% for m in messages %}{{ m.content }}{% endfor %}"))
    with pytest.raises(ValueError, match="needs a text 'question' column, the row has \\['answer'\\]"):
        env.reset({"answer": 3})


@pytest.fixture(scope="module")
def tokenizer():
    from relayrl.models.tiny import CHAT_TEMPLATE

    return tiny_tokenizer(CHAT_TEMPLATE)


def test_steps_in_the_default_format(tokenizer):
    """A call, a malformed call and an answer; reset zeroes the counts."""
    env = Toolbox(tool_timeout_s=5)
    env.setup(tokenizer)
    assert isinstance(env.chat, ChatTools) and env.chat.format == "default" and env.stop == ["</tool_call>"]
    prompt = env.reset({"question": "Say hi."})
    assert prompt.endswith("<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.count('"name": "echo"') == 1 and prompt.count("Repeat the text.") == 1

    obs, reward, done = asyncio.run(
        env.step('<tool_call>\n{"name": "echo", "arguments": {"text": "hi"}}\n</tool_call>')
    )
    assert obs == env.chat.results([("echo", "hi")]) and (reward, done) == (0.0, False)
    obs, reward, done = asyncio.run(env.step('<tool_call>{"name": "echo", "arguments": {"text": }}</tool_call>'))
    assert "error: the tool call is not valid JSON" in obs and (reward, done) == (0.0, False)
    assert env.metrics() == {"tool_calls": 1.0, "tool_errors": 1.0}
    assert asyncio.run(env.step("done")) == ("", 1.0, True)
    env.reset({"question": "again"})
    assert env.metrics() == {"tool_calls": 0.0, "tool_errors": 0.0}


@pytest.mark.parametrize("limit", [16, 17, 40, 41, 100])
def test_cut_keeps_head_and_tail_within_the_limit(limit):
    """What bounds a tool's result (``ToolEnv.max_result_chars``, at least 16)."""
    assert cut("short", limit) == "short" and cut("x" * limit, limit) == "x" * limit
    text = "H" * 5000 + "T" * 5000
    out = cut(text, limit)
    assert len(out) <= limit and out[0] == "H"
    if limit >= 40:  # room for the note: head, note (the number of characters cut), tail
        head, tail = out.split("\n")[0], out.split("\n")[-1]
        assert set(head) == {"H"} and set(tail) == {"T"}
        assert out == f"{head}\n...[{10000 - len(head) - len(tail)} chars cut]...\n{tail}"
