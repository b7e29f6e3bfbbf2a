"""Where each tensor lives in one flat byte buffer, and how that buffer is cut into buckets.

Both CPU backends move the model as one flat ``uint8`` buffer: ``shm`` keeps it in a file in
/dev/shm that every engine maps, ``broadcast`` sends it in bucket-sized slices that land in an
engine-side staging buffer. The layout is computed once from parameter metadata (names, dtypes,
shapes: no gather needed) on the trainer, sent to the engines when the transfer is set up, and
checked by digest on every update, so both sides always cut the bytes the same way.

Offsets are aligned to ``ALIGN`` bytes so every slot can be viewed as its dtype without a copy.
A bucket is a run of consecutive slots of at most ``bucket_bytes`` (one slot larger than that is a
bucket of its own): the trainer gathers and packs one bucket at a time, so the extra memory a sync
needs on the trainer is about one bucket.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

ALIGN = 64


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a weight layout")
    return dtype


@dataclass(frozen=True)
class Slot:
    """One tensor: ``nbytes`` bytes at ``offset`` in the flat buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    """Slots ``[first, last)``, occupying bytes ``[start, end)`` of the flat buffer."""

    first: int
    last: int
    start: int
    end: int


@dataclass(frozen=True)
class FlatLayout:
    slots: tuple[Slot, ...]
    buckets: tuple[Bucket, ...]
    nbytes: int

    @classmethod
    def plan(cls, metas: Iterable[tuple[str, torch.dtype, tuple[int, ...]]], bucket_bytes: int) -> FlatLayout:
        """Lay ``(name, dtype, shape)`` tensors end to end (aligned) and cut buckets of ``bucket_bytes``."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes={bucket_bytes} must be positive; set weightsync.bucket_mb")
        slots, offset = [], 0
        for name, dtype, shape in metas:
            nbytes = torch.Size(shape).numel() * dtype.itemsize
            slots.append(Slot(name, dtype_name(dtype), tuple(shape), offset, nbytes))
            offset += -(-nbytes // ALIGN) * ALIGN
        if not slots:
            raise ValueError("no tensors to lay out; the model has no parameters")
        return cls(tuple(slots), _cut_buckets(slots, bucket_bytes), offset)

    @functools.cached_property
    def digest(self) -> str:
        """Short hash of the layout; sender and receiver compare it on every update (computed once)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """Builtins only: crosses vLLM's ``collective_rpc`` (msgpack) and Ray."""
        return {
            "slots": [[s.name, s.dtype, list(s.shape), s.offset, s.nbytes] for s in self.slots],
            "buckets": [list(asdict(b).values()) for b in self.buckets],
            "nbytes": self.nbytes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FlatLayout:
        slots = tuple(Slot(n, dt, tuple(shape), off, nb) for n, dt, shape, off, nb in d["slots"])
        return cls(slots, tuple(Bucket(*b) for b in d["buckets"]), int(d["nbytes"]))

    def views(
        self, buffer: torch.Tensor, first: int = 0, last: int | None = None, base: int = 0
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` views into ``buffer`` (uint8) for slots ``[first, last)``; no copies.

        ``base`` is the buffer's own offset in the flat layout (a bucket buffer starts at its
        bucket's ``start``).
        """
        for s in self.slots[first:last]:
            raw = buffer[s.offset - base : s.offset - base + s.nbytes]
            yield s.name, raw.view(to_dtype(s.dtype)).view(s.shape)

    def check(self, name: str, tensor: torch.Tensor, index: int) -> Slot:
        """The slot for the ``index``-th tensor, after checking the sender yields what was planned."""
        slot = self.slots[index]
        if name != slot.name or tuple(tensor.shape) != slot.shape:
            raise ValueError(
                f"weight {index} is {name!r} {tuple(tensor.shape)} but the layout planned "
                f"{slot.name!r} {slot.shape}; the model changed after the transfer was set up"
            )
        return slot


def _cut_buckets(slots: list[Slot], bucket_bytes: int) -> tuple[Bucket, ...]:
    buckets, first = [], 0
    for i in range(1, len(slots) + 1):
        end_of_run = i == len(slots) or slots[i].offset + slots[i].nbytes - slots[first].offset > bucket_bytes
        if end_of_run:
            buckets.append(Bucket(first, i, slots[first].offset, slots[i - 1].offset + slots[i - 1].nbytes))
            first = i
    return tuple(buckets)


def bucket_views(layout: FlatLayout, bucket: Bucket, out: torch.Tensor, base: int) -> list[torch.Tensor]:
    """Typed views of ``bucket``'s slots in ``out`` (uint8; its byte 0 is flat offset ``base``).

    Build them once per buffer and reuse them every sync: slicing and viewing costs microseconds per
    tensor, which a model with thousands of tensors would pay on every sync."""
    return [t for _, t in layout.views(out, bucket.first, bucket.last, base)]


def pack(
    layout: FlatLayout, bucket: Bucket, named: Iterator[tuple[str, torch.Tensor]], dests: list[torch.Tensor]
) -> None:
    """Copy ``bucket``'s tensors, pulled from ``named`` (the layout's tensors in order, next up
    ``bucket.first``; checked against the plan), into ``dests`` (``bucket_views``), converting to the
    wire dtype. One multi-tensor copy per bucket instead of one call per tensor."""
    tensors = []
    for i in range(bucket.first, bucket.last):
        name, tensor = next(named)
        layout.check(name, tensor, i)
        tensors.append(tensor.detach())
    torch._foreach_copy_(dests, tensors)  # the multi-tensor copy FSDP2 and optimizers use
