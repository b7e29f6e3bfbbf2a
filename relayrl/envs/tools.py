"""Typed tools: Python functions whose JSON schema comes from their signature and docstring.

A tool is a plain function with type hints and a Google-style docstring (an ``Args:`` line per
parameter)::

    def calculator(expression: str) -> str:
        \"\"\"Evaluate plain arithmetic.

        Args:
            expression: numbers, ( ) and + - * / // % **, e.g. 123*45
        \"\"\"

``as_tool`` derives its OpenAI-style schema with ``transformers.utils.get_json_schema`` (what
``apply_chat_template(tools=...)`` itself uses), so the model reads the same description a chat template
would show. ``call_tool`` checks a call's arguments against that schema before the function runs: a
model's call with a missing, unknown or mistyped argument gets an error message back, never a crash.
The chat side (rendering the schemas, parsing calls, writing results) is ``relayrl.envs.chat``; the
environment that ties them together is ``relayrl.envs.toolenv.ToolEnv``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class ToolError(ValueError):
    """A tool could not do what the call asked; its message (one line) is shown to the model."""


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from a model turn: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Tool:
    """A function and its schema (``{"type": "function", "function": {name, description, parameters}}``)."""

    fn: Callable[..., Any]
    schema: dict[str, Any]

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"].get("parameters", {})


_SCHEMAS: dict[Any, dict[str, Any]] = {}
"""Schemas by function (a bound method's underlying function): derived once per process, not per episode."""


def as_tool(fn: Callable[..., Any] | Tool) -> Tool:
    """``fn`` with its schema; raises ``ValueError`` naming the fix when the docstring lacks what the schema
    needs (a description and an ``Args:`` line for every parameter) or a parameter lacks a type hint."""
    if isinstance(fn, Tool):
        return fn
    key = getattr(fn, "__func__", fn)
    if key not in _SCHEMAS:
        _SCHEMAS[key] = _schema(fn)
    return Tool(fn, _SCHEMAS[key])


def _schema(fn: Callable[..., Any]) -> dict[str, Any]:
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as exc:  # noqa: BLE001 - transformers raises several types; all mean the same fix
        name = getattr(fn, "__name__", repr(fn))
        raise ValueError(
            f"tool {name}: cannot derive its schema ({exc}); give every parameter a type hint and the docstring "
            "a description plus an 'Args:' line per parameter (Google style)"
        ) from None
    schema["function"].pop("return", None)  # not part of the tool schemas chat templates expect
    return schema


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def check_arguments(tool: Tool, arguments: Any) -> dict[str, Any]:
    """The call's arguments if they fit the tool's schema, else ``ToolError`` saying what is wrong.

    Checks: an object; no unknown names; every required one present; JSON types (``integer`` takes a
    whole float such as ``3.0``, ``number`` any int or float; ``bool`` is not a number).
    """
    props, required = tool.parameters.get("properties", {}), tool.parameters.get("required", [])
    if not isinstance(arguments, dict):
        raise ToolError(f"{tool.name}: arguments must be a JSON object, got {type(arguments).__name__}")
    if unknown := sorted(set(arguments) - set(props)):
        raise ToolError(f"{tool.name}: unknown argument {unknown[0]!r}; it takes {', '.join(props) or 'none'}")
    if missing := [k for k in required if k not in arguments]:
        raise ToolError(f"{tool.name}: missing argument {missing[0]!r}")
    return {k: _typed(tool.name, k, v, props[k]) for k, v in arguments.items()}


def _typed(tool: str, key: str, value: Any, spec: dict[str, Any]) -> Any:
    types = spec.get("type")
    if types is None or (value is None and spec.get("nullable")):  # nullable: an ``X | None`` hint
        return value
    for name in types if isinstance(types, list) else [types]:
        if name == "integer" and isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, _JSON_TYPES.get(name, ())) and not (isinstance(value, bool) and name != "boolean"):
            return value
    raise ToolError(f"{tool}: argument {key!r} must be {types}, got {type(value).__name__}")


def call_tool(tool: Tool, arguments: Any) -> str:
    """Check ``arguments`` and run the tool; its result as text (a dict or list as JSON). ``ToolError`` for a bad
    call or an expected failure; any other exception is the tool's own bug and propagates (``ToolEnv`` reports it
    to the model)."""
    result = tool.fn(**check_arguments(tool, arguments))
    if isinstance(result, str):
        return result
    return json.dumps(result, default=str) if isinstance(result, (dict, list)) else str(result)
