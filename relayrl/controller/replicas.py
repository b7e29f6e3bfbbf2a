"""Rollout replica health, for the controller's recovery (``System.restart_rollout``): is a replica up, does
it still answer, was a failed call its death, where its process runs (to kill what ``ray.kill`` leaves),
and how long to wait before the next attempt to replace it. No state: each helper asks Ray or computes."""

from __future__ import annotations

from typing import Any

import ray


def wait_engines_up(rollouts: list[Any], timeout_s: float, what: str, digest: str = "") -> list[dict[str, Any]]:
    """Every replica's ``info`` once its engine is up; ``TimeoutError`` (one line) past ``timeout_s`` (0: none).
    With ``digest`` (the driver's ``model_digest``), each engine's copy of the model is checked against it."""
    try:
        infos = ray.get([r.info.remote() for r in rollouts], timeout=timeout_s or None)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(
            f"{what} did not come up within rollout.start_timeout_s={timeout_s:g}s (a hung engine "
            "start; raise it if loading the model takes longer)"
        ) from None
    for info in infos if digest else []:
        check_same_model(info, digest)
    return infos


def check_same_model(info: dict[str, Any], digest: str) -> None:
    """An engine whose node holds another model or tokenizer at ``model.path`` than the driver's is refused before
    it serves (``relayrl.models.digest``), in one line naming the node and the fix."""
    if info.get("model_digest") != digest:
        raise ValueError(
            f"the rollout engine on node {info.get('node')} loaded a model directory whose config or tokenizer "
            f"differs from the driver's (digest {info.get('model_digest')} != {digest}); give every node the same "
            "files at model.path"
        )


def actor_process(actor: Any, reported: tuple[str, int] | None = None) -> tuple[str, int] | None:
    """(node IP, pid) of a live or starting actor's process from Ray's actor table (the GCS table behind
    ``ray.util.state``, which needs the dashboard); None once it is dead (its pid may be another's now).
    ``reported`` (what the actor's ``info`` said) stands in only when the table cannot be read."""
    from ray._private.state import state

    try:
        entry = state.actor_table(actor._actor_id.hex())
    except Exception:  # noqa: BLE001 - no table to ask: the pid the replica reported is the best there is
        return reported
    ip, pid = (entry.get("Address") or {}).get("IPAddress"), entry.get("Pid")
    return (ip, int(pid)) if ip and pid and entry.get("State") != "DEAD" else None


def answers(rollout: Any, timeout_s: float = 30.0) -> bool:
    """Does this replica's actor and engine answer a cheap call? (A dead engine raises on any call; a
    hung one does not answer within ``timeout_s``.)"""
    try:
        ray.get(rollout.weight_version.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - any failure to answer means the replica must be replaced
        return False
    return True


def is_death(error: BaseException, rollout: Any) -> bool:
    """Did the generate call that raised ``error`` fail because its replica died? An actor error is a
    death; a task error is one only if the replica no longer answers (vLLM raises ``EngineDeadError``
    inside the task when its EngineCore is gone). A task error on a live replica is deterministic (an
    environment's exception, an over-long prompt): restarting would fail the same way."""
    if isinstance(error, ray.exceptions.RayActorError):
        return True
    return not answers(rollout)


def restart_backoff_s(attempt: int, cap_s: float = 30.0) -> float:
    """Seconds to wait before restart attempt ``attempt + 1`` of one replica: 1, 2, 4, ... capped."""
    return min(2.0 ** (attempt - 1), cap_s)
