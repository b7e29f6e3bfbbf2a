"""trainer/background.py: a rank's setup runs nicer, and every thread is back where it was afterwards."""

from __future__ import annotations

import os
import resource
import threading

import pytest

from relayrl.config import ConfigError, TrainerConfig
from relayrl.trainer import background
from relayrl.trainer.background import in_background, may_lower_to


def nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


@pytest.mark.skipif(not may_lower_to(os.getpriority(os.PRIO_PROCESS, 0)), reason="needs root or RLIMIT_NICE")
def test_the_block_runs_nicer_and_every_thread_is_restored():
    base, seen = nice_of(0), {}
    started, release = threading.Event(), threading.Event()

    def worker():  # started inside the block: inherits its niceness
        seen["tid"] = threading.get_native_id()
        seen["inside"] = nice_of(0)
        started.set()
        release.wait(10)

    with in_background(7):
        seen["main"] = nice_of(0)
        t = threading.Thread(target=worker)
        t.start()
        started.wait(10)
    after = nice_of(seen["tid"])  # the worker is still alive, so restore had to reach it
    release.set()
    t.join()
    assert seen["main"] == seen["inside"] == min(19, base + 7)
    assert nice_of(0) == base and after == base


def test_no_increment_or_no_way_back_changes_nothing(monkeypatch):
    base = nice_of(0)
    with in_background(0):
        assert nice_of(0) == base
    monkeypatch.setattr(background, "may_lower_to", lambda nice: False)
    with in_background(5):
        assert nice_of(0) == base


def test_may_lower_to_reads_rlimit_nice_when_not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    limit = {"soft": 0}
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit["soft"], limit["soft"]))
    assert not may_lower_to(0) and not may_lower_to(19)  # limit 0: the floor is nice 20, none reachable
    limit["soft"] = 20  # floor 20 - 20 = nice 0
    assert may_lower_to(0) and not may_lower_to(-1)
    limit["soft"] = resource.RLIM_INFINITY
    assert may_lower_to(-20)


def test_setup_nice_is_a_niceness_increment():
    with pytest.raises(ConfigError, match=r"trainer\.setup_nice=25"):
        TrainerConfig(setup_nice=25)
