"""What a CPU engine's processes get in their environment beside vLLM's own: no torch.compile when eager."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from relayrl.config import RolloutConfig, has_cuda
from relayrl.rollout.actor import core_binds, eager_env

pytestmark = pytest.mark.skipif(has_cuda(), reason="CPU engines only")


def test_an_eager_cpu_engine_turns_dynamo_off_and_a_compiled_one_does_not():
    assert eager_env(RolloutConfig()) == {"TORCHDYNAMO_DISABLE": "1"}  # enforce_eager is the default
    assert eager_env(RolloutConfig(enforce_eager=False)) == {}


def test_vllms_compiled_sampler_helper_runs_eagerly_under_it():
    """The helper the first logprob-asking generate used to compile (a C++ build) runs as plain torch: no
    frame reaches Dynamo, and it still counts right."""
    code = (
        "import torch; from torch._dynamo.utils import counters; "
        "from vllm.v1.sample.ops.logprobs import batched_count_greater_than as f; "
        "x = torch.tensor([[0.1, 0.5, 0.3], [0.9, 0.2, 0.4]]); "  # >= 0.5: 1, >= 0.2: 3
        "print(f(x, x[:, 1:2]).tolist(), counters['frames']['total'])"
    )
    env = {**os.environ, **eager_env(RolloutConfig())}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "[1, 3] 0"


@pytest.mark.parametrize(
    "overrides, adopted",
    [
        ([], True),  # the default recipe's engines adopt the driver's server
        (["rollout.enforce_eager=false"], False),  # Dynamo on: imports that differ from the server's
        (["rollout.forkserver=false"], False),  # vLLM's spawn
        (["run.ray_address=auto"], False),  # engines anywhere in a cluster
    ],
)
def test_the_drivers_server_is_kept_only_for_engines_that_adopt_it(monkeypatch, overrides, adopted):
    """``relayrl train`` starts its server with ``LAUNCH_ENV`` before it reads the config; then it keeps it only
    when the rollout actors will be offered it (their variables are the server's)."""
    from relayrl.config import load_config
    from relayrl.rollout import actor, forkserver

    stopped = []
    monkeypatch.setattr(forkserver, "_shared", forkserver.SharedServer("/listener", "boot", dict(actor.LAUNCH_ENV)))
    monkeypatch.setattr(actor, "stop_shared", lambda: stopped.append(True))
    cfg = load_config("grpo_arith", overrides)
    actor.keep_driver_forkserver(cfg)
    assert stopped == ([] if adopted else [True])


@pytest.mark.parametrize(
    "first, n, workers, binds",
    [
        (0, 2, 1, "0-1"),  # one worker: the old single run
        (0, 2, 2, "0-0|1-1"),  # rollout.pp_size=2 on this box: a core each
        (4, 4, 2, "4-5|6-7"),  # the last 4 of 8 cores, two each
        (1, 1, 2, "1-1|1-1"),  # fewer cores than workers: they share one
        (0, 3, 2, "0-0|1-2"),  # uneven: the later worker takes the extra
    ],
)
def test_each_worker_of_a_pipelined_engine_binds_its_own_cores(first, n, workers, binds):
    assert core_binds(first, n, workers) == binds
