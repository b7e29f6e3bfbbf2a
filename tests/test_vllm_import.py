"""``import_vllm``: vLLM imported without Inductor's compiler, its patch of Inductor applied when that is imported.

Each case runs in a fresh interpreter: what matters is which modules an import leaves behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHECK = """
import json, sys
from relayrl.vllm_import import import_vllm
import_vllm()
import {modules}
import torch
f = lambda x: x + 1
out = {{"lowering_after_import": "torch._inductor.lowering" in sys.modules,
        "compile_returns_fn": torch.compile(f) is f}}
from torch._inductor import graph, lowering
out["patched"] = bool(getattr(lowering.FALLBACK_ALLOW_LIST, "_vllm_patched", False))
out["graph_sees_patch"] = graph.FALLBACK_ALLOW_LIST is lowering.FALLBACK_ALLOW_LIST
print(json.dumps(out))
"""


def _run(modules: str, dynamo_off: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCHDYNAMO_DISABLE"}
    if dynamo_off:
        env["TORCHDYNAMO_DISABLE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", CHECK.format(modules=modules)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_engine_imports_skip_inductor_and_compile_returns_the_function_with_dynamo_off():
    """What the fork server and a rollout actor import (``EAGER_ENV``: Dynamo off). Without ``import_vllm``
    both imports load Inductor's lowering (``vllm.env_override``; ``vllm.utils.deep_gemm``'s ``torch.compile``).
    Once something imports it anyway, vLLM's patch of its fallback list is in place, as after a plain import."""
    out = _run("vllm.v1.engine.async_llm, relayrl.rollout.preload", dynamo_off=True)
    assert out == {
        "lowering_after_import": False,
        "compile_returns_fn": True,
        "patched": True,
        "graph_sees_patch": True,
    }


def test_trainer_imports_skip_inductor_and_compile_still_compiles_with_dynamo_on():
    """A trainer rank's weight-sync modules, Dynamo on: ``torch.compile`` is torch's own (it wraps ``f``)."""
    out = _run("relayrl.weightsync.sync", dynamo_off=False)
    assert out == {
        "lowering_after_import": False,
        "compile_returns_fn": False,
        "patched": True,
        "graph_sees_patch": True,
    }
