"""TCP stores that listen only on the interface the run chose.

``torch.distributed.TCPStore(is_master=True)`` listens on every interface (``::``), so any host that
can reach the machine could join a trainer group or feed a weight broadcast. The master here binds
its socket to ``host`` itself and hands the listening fd to the store (``master_listen_fd``).
``free_port`` finds a port for rendezvous that cannot pass a bound socket (vLLM's NCCL engine).
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch.distributed as dist


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS says is free on ``host`` now (the rendezvous of torch.distributed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listen_socket(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket bound to ``host:port`` only (port 0: the OS picks one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def master_store(host: str, port: int, world_size: int, timeout: timedelta) -> dist.TCPStore:
    """The store's server, reachable on ``host`` only; its ``port`` attribute is the bound port."""
    sock = listen_socket(host, port)
    bound = sock.getsockname()[1]
    fd = sock.detach()  # the store owns the fd from here (Python must not close it)
    return dist.TCPStore(
        host, bound, world_size, is_master=True, timeout=timeout, wait_for_workers=False, master_listen_fd=fd
    )


def client_store(host: str, port: int, world_size: int, timeout: timedelta) -> dist.TCPStore:
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
