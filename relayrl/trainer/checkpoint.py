"""Sharded trainer checkpoints with torch Distributed Checkpoint (DCP), restored exactly, written async.

Every rank calls ``save``/``load`` together. DCP writes each rank's shards of the model's trained
weights (with LoRA only the adapters: ``TRAINED_ONLY``) and of the optimizer (no gather); each rank's
RNG state goes to its own small tensor file. Atomicity is the caller's job: write into a temporary
directory, record it (``manifest.write``) and rename it once everything, the driver's state included,
is on disk.

Loading unpickles: DCP reads ``dcp/.metadata`` with ``pickle.load`` and the optimizer's non-tensor
entries (its param groups' hyperparameters) with ``torch.load(weights_only=False)``, and either can
run any code; the RNG files use ``weights_only=True`` (tensors and plain containers only). So
``load`` first has ``manifest.verify`` check that this user wrote the directory and that nothing in
it changed since, and reads nothing of a checkpoint that fails.

``Saver`` writes asynchronously with ``dcp.async_save`` (as DataStates-LLM argues, a checkpoint need
not stall training for its write): the call stalls only while the shards are copied into a private
CPU staging copy, then a background thread writes that copy while training goes on, so later steps
cannot change what lands on disk. At most one write is in flight: the next save, a load, or the
caller (``wait``) waits for it first. The background write's collectives run on a gloo group of its
own, so they never interleave with the training step's collectives on the default group (and DCP's
async path needs a CPU backend even when training uses NCCL).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from relayrl.trainer import manifest

Parts = dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]
TRAINED_ONLY = StateDictOptions(ignore_frozen_params=True)
"""Frozen weights are not saved: with ``trainer.lora`` they are the base model, loaded from ``model.path``
again on resume, so a checkpoint holds the adapters and their AdamW state only."""
LOAD_TRAINED = StateDictOptions(ignore_frozen_params=True, strict=False)
"""Loading sets the trained weights and leaves the frozen ones as loaded (``strict`` would demand them);
a trained weight missing from the checkpoint still fails, in ``dcp.load``."""


def _modules(parts: Parts) -> dict[str, dict]:
    """``{"policy": {"model": ..., "optim": ...}, ...}``: DCP state dicts (sharded, no gather)."""
    out = {}
    for name, (model, optim) in parts.items():
        model_sd, optim_sd = get_state_dict(model, optim, options=TRAINED_ONLY)
        model_sd = {k: v for k, v in model_sd.items() if k not in _frozen(model)}
        out[name] = {"model": model_sd, "optim": optim_sd}
    return out


def _frozen(model: torch.nn.Module) -> set[str]:
    """State-dict keys of frozen parameters. ``ignore_frozen_params`` misses a tied alias (a LoRA model's
    ``lm_head.weight`` is the frozen embedding under a second name), so it is dropped by identity here."""
    return {
        k
        for k, v in model.state_dict(keep_vars=True).items()
        if isinstance(v, torch.nn.Parameter) and not v.requires_grad
    }


def init_optimizer_state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state tensors (AdamW's moments appear on the first step) so that DCP
    has somewhere to load them: one step with zero gradients at lr 0 changes no parameter."""
    if optim.state:
        return
    lrs = [g["lr"] for g in optim.param_groups]
    for g in optim.param_groups:
        g["lr"] = 0.0
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optim.step()
    optim.zero_grad(set_to_none=True)
    for g, lr in zip(optim.param_groups, lrs):
        g["lr"] = lr


def _save_rng(path: Path, rank: int) -> None:
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, path / f"rng-rank{rank}.pt")


class Saver:
    """One rank's checkpoint writer: at most one asynchronous DCP write in flight."""

    def __init__(self) -> None:
        self._future: Future | None = None
        self._group: dist.ProcessGroup | None = None  # gloo group for background collectives

    def save(self, path: Path, parts: Parts, rank: int, asynchronous: bool = True) -> float:
        """Collective: shards of every ``(model, optimizer)`` in ``parts`` under ``path/dcp``, RNG per
        rank. Returns the seconds this call held the caller (the stall training sees): with
        ``asynchronous`` the wait for the previous write plus the staging copy, else the whole write."""
        t0 = time.perf_counter()
        self.wait()
        path.mkdir(parents=True, exist_ok=True)
        for model, optim in parts.values():
            init_optimizer_state(model, optim)
        state, target = _modules(parts), str(path / "dcp")
        if asynchronous:
            # typed Future | AsyncSaveResponse: the latter only for an async stager, which is not passed here
            self._future = cast(Future, dcp.async_save(state, checkpoint_id=target, process_group=self._pg()))
        else:
            dcp.save(state, checkpoint_id=target)
        _save_rng(path, rank)  # after DCP's collectives: a rank failing here leaves none waiting
        return time.perf_counter() - t0

    def _pg(self) -> dist.ProcessGroup | None:
        if self._group is None and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")  # collective: every rank is in save together
        return self._group

    def done(self) -> bool:
        """Whether no write is in flight; a finished write's error is raised here."""
        if self._future is not None and self._future.done():
            self.wait()
        return self._future is None

    def wait(self) -> None:
        """Block until the in-flight write (if any) is on disk; its error is raised here."""
        future, self._future = self._future, None
        if future is not None:
            future.result()


def save(path: Path, parts: Parts, rank: int) -> None:
    """Collective, synchronous: ``Saver().save(..., asynchronous=False)``."""
    Saver().save(path, parts, rank, asynchronous=False)


def load(path: Path, parts: Parts, rank: int) -> None:
    """Collective: restore what ``save`` wrote into the live (already sharded) modules and optimizers,
    once ``manifest.verify`` passed (every rank checks the files it is about to unpickle)."""
    manifest.verify(path)
    for model, optim in parts.values():
        init_optimizer_state(model, optim)
    state = _modules(parts)
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    for name, (model, optim) in parts.items():
        set_state_dict(
            model,
            optim,
            model_state_dict=state[name]["model"],
            optim_state_dict=state[name]["optim"],
            options=LOAD_TRAINED,
        )
    rng = torch.load(_rng_file(path, rank), weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def _rng_file(path: Path, rank: int) -> Path:
    """This rank's RNG file; a checkpoint written by fewer ranks (another layout: a world size or pipeline
    change, resharded by DCP) has none for it, and this rank takes rank ``rank % ranks written``'s."""
    own = path / f"rng-rank{rank}.pt"
    if own.exists():
        return own
    written = len(list(path.glob("rng-rank*.pt")))
    if not written:
        raise FileNotFoundError(f"{path} holds no rng-rank*.pt: not a complete trainer checkpoint")
    return path / f"rng-rank{rank % written}.pt"
