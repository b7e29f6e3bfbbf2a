"""Plain data across the sandbox boundary: a tagged JSON codec, stdlib only.

The judge (trusted) and the sandboxed solution (hostile) exchange call arguments and return values as
one line of JSON each. Only plain data crosses: None, bool, int, float (nan and inf too), complex, str,
bytes, and list / tuple / dict / set / frozenset of them, each of its exact type. Anything else raises
``TypeError`` when encoded, and a line that is not such a value raises ``ValueError`` when decoded, so
no object with behaviour (an ``__eq__`` that is always True, a ``str`` subclass) can reach the judge.

Why not ``repr`` + ``ast.literal_eval``: ``repr(float("nan"))`` does not parse back, and
``literal_eval`` has no depth bound. ``decode`` caps nesting at ``MAX_DEPTH``; the caller caps the
line's length.

The sandbox runs this file's source text ahead of its own (it cannot import relayrl), so it must stay
stdlib-only with no relative imports.
"""

import json
from collections.abc import Callable, Iterable
from typing import Any

Reader = Callable[[list, int], Any]

MAX_DEPTH = 64
MAX_ITEMS = 100_000
"""An iterator a solution returns (a generator, ``map``) is drained into a list of at most this many."""


def encode(value: Any, depth: int = 0) -> list:
    """``value`` as a JSON-able tagged tree; ``TypeError`` for anything that is not plain data."""
    if depth > MAX_DEPTH:
        raise TypeError("nested too deep")
    t = type(value)
    if value is None or t is bool or t is str:
        return [t.__name__ if value is not None else "none", value]
    if t is int:
        return ["int", str(value)]
    if t is float:
        return ["float", value.hex()]
    if t is complex:
        return ["complex", value.real.hex(), value.imag.hex()]
    if t is bytes:
        return ["bytes", value.hex()]
    if t in (list, tuple, set, frozenset):
        return [t.__name__, [encode(v, depth + 1) for v in value]]
    if t is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    if hasattr(value, "__next__") and hasattr(value, "__iter__"):
        return ["list", [encode(v, depth + 1) for v, _ in zip(value, range(MAX_ITEMS))]]
    raise TypeError(f"not plain data: {t.__name__}")


def decode(tree: Any, depth: int = 0) -> Any:
    """The value ``tree`` (from ``encode``) stands for; ``ValueError`` for anything malformed."""
    if depth > MAX_DEPTH or type(tree) is not list or not tree or type(tree[0]) is not str:
        raise ValueError("malformed plain value")
    tag, args = tree[0], tree[1:]
    try:
        return _DECODERS[tag](args, depth + 1)
    except (KeyError, TypeError, IndexError, OverflowError, ValueError) as exc:
        raise ValueError(f"malformed plain value ({tag!r})") from exc


def _leaf(kind: type) -> Reader:
    def read(args: list, depth: int) -> Any:
        if len(args) != 1 or type(args[0]) is not kind:
            raise ValueError(kind.__name__)
        return args[0]

    return read


def _items(kind: Callable[[Iterable], Any]) -> Reader:
    def read(args: list, depth: int) -> Any:
        if len(args) != 1 or type(args[0]) is not list:
            raise ValueError(kind.__name__)
        return kind(decode(v, depth) for v in args[0])

    return read


def _dict(args: list, depth: int) -> dict:
    if len(args) != 1 or type(args[0]) is not list:
        raise ValueError("dict")
    return {decode(k, depth): decode(v, depth) for k, v in args[0]}


def _number(parse: Callable[..., Any], count: int) -> Reader:
    def read(args: list, depth: int) -> Any:
        if len(args) != count or any(type(a) is not str or len(a) > 5000 for a in args):
            raise ValueError(parse.__name__)
        return parse(*args)

    return read


def _complex(real: str, imag: str) -> complex:
    return complex(float.fromhex(real), float.fromhex(imag))


_DECODERS: dict[str, Reader] = {
    "none": _leaf(type(None)),
    "bool": _leaf(bool),
    "str": _leaf(str),
    "int": _number(int, 1),
    "float": _number(float.fromhex, 1),
    "complex": _number(_complex, 2),
    "bytes": _number(bytes.fromhex, 1),
    "list": _items(list),
    "tuple": _items(tuple),
    "set": _items(set),
    "frozenset": _items(frozenset),
    "dict": _dict,
}


def dumps(value: Any) -> str:
    """One line (no newline inside) holding ``value``."""
    return json.dumps(encode(value), separators=(",", ":"))


def loads(line: str) -> Any:
    """The value of one ``dumps`` line; ``ValueError`` for anything else (including bad JSON)."""
    try:
        tree = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError("malformed plain value (json)") from exc
    try:
        return decode(tree)
    except RecursionError as exc:
        raise ValueError("malformed plain value (depth)") from exc
