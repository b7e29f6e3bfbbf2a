"""``rollout.queue_poll_us``: vLLM's queue readers sleep between checks in their busy window, nothing else."""

from __future__ import annotations

import time

import pytest
import zmq

from relayrl.rollout import queuepoll


@pytest.fixture
def reader(monkeypatch, tmp_path):
    """A reader-side ``SpinCondition`` (its writer never binds: nothing ever notifies it), with vLLM's own
    ``wait`` restored after the test."""
    import vllm.distributed.device_communicators.shm_broadcast as shm

    monkeypatch.setattr(shm.SpinCondition, "wait", shm.SpinCondition.wait)
    context = zmq.Context()
    cond = shm.SpinCondition(is_reader=True, context=context, notify_address=f"ipc://{tmp_path}/notify")
    yield shm, cond
    context.destroy(linger=0)


def _calls(monkeypatch, module, name):
    calls = []
    monkeypatch.setattr(module, name, lambda *a: calls.append(a))
    return calls


def test_reader_sleeps_in_its_busy_window_instead_of_yielding(reader, monkeypatch):
    shm, cond = reader
    queuepoll.sleep_between_polls(200)
    yields = _calls(monkeypatch, shm, "sched_yield")
    sleeps = _calls(monkeypatch, queuepoll.time, "sleep")
    cond.record_read()  # a message was just read: inside the 1 s window
    cond.wait(timeout_ms=1)
    assert sleeps == [(200e-6,)] and yields == []


def test_vllm_spin_is_what_it_replaces(reader, monkeypatch):
    """Without the patch the same call yields (so the test above would fail without ``sleep_between_polls``)."""
    shm, cond = reader
    yields = _calls(monkeypatch, shm, "sched_yield")
    cond.record_read()
    cond.wait(timeout_ms=1)
    assert len(yields) == 1


def test_after_the_window_the_reader_waits_on_zmq_as_vllm_does(reader, monkeypatch):
    _shm, cond = reader
    queuepoll.sleep_between_polls(200)
    sleeps = _calls(monkeypatch, queuepoll.time, "sleep")
    cond.last_read = time.monotonic() - 2 * cond.busy_loop_s
    polls = []
    monkeypatch.setattr(cond.poller, "poll", lambda timeout=None: polls.append(timeout) or [])
    cond.wait(timeout_ms=7)
    assert polls == [7] and sleeps == []


def test_idempotent_and_zero_restores_the_spin(reader):
    shm, _ = reader
    original = shm.SpinCondition.wait
    queuepoll.sleep_between_polls(200)
    queuepoll.sleep_between_polls(50)
    assert shm.SpinCondition.wait.relayrl_original is original  # wrapped once, not twice
    assert shm.SpinCondition.wait.relayrl_poll_us == 50
    queuepoll.sleep_between_polls(0)
    assert shm.SpinCondition.wait is original


def test_engine_process_reads_the_setting(reader, monkeypatch):
    shm, _ = reader
    original = shm.SpinCondition.wait
    monkeypatch.delenv(queuepoll.POLL_ENV, raising=False)
    queuepoll.sleep_between_polls_if_asked()
    assert shm.SpinCondition.wait is original
    monkeypatch.setenv(queuepoll.POLL_ENV, "300")
    queuepoll.sleep_between_polls_if_asked()
    assert shm.SpinCondition.wait.relayrl_poll_us == 300
