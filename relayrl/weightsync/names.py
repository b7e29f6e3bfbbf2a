"""Names that cross process boundaries: where each weight-transfer engine lives, and one variable.

Strings only, and nothing of relayrl imported: the rollout actor reads this without torch, vLLM's
factories and the worker engine (``base.RelayWeightEngine``) import the classes named here when they
need them, and those backend modules import this one back without closing a circle.
"""

from __future__ import annotations

import importlib
from typing import Any

KEEP_ENV = "RELAYRL_KEEP_CPU_WEIGHTS"
"""Set to 1 in a rollout actor's environment (inherited by its vLLM processes) when
``commit=inplace`` (``commit.keep_cpu_weights_if_asked``). Here, not in ``commit``, so the actor
reads it without torch."""

# vLLM factory name -> (module, class); registered lazily, like vLLM's own engines. The worker side
# is one engine for every transport (the trainer picks the transport at init); the trainer side is
# one engine per transport.
WORKER_ENGINES = {"relayrl": ("relayrl.weightsync.base", "RelayWeightEngine")}
RECEIVERS = {  # transport -> engine-side receiver, chosen by the trainer in the init payload
    "shm": ("relayrl.weightsync.shm", "ShmReceiver"),
    "broadcast": ("relayrl.weightsync.broadcast", "BroadcastReceiver"),
    "pull": ("relayrl.weightsync.pull", "PullReceiver"),
}
TRAINER_ENGINES = {
    "relayrl_shm": ("relayrl.weightsync.shm", "ShmTrainerEngine"),
    "relayrl_broadcast": ("relayrl.weightsync.broadcast", "BroadcastTrainerEngine"),
    "relayrl_pull": ("relayrl.weightsync.pull", "PullTrainerEngine"),
}


def load(entry: tuple[str, str]) -> Any:
    """Import ``(module, attribute)`` from one of the tables above."""
    module, name = entry
    return getattr(importlib.import_module(module), name)
