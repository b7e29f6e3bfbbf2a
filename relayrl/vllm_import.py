"""Import vLLM without Inductor's compiler in processes that never compile with it.

Importing vLLM imports Inductor's lowering and compiler (``torch._inductor.lowering``, ``compile_fx``) twice
over: ``vllm.env_override`` wraps Inductor's fallback list, and ``vllm.utils.deep_gemm`` calls
``torch.compile`` at import, which builds Inductor's wrapper first. Inductor is a heavy import on top of
Dynamo, paid at start-up, on the path to the first step, in every process that imports vLLM: the engines'
fork server, each engine client (the engine host, or the rollout actor without one), each trainer rank
(weight sync). No relayrl process compiles: eager CPU engines run with Dynamo off
(``rollout.actor.EAGER_ENV``), the rollout actor and the trainer never call a vLLM kernel. ``import_vllm``
leaves both imports for the first compile:

- vLLM's patch of the fallback list runs when ``torch._inductor.lowering`` is first imported, if ever (the
  way vLLM defers its own pattern-matcher patch), so a process that does compile gets vLLM's behaviour;
- where Dynamo is off (``TORCHDYNAMO_DISABLE=1``), ``torch.compile`` returns its function, as torch's own
  does then (``torch._dynamo.optimize`` returns a null decorator), without first building the Inductor
  wrapper it would never call. It checks the variable on every call, as torch does.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

LOWERING = "torch._inductor.lowering"


def import_vllm() -> None:
    """Import ``vllm`` (its ``env_override`` patches) with the Inductor imports deferred; no-op once imported."""
    if "vllm.env_override" in sys.modules:
        return
    import torch

    if not getattr(torch.compile, "relayrl_eager", False):
        torch.compile = eager_when_dynamo_off(torch.compile)
    deferred = _Refuse(LOWERING)
    sys.meta_path.insert(0, deferred)
    try:
        import vllm.env_override  # noqa: F401
    finally:
        sys.meta_path.remove(deferred)
    if LOWERING not in sys.modules:  # reached once: vllm.env_override is imported from here on
        sys.meta_path.insert(0, _PatchOnImport())


def dynamo_off() -> bool:
    return os.environ.get("TORCHDYNAMO_DISABLE") == "1"


def eager_when_dynamo_off(compile_fn: Callable) -> Callable:
    """``torch.compile`` that, while Dynamo is off, returns the model (or a decorator returning it) at once."""

    @functools.wraps(compile_fn)
    def compile(model: Any = None, **kwargs: Any) -> Any:
        if not dynamo_off():
            return compile_fn(model, **kwargs)
        return model if model is not None else (lambda fn: fn)

    # A marker on the function object (import_vllm reads it with getattr); functions take attributes, but
    # mypy types functools.wraps's result without them.
    compile.relayrl_eager = True  # type: ignore[attr-defined]
    return compile


class _Refuse(importlib.abc.MetaPathFinder):
    """Fails the import of one module (``vllm.env_override`` catches the ``ImportError`` and skips its patch)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == self.name:
            raise ImportError(f"{fullname}: deferred by relayrl.vllm_import until something compiles")


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """When ``torch._inductor.lowering`` is imported, run vLLM's patch of it right after (once)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != LOWERING:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            from vllm import env_override

            env_override._patch_inductor_fallback_allow_list()

        # Wraps the method on this one loader instance (the module's own spec), not on its class.
        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


__all__ = ["eager_when_dynamo_off", "import_vllm"]
