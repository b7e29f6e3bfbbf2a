"""What every section module shares: ``ConfigError`` and the two checks most fields use.

Choices are plain ``str`` fields whose allowed values are written once, as a ``Literal`` alias
beside the field (``ModelDtype = Literal["float32", "bfloat16"]``), and checked in the section's
``__post_init__`` through ``one_of``, which reads the values with ``typing.get_args``. Why not the
``Literal`` as the field's annotation, or an ``Enum``: OmegaConf 2.3 structured configs refuse a
``Literal`` annotation ("Unexpected type annotation"), and an ``Enum`` field turns a bad value into
OmegaConf's "Invalid value 'x', expected one of [...]", which names neither the field nor the fix,
and makes the value an enum member everywhere downstream (f-strings, the saved config.yaml, Ray
pickles). A ``str`` checked against the alias keeps the value a string and the error one line:
``model.dtype='float8' is not supported; use one of float32, bfloat16``. Choices that an extension
registry holds (``algorithm.name`` and the losses, reward sandbox modes) are checked against that
registry instead, so the names live in one place.
"""

from __future__ import annotations

from typing import Any, get_args


class ConfigError(ValueError):
    """A configuration problem, described in one line: the field, what is wrong, the fix."""


def positive(section: str, obj: Any, *names: str) -> None:
    """Each field in ``names`` of ``obj`` (the ``section`` config) must be > 0."""
    for name in names:
        value = getattr(obj, name)
        if not value > 0:
            raise ConfigError(f"{section}.{name}={value} must be > 0; set {section}.{name}=<positive value>")


def choices_of(choices: Any) -> tuple[str, ...]:
    """The allowed values: a ``Literal[...]`` alias's args, or ``choices`` (a tuple) itself."""
    return get_args(choices) or tuple(choices)


def one_of(key: str, value: Any, choices: Any) -> None:
    """``value`` of field ``key`` (dotted) must be one of ``choices``, a ``Literal`` or a tuple."""
    names = choices_of(choices)
    if value not in names:
        raise ConfigError(f"{key}={value!r} is not supported; use one of {', '.join(names)}")
