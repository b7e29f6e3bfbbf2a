"""The ``shm`` and ``pull`` backends over a pipelined policy (``StageSource``): each stage writes its own weights
into the shared buffer (or the store's draft), and rank 0 stamps (or publishes) the version only once every stage
has written (``ShmTrainerEngine.send_stages``, ``PullTrainerEngine.send_stages``).

Two gloo ranks in real processes (four for pp 2 x tp 2), each holding its stage's parameters of a toy module (the
other's are meta stand-ins, as ``pp_weights.load_stages`` leaves them). The engine side is the real ``ShmReceiver``
or ``PullReceiver`` over what rank 0's client is given; the client is a stand-in that records the control calls
(no vLLM engine here)."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
import torch.distributed as dist

from bench.ranks import spawn_ranks
from relayrl.weightsync.base import FlatUpdateInfo
from relayrl.weightsync.layout import FlatLayout
from relayrl.weightsync.shm import WRITING, ShmReceiver, ShmTrainerEngine, ShmTrainerInitInfo
from relayrl.weightsync.stages import StageSource

pytestmark = pytest.mark.slow  # two processes importing vLLM: ~30 s on this box

OWNER = {"a": 0, "b": 1, "c": 0, "d": 1}  # a parameter name -> the pipeline rank whose stage holds it
SHAPES = {"a": (3, 2), "b": (4,), "c": (2, 2), "d": (5,)}


def _value(name: str) -> torch.Tensor:
    return torch.arange(torch.Size(SHAPES[name]).numel(), dtype=torch.float32).view(SHAPES[name]) + 10 * ord(name)


class _Stages(torch.nn.Module):
    """This rank's parameters hold their values; the other stage's are meta stand-ins."""

    def __init__(self, rank: int):
        super().__init__()
        for name, shape in SHAPES.items():
            mine = OWNER[name] == rank
            value = _value(name) if mine else torch.empty(shape, device="meta")
            self.register_parameter(name, torch.nn.Parameter(value, requires_grad=mine))


class _Client:
    """Records what rank 0 asks of the engines; maps the buffer as an engine worker would."""

    def __init__(self) -> None:
        self.version, self.timeout_s, self.seconds = 0, 60.0, {}
        self.calls: list[str] = []
        self.receiver: Any = None
        self.layout: FlatLayout | None = None

    def init_weight_transfer_engine(self, info: dict) -> None:
        from relayrl.weightsync.pull import PullReceiver

        self.layout = FlatLayout.from_dict(info["layout"])
        receiver = {"shm": ShmReceiver, "pull": PullReceiver}[info["transport"]]
        self.receiver = receiver(self.layout, info["channel"], 0)

    def start_weight_update(self) -> None:
        self.calls.append(f"start {self.version}")

    def update_weights(self, info: dict) -> None:
        self.calls.append(f"update {info['version']}")

    def finish_weight_update(self) -> None:
        self.calls.append(f"finish {self.version}")


def _trainer_engine(backend: str, rank: int, client: _Client, source: StageSource, where: str):
    from relayrl.weightsync.pull import PullTrainerEngine, PullTrainerInitInfo

    if backend == "shm":
        shm = ShmTrainerInitInfo(rank=rank, shm_dir=where, bucket_bytes=64)
        return ShmTrainerEngine.trainer_init(shm, client=client, source=source)
    pull = PullTrainerInitInfo(rank=rank, pull_dir=where, keep=2, bucket_bytes=64)
    return PullTrainerEngine.trainer_init(pull, client=client, source=source)


def _worker(rank: int, backend: str, where: str, out: str) -> None:
    """v1 written by both stages into ``backend``'s buffer (shm) or store (pull, ``where``); v2 failed by rank 1's."""
    group = dist.group.WORLD
    assert group is not None
    source, client = StageSource(_Stages(rank), OWNER, group), _Client()
    engine = _trainer_engine(backend, rank, client, source, where)
    client.version = 1
    engine.send_weights()
    result: dict = {"calls": list(client.calls)}
    if rank == 0:  # the engine side: read from the buffer, or fetched from the store with every checksum checked
        data = client.receiver.receive(client.layout, FlatUpdateInfo(1, client.layout.digest))
        result["v1"] = {name: view.clone() for name, view in client.layout.views(data)}
    if rank == 1:  # its stage fails mid-write at v2: a tensor of another shape than planned
        source.own = lambda: iter([("b", _value("b")), ("d", torch.zeros(2))])  # type: ignore[method-assign]
    client.version = 2
    try:
        engine.send_weights()
    except (RuntimeError, ValueError) as exc:
        result["error"] = str(exc)
    result["calls2"] = client.calls[len(result["calls"]) :]
    if rank == 0 and backend == "shm":
        result["stamp"] = int(client.receiver.region.header[1])
    engine_ref = weakref.ref(engine)
    del engine, source  # a failed sync leaves nothing holding them (a group kept alive to exit aborts there)
    result["freed"] = engine_ref() is None
    torch.save(result, f"{out}.{rank}")


@pytest.mark.parametrize("backend", ["shm", "pull"])
def test_each_stage_writes_its_part_and_a_failed_stage_leaves_the_engines_on_the_last_version(tmp_path, backend):
    """v1: the engines' buffer (shm) or the published version (pull) holds every stage's weights, each written by
    the rank holding it, and rank 0 drove start, update and finish. v2: rank 1's stage fails mid-write; rank 1
    raises its own error, rank 0 raises that a stage did not write, and the engines are never asked to take it:
    the stamp stays mid-write (a receiver refuses it), or the store holds v1 alone (no v2, no draft left)."""
    (where := tmp_path / "where").mkdir()
    out = str(tmp_path / "result")
    spawn_ranks(_worker, 2, tmp_path / "pg", backend, str(where), out)
    first, second = (torch.load(f"{out}.{r}") for r in range(2))
    assert first["calls"] == ["start 1", "update 1", "finish 1"] and second["calls"] == []
    for name in SHAPES:
        assert torch.equal(first["v1"][name], _value(name)), name
    failed = {"shm": "did not write its weights of v2", "pull": "did not write its part of v2"}[backend]
    assert failed in first["error"] and "planned" in second["error"]
    assert first["calls2"] == ["start 2"]
    if backend == "shm":
        assert first["stamp"] == WRITING
    else:
        assert sorted(p.name for p in where.iterdir()) == ["v1"]
    assert first["freed"] and second["freed"]


def _unmappable_worker(rank: int, shm_dir: str, out: str) -> None:
    from relayrl.weightsync import shm

    if rank == 1:  # this stage's writer cannot map rank 0's file

        class Unmappable(shm.ShmRegion):
            def __init__(self, path: str, nbytes: int) -> None:
                raise OSError(f"cannot map {path}")

        shm.ShmRegion = Unmappable  # type: ignore[misc]
    group = dist.group.WORLD
    assert group is not None
    client = _Client()
    info = ShmTrainerInitInfo(rank=rank, shm_dir=shm_dir, bucket_bytes=64)
    try:
        ShmTrainerEngine.trainer_init(info, client=client, source=StageSource(_Stages(rank), OWNER, group))
        error = ""
    except (OSError, RuntimeError) as exc:
        error = str(exc)
    torch.save({"error": error, "told": client.layout is not None}, f"{out}.{rank}")


def test_a_stage_that_cannot_map_the_buffer_fails_the_connect_on_every_writer(tmp_path):
    """Rank 1 cannot map the file: it raises its own error, rank 0 raises that a stage could not map it (no
    rank waits for ever), and the engines are never told of the file."""
    out = str(tmp_path / "result")
    spawn_ranks(_unmappable_worker, 2, tmp_path / "store", str(tmp_path), out)
    first, second = (torch.load(f"{out}.{r}") for r in range(2))
    assert "could not map the shm weight buffer" in first["error"] and "cannot map" in second["error"]
    assert not first["told"] and not second["told"]


class _TpStages(torch.nn.Module):
    """Pipeline rank ``pp``'s parameters split by rows over ``tp_mesh`` (DTensors); the other stage's are meta."""

    def __init__(self, pp: int, tp_mesh) -> None:
        from torch.distributed.tensor import Shard, distribute_tensor

        super().__init__()
        for name, shape in TP_SHAPES.items():
            mine = OWNER[name] == pp
            stand_in = torch.empty(shape, device="meta")
            value = distribute_tensor(_tp_value(name), tp_mesh, [Shard(0)]) if mine else stand_in
            self.register_parameter(name, torch.nn.Parameter(value, requires_grad=mine))


TP_SHAPES = {"a": (4, 2), "b": (6,), "c": (2, 3), "d": (8,)}  # first dims even: each tp rank keeps rows


def _tp_value(name: str) -> torch.Tensor:
    shape = TP_SHAPES[name]
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(shape) + 10 * ord(name)


def _tp_worker(rank: int, shm_dir: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from vllm.distributed.weight_transfer.base import WeightSource

    from relayrl.trainer.optim import local_tensor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))  # rank = pp * 2 + tp
    model, pipeline = _TpStages(mesh["pp"].get_local_rank(), mesh["tp"]), mesh["pp"].get_group()
    stages = StageSource(model, OWNER, pipeline)

    class OneSender(WeightSource):  # the same policy, not a StageSource: rank 0 writes every tensor
        def metadata(self) -> list:
            return stages.metadata()

        def __iter__(self):
            return iter(stages)

    result: dict = {"writes": stages.writes}
    for version, source in ((1, stages), (2, OneSender())):
        client = _Client()
        info = ShmTrainerInitInfo(rank=rank, shm_dir=shm_dir, bucket_bytes=64)
        engine = ShmTrainerEngine.trainer_init(info, client=client, source=source)
        with torch.no_grad():  # this version's values, in each rank's rows
            for name, p in model.named_parameters():
                if not p.is_meta:
                    local_tensor(p).copy_(_tp_value(name).mul(version).chunk(2)[mesh["tp"].get_local_rank()])
        client.version = version
        engine.send_weights()
        if rank == 0:
            assert client.receiver is not None and client.layout is not None
            data = client.receiver.receive(client.layout, FlatUpdateInfo(version, client.layout.digest))
            result[version] = {name: view.clone() for name, view in client.layout.views(data)}
    torch.save(result, f"{out}.{rank}")


def test_stages_split_over_tp_write_whole_tensors_as_the_one_sender_path_does(tmp_path):
    """pp 2 x tp 2, each stage's parameters split by rows over its tp ranks: under ``send_stages`` the first rank of
    each stage writes (ranks 0 and 2), its tp peers (1 and 3) take part in the gathers, and the buffer holds every
    whole tensor; the one-sender path (each tensor sent to rank 0) writes the same whole tensors at v2."""
    out = str(tmp_path / "result")
    spawn_ranks(_tp_worker, 4, tmp_path / "store", str(tmp_path), out)
    ranks = [torch.load(f"{out}.{r}") for r in range(4)]
    assert [r["writes"] for r in ranks] == [True, False, True, False]
    for version in (1, 2):
        for name in TP_SHAPES:
            assert torch.equal(ranks[0][version][name], _tp_value(name) * version), (version, name)
