"""``shm`` backend: one safetensors file in shared memory (/dev/shm), memory-mapped by each engine.

Why this first: it needs no process group and no GPU, works for any number of engines on one
host, and the payload is the standard checkpoint format. The write is atomic (tmp name, then
``os.replace``), so a reader never sees half a file. The file of version v is removed when
version v+1 has landed; an engine that already opened it keeps reading (POSIX unlink semantics).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from relayrl.weightsync.base import WeightHandle, WeightSender


def _unshared(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous, detached tensors; a tensor sharing storage with an earlier one is cloned.

    safetensors refuses aliased tensors, and tied weights (embed_tokens / lm_head) are aliased.
    """
    seen: set[int] = set()
    out = {}
    for name, tensor in state_dict.items():
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


class ShmSender(WeightSender):
    """Writes ``<shm_dir>/relayrl-<tag>-v<version>.safetensors``; keeps only the newest file."""

    name = "shm"

    def __init__(self, shm_dir: str = "/dev/shm", tag: str | None = None):
        self.dir = Path(shm_dir)
        if not self.dir.is_dir():
            raise FileNotFoundError(f"weightsync.shm_dir={shm_dir} is not a directory; "
                                    "set weightsync.shm_dir to an existing (ideally tmpfs) directory")
        self.tag = tag or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._files: list[Path] = []

    def send(self, state_dict: dict[str, torch.Tensor], version: int) -> WeightHandle:
        tensors = _unshared(state_dict)
        path = self.dir / f"relayrl-{self.tag}-v{version}.safetensors"
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata={"version": str(version)})
        os.replace(tmp, path)
        self._remove_old(keep=path)
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        return WeightHandle(self.name, str(path), version, nbytes, len(tensors))

    def _remove_old(self, keep: Path) -> None:
        for old in self._files:
            if old != keep:
                old.unlink(missing_ok=True)
        self._files = [keep]

    def close(self) -> None:
        self._remove_old(keep=Path())
        self._files = []

    @staticmethod
    def open_weights(handle: WeightHandle) -> Iterator[tuple[str, torch.Tensor]]:
        """Check the file now (missing/overwritten fails before any weight moves), then stream it.

        The file is memory-mapped; each yielded tensor is copied out of the mapping, so at most one
        tensor beyond the engine's own weights is resident at a time.
        """
        if not os.path.exists(handle.location):
            raise FileNotFoundError(f"shm weights v{handle.version} missing at {handle.location}; "
                                    "the sender removed or never wrote it (is a newer version out?)")
        f = safe_open(handle.location, framework="pt", device="cpu")
        names = list(f.keys())
        if len(names) != handle.num_tensors:
            raise ValueError(f"{handle.location} holds {len(names)} tensors, the handle says "
                             f"{handle.num_tensors}; the file was overwritten, resend the weights")
        return ((name, f.get_tensor(name)) for name in names)
