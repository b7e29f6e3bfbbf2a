"""``module:attribute`` import paths, as recipes name user code (reward functions, environments)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any


def import_path(spec: str, kind: str, builtins: Iterable[str], example: str, attr_kind: str = "attribute") -> Any:
    """The object ``spec`` (``package.module:name``) names; every failure is one ``ValueError`` line
    naming ``kind`` (e.g. ``reward``), what is wrong and how to write it (``example``)."""
    if spec.count(":") != 1:
        raise ValueError(
            f"{kind} {spec!r} is neither a built-in ({', '.join(builtins)}) nor an import path; write {example}"
        )
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"{kind} {spec!r}: cannot import module {module_name!r} ({exc}); "
            "check the module path and that it is importable (on PYTHONPATH)"
        ) from None
    if not hasattr(module, attr):
        raise ValueError(
            f"{kind} {spec!r}: module {module_name!r} has no {attr_kind} {attr!r}; check the name after the ':'"
        )
    return getattr(module, attr)
