"""The weight-sync interface: vLLM's weight-transfer engines, with relayrl's transaction on top.

vLLM 0.32 defines the shape (``vllm.distributed.weight_transfer``): a *trainer engine* in the
trainer process drives a *worker engine* inside every vLLM worker through a four-call control
plane (init, start, update, finish). relayrl's CPU backends (``shm``, ``broadcast``, ``pull``) are engines
of exactly that shape, registered in vLLM's factories, so all backends - vLLM's own ``nccl`` and
``ipc`` included - run through one code path. What relayrl adds is the transaction::

    start    engine pauses (running requests freeze), drops any staged payload
    transfer trainer gathers one bucket at a time and ships it; engines receive into staging
    verify   engine checks version, layout digest and completeness; nothing loaded yet
    commit   engine loads the staged weights (``commit.py``: in place, or vLLM's reload_weights),
             then the label := version
    abort    on any failure or timeout: staged bytes are dropped and the engine resumes on the
             previous version, so a half-transferred model is never served

Worker side: one engine, ``RelayWeightEngine`` (receive into a flat buffer through a transport's
``Receiver``, load only on commit). Trainer side: one ``FlatTrainerEngine`` subclass per transport
(layout from metadata, gather per bucket).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from relayrl.weightsync.layout import FlatLayout, to_dtype
from relayrl.weightsync.names import RECEIVERS, load

if TYPE_CHECKING:
    from relayrl.weightsync.client import RolloutClient


@dataclass
class FlatUpdateInfo(WeightTransferUpdateInfo):
    """Per-update control message: which version, cut by which layout."""

    version: int
    digest: str


@dataclass
class RelayInitInfo(WeightTransferInitInfo):
    """What every relayrl worker engine gets at init: the layout and how bytes will arrive.

    ``transport`` picks the receiver (``RECEIVERS``); ``channel`` is its address (shm: the file;
    broadcast: the store, group and world size; pull: the directory and the writer's id); ``rank_offset`` is this
    engine's first group rank.
    """

    layout: dict[str, Any]
    transport: str
    channel: dict[str, Any]
    rank_offset: int = 0


class Receiver(Protocol):
    """Engine-side end of one transport: make a whole version's payload available as a flat buffer."""

    def receive(self, layout: FlatLayout, info: FlatUpdateInfo) -> torch.Tensor: ...

    def close(self) -> None: ...


class RelayWeightEngine(WeightTransferEngine):
    """Worker side of relayrl's backends: receive a whole version, verify it, load it only on commit.

    One vLLM engine (registered as ``relayrl``) for every CPU transport: the transport is chosen by
    the trainer at init, so an engine does not need restarting to switch, and engines on another
    host can be given ``broadcast`` while local ones map ``shm``.
    """

    init_info_cls = RelayInitInfo
    update_info_cls = FlatUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layout: FlatLayout | None = None
        self.receiver: Receiver | None = None
        self._staged: torch.Tensor | None = None

    def init_transfer_engine(self, init_info: RelayInitInfo) -> None:
        if init_info.transport not in RECEIVERS:
            raise ValueError(f"unknown transport {init_info.transport!r}; use one of {', '.join(RECEIVERS)}")
        self.shutdown()
        self.layout = FlatLayout.from_dict(init_info.layout)
        pc = self.parallel_config
        rank = init_info.rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        self.receiver = load(RECEIVERS[init_info.transport])(self.layout, init_info.channel, rank)

    def start_weight_update(self) -> None:
        self._staged = None

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Transfer + verify. (vLLM's base also calls ``torch.accelerator.synchronize()``, which raises
        on a CPU-only host; nothing here is asynchronous, so it is left out.)"""
        info = self.parse_update_info(update_info)
        self._staged = None
        if self.receiver is None or self.layout is None:  # both are set by init_transfer_engine
            raise RuntimeError("weight transfer was not initialised; call init_weight_transfer_engine first")
        if info.digest != self.layout.digest:
            raise ValueError(
                f"v{info.version}: trainer layout {info.digest} != engine layout "
                f"{self.layout.digest}; re-run init_weight_transfer_engine"
            )
        self._staged = self.receiver.receive(self.layout, info)

    def receive_weights(self, update_info: FlatUpdateInfo) -> None:
        raise NotImplementedError("relayrl engines receive in update_weights")

    def finish_weight_update(self) -> None:
        """Commit: the only place the model's weights change."""
        if self._staged is None or self.layout is None:  # a payload is staged only against a layout
            raise RuntimeError("finish_weight_update without a verified payload; the update was aborted")
        from relayrl.weightsync.commit import load_flat

        buffer, self._staged = self._staged, None
        load_flat(self.vllm_config, self.model, self.layout, buffer)

    def abort_weight_update(self) -> None:
        """Drop whatever was staged; the model was not touched."""
        self._staged = None

    def shutdown(self) -> None:
        self._staged = None
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None


class FlatTrainerEngine(TrainerWeightTransferEngine):
    """Trainer side: every rank iterates the source (FSDP gathers are collectives); rank 0 ships.

    ``client`` must be relayrl's ``RolloutClient`` (it carries the version being sent). Subclasses
    implement ``transfer``: move the payload and have the engines verify it.
    """

    backend: ClassVar[str]
    client: RolloutClient  # vLLM's base types it as its client protocol; ours also carries version and seconds
    source: WeightSource  # vLLM's base allows None (engines given a payload instead); ours always iterate one

    def __init__(self, *, client: RolloutClient, source: WeightSource, is_sender: bool, layout: FlatLayout) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.layout = layout

    @classmethod
    def planned(cls, init_info: Any, client: Any, source: WeightSource | None) -> Any:
        """This engine over ``source``'s layout, cut into ``init_info``'s buckets in its wire dtype: the common
        start of every subclass's ``trainer_init`` (which then connects the sender)."""
        if source is None:  # vLLM's signature allows none; these engines ship a trainer's weights
            raise ValueError(f"the {cls.__name__} weight-sync engine needs source= (the trainer's weights)")
        layout = plan_layout(source, init_info.bucket_bytes, init_info.wire_dtype)
        return cls(client=client, source=source, is_sender=init_info.is_sender, layout=layout)

    @abstractmethod
    def transfer(self, named: Iterator[tuple[str, torch.Tensor]], info: dict[str, Any]) -> None:
        """Ship every tensor ``named`` yields and have the engines receive and verify ``info``."""

    def send_weights(self) -> None:
        named = iter(self.source)
        if not self.is_sender:
            drain(named)
            return
        self.client.start_weight_update()
        t0 = time.perf_counter()
        try:
            with one_thread():
                self.transfer(named, {"version": self.client.version, "digest": self.layout.digest})
        finally:
            drain(named)  # a failed transfer still finishes the gathers, or FSDP peers would hang
        self.client.seconds["transfer"] = time.perf_counter() - t0  # gathers + copies + engine receive
        self.client.finish_weight_update()


def plan_layout(source: WeightSource, bucket_bytes: int, wire_dtype: str | None) -> FlatLayout:
    """The flat layout of ``source``'s tensors, cast to ``wire_dtype`` (the engine's dtype) if given."""
    dtype = to_dtype(wire_dtype) if wire_dtype else None
    return FlatLayout.plan(((m.name, dtype or m.dtype, m.shape) for m in source.metadata()), bucket_bytes)


@contextmanager
def one_thread() -> Iterator[None]:
    """Copy with one torch thread. A copy is bound by memory bandwidth, which one thread already fills
    (memcpy speed), while splitting each tensor's copy over threads makes its time depend on every thread
    getting a core: on a host whose cores are busy one late thread stalls the whole copy
    (``bench/weight_sync.py`` prints both)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class DeferredError:
    """The first error of a step that every rank must finish, since collectives follow it: ``catch`` keeps it instead
    of raising, and ``reraise`` raises it once the ranks have met, letting go of it as it does. A frame that kept
    the error in a local while raising it would hold its own traceback, and through it what the frame holds (an
    engine, a process group) until a gc; a gloo group that outlives its ``destroy_process_group`` that way is
    destroyed during interpreter exit, which aborts the process."""

    def __init__(self) -> None:
        self.error: Exception | None = None

    def __bool__(self) -> bool:
        return self.error is not None

    @contextmanager
    def catch(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - kept, to be raised once the ranks have met
            self.error = self.error or exc

    def reraise(self) -> None:
        if self.error is not None:
            try:
                raise self.error
            finally:
                self.error = None


def drain(it: Iterator[Any]) -> None:
    for _ in it:
        pass


class StateDictSource(WeightSource):
    """A ``WeightSource`` over a plain ``{name: tensor}`` dict (tests, benchmarks, a saved checkpoint)."""

    def __init__(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.state_dict = state_dict

    def metadata(self) -> list:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.state_dict.items()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.state_dict.items())
