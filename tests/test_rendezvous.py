"""Stores listen on the chosen interface only: a worker on that address joins, nothing listens on ``::``."""

from __future__ import annotations

from datetime import timedelta

import psutil

from relayrl.rendezvous import client_store, master_store


def listening_addresses(port: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.Process().net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def test_master_store_binds_the_given_host_only():
    timeout = timedelta(seconds=10)
    store = master_store("127.0.0.1", 0, 2, timeout)
    assert listening_addresses(store.port) == {"127.0.0.1"}
    worker = client_store("127.0.0.1", store.port, 2, timeout)
    worker.set("from-worker", "ok")
    assert store.get("from-worker") == b"ok"


def test_default_torch_store_would_listen_everywhere():
    """The control: what ``master_store`` exists to avoid (if torch changes this, the module can go)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    assert listening_addresses(store.port) & {"::", "0.0.0.0"}


def test_trainer_rank0_binds_the_port_it_hands_the_other_ranks():
    """Rank 0 binds port 0 and reports the port the OS chose (the driver passes it on to the others' setup),
    rather than the driver probing a free port that something else can take before rank 0 binds it."""
    from relayrl.config import AlgorithmConfig, ModelConfig, TrainerConfig
    from relayrl.trainer.actor import TrainerActor

    rank0 = TrainerActor(
        0,
        2,
        "127.0.0.1",
        0,
        "unused",
        ModelConfig(path="unused"),
        TrainerConfig(),
        AlgorithmConfig(),
        1.0,
        0,
        timeout_s=10,
    )
    port = rank0.listen()
    assert port != 0 and rank0.listen() == port  # one store, bound once
    assert listening_addresses(port) == {"127.0.0.1"}
    other = client_store("127.0.0.1", port, 2, timedelta(seconds=10))
    other.set("from-rank-1", "ok")
    assert rank0._store().get("from-rank-1") == b"ok"  # setup joins the group through that store
