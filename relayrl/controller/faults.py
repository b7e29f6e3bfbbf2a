"""What the loop does with a failed call: which failures restart what, and the one-line errors it raises.

=====================================  ==========================================================
failure                                outcome
=====================================  ==========================================================
a generate call's replica died (its    the replica is replaced and its chunk generated again under
actor, its engine, or its deadline)    the same seq (``Scheduler._replace_replica``)
a generate call failed on a live       ``GenerateError``: the task's own error (an environment, a
replica                                prompt); the run stops with its cause in one line
a trainer rank died                    ``TrainerDied``: the driver restarts the system from the
                                       latest checkpoint (``driver.train``)
a trainer rank ran out of memory       ``TrainerOutOfMemory``: the run stops (a restart would run
(Ray's memory monitor, MemoryError,    out again) with one line naming the knobs; the last
torch.OutOfMemoryError)                checkpoint is left as it was, to resume from
=====================================  ==========================================================
"""

from __future__ import annotations

from typing import Any

import ray


class TrainerDied(RuntimeError):
    """A trainer rank's actor died; the driver restarts the system from the latest checkpoint."""


class TrainerOutOfMemory(RuntimeError):
    """A trainer rank ran out of memory in a step; the run stops with the knobs to turn."""


MEMORY_KNOBS = (
    "set trainer.activation_checkpointing=full, lower trainer.max_tokens_per_micro_batch (a longer sequence "
    "still trains alone), lower trainer.logits_chunk, or split rows over more ranks (trainer.cp_size)"
)
"""What ``TrainerOutOfMemory`` tells the user to change, in the order that costs least."""


def out_of_memory(error: BaseException) -> bool:
    """Whether a failed rank call ran out of memory: killed by Ray's memory monitor, or raised ``MemoryError``
    / ``torch.OutOfMemoryError`` (a CUDA allocation) itself."""
    import torch

    cause = getattr(error, "cause", None) or error
    return isinstance(error, ray.exceptions.OutOfMemoryError) or isinstance(
        cause, (MemoryError, torch.OutOfMemoryError, ray.exceptions.OutOfMemoryError)
    )


class GenerateError(RuntimeError):
    """A generate call failed while its replica is alive: the task's own error, not worth a restart."""


def task_error_line(replica: int, error: BaseException) -> str:
    """One line for a generate call that failed on a live replica: the cause's type and first line."""
    cause = getattr(error, "cause", None) or error
    first = (str(cause).strip().splitlines() or [""])[0][:300]
    return (
        f"rollout replica {replica}: generate failed with {type(cause).__name__}: {first} (the replica "
        "is alive, so this is the task's own error - an environment or a prompt - not a restart)"
    )


def trainer_result(trainer: Any, refs: list[ray.ObjectRef]) -> dict:
    """Rank 0's stats once every rank finished. If a rank fails, ``TrainerOutOfMemory`` when it ran out of
    memory, ``TrainerDied`` when some rank's process is gone (the survivors then fail in their collectives:
    gloo reports the closed peer), else the error."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready[0])
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
            if out_of_memory(exc):
                raise TrainerOutOfMemory(f"a trainer rank ran out of memory in a train step; {MEMORY_KNOBS}") from None
            if dead := trainer.dead_ranks():
                raise TrainerDied(f"trainer rank {dead[0]} died in a train step") from exc
            raise
    return ray.get(refs[0])


def generation_error(ref: ray.ObjectRef) -> BaseException | None:
    """After scoring ``ref`` failed: the error the generate call itself ended with (its actor or engine
    died), or None if generation was fine and the failure is the scorer's. Only called on that path, so
    a good result is never pulled into the driver."""
    from ray.exceptions import RayActorError, RayTaskError

    try:
        ray.get(ref, timeout=0)
    except (RayActorError, RayTaskError) as exc:
        return exc
    return None
