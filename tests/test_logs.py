"""relayrl.logs: actor output goes to files under the run dir; the console keeps what needs a user."""

from __future__ import annotations

import functools
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from relayrl import logs
from relayrl.cli import main


def batch(actor: str, pid: int | str, *lines: str, is_err: bool = False) -> dict:
    """One batch of a worker's lines as Ray's log stream delivers it (``pid`` is a name for Ray's own)."""
    return {
        "actor_name": actor,
        "pid": pid,
        "lines": list(lines),
        "is_err": is_err,
        "task_name": "",
        "ip": "127.0.0.1",
        "localhost": "127.0.0.1",
        "job": "",
    }


def test_router_files_each_actor_process_and_shows_only_what_needs_a_user(tmp_path, capsys):
    router = logs.WorkerLogRouter(tmp_path)
    warning = "(EngineCore pid=12) WARNING 11-23 [vllm.py:1] Triton is not installed"
    error = "(EngineCore pid=12) ERROR 11-23 [core.py:9] EngineCore failed"
    router(batch("RolloutActor", 11, warning))
    router(batch("TrainerActor", 21, "Loading weights: 100%", is_err=True))
    router(batch("RewardWorker", 31, "relayrl sandbox: no namespace isolation"))
    router(batch("", 41, error, is_err=True))
    router.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ray.log", "rewards.log", "rollout-11.log", "trainer-21.log"]
    assert (tmp_path / "trainer-21.log").read_text() == "Loading weights: 100%\n"
    assert (tmp_path / "rollout-11.log").read_text() == warning + "\n"
    tagged = "(RewardWorker pid=31) relayrl sandbox: no namespace isolation"  # a shared file
    assert (tmp_path / "rewards.log").read_text() == tagged + "\n"
    out, err = capsys.readouterr()
    assert out == "(rewards) relayrl sandbox: no namespace isolation\n"  # relayrl's own line
    assert err == f"(ray) {error}\n"  # an error
    assert router.tail(21) == (tmp_path / "trainer-21.log", ["Loading weights: 100%"])
    assert router.tail(31) == (tmp_path / "rewards.log", [tagged])
    assert router.tail(99) is None


def test_error_pids_follow_the_cause_chain():
    class TaskError(Exception):
        pid = 7

    exc = TaskError("rollout replica 0 died again")
    exc.__cause__ = RuntimeError("The actor died unexpectedly.\n\tclass_name: X\n\tpid: 4242\n")  # raise ... from
    assert list(logs.error_pids(exc)) == [7, 4242]


@pytest.fixture
def ray_printer(ray_session):
    """Ray's console printer as ``ray.init(log_to_driver=True)`` installs it (the session Ray has none);
    afterwards the router and printer are gone again."""
    from ray._private import worker as ray_worker
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    printer = functools.partial(ray_worker.print_to_stdstream, ignore_prefix=False)
    dispatcher.add_handler(logs.RAY_PRINTER, printer)
    yield dispatcher
    logs.release()
    dispatcher.remove_handler(logs.RAY_PRINTER)


class RolloutActor:
    """Named like relayrl's rollout actor so the router files it as one."""

    def speak(self, text: str) -> int:
        print(text, flush=True)
        return os.getpid()

    def die(self, text: str) -> None:
        print(text, flush=True)
        os._exit(1)


def wait_for_text(path: Path, text: str, timeout_s: float = 60.0) -> str:
    """The file's text once it holds ``text`` (Ray's log monitor streams lines a moment after they
    are written)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.2)
    return path.read_text() if path.exists() else ""


def test_actor_prints_go_to_its_file_not_the_console_and_a_crash_shows_its_last_lines(ray_printer, tmp_path, capsys):
    import ray

    logs.capture(tmp_path, verbose=False)
    assert logs.RAY_PRINTER not in [name for name, _ in ray_printer.handlers]  # its printer is off
    # Any: Ray types the handle's methods as the class's plain functions, without ``.remote``.
    actor: Any = ray.remote(RolloutActor).options(num_cpus=0).remote()
    hello = f"hello from the actor {uuid.uuid4().hex}"
    pid = ray.get(actor.speak.remote(hello))
    assert hello in wait_for_text(tmp_path / f"rollout-{pid}.log", hello)
    last = f"last words {uuid.uuid4().hex}"
    with pytest.raises(ray.exceptions.RayActorError) as died:
        ray.get(actor.die.remote(last))
    wait_for_text(tmp_path / f"rollout-{pid}.log", last)  # no race with the stream: test the tail
    tail = logs.crash_tail(died.value)
    assert tail[0] == f"relayrl: last 2 lines of pid {pid} ({tmp_path / f'rollout-{pid}.log'}):"
    assert tail[1:] == [f"  {hello}", f"  {last}"]
    out, err = capsys.readouterr()
    assert hello not in out + err and last not in out + err


def test_verbose_keeps_rays_printer_on_the_console(ray_printer, tmp_path):
    logs.capture(tmp_path, verbose=False)
    logs.capture(tmp_path, verbose=True)  # a verbose run after a quiet one, same process
    assert logs.RAY_PRINTER in [name for name, _ in ray_printer.handlers]
    assert logs.installed().verbose


def test_cli_verbose_sets_logging_verbose(capsys):
    assert main(["train", "--config-name", "grpo_tiny", "--print-config"]) == 0
    assert "verbose: false" in capsys.readouterr().out
    assert main(["train", "--config-name", "grpo_tiny", "--verbose", "--print-config"]) == 0
    assert "verbose: true" in capsys.readouterr().out


def test_rays_own_messages_stay_on_the_console(tmp_path, capsys):
    """The raylet's lines (an out-of-memory kill, say) need a user: shown as Ray shows them, filed."""
    router = logs.WorkerLogRouter(tmp_path)
    kill = f"A worker died or was killed by an unexpected system error {uuid.uuid4().hex}"
    router(batch("", "raylet", kill, is_err=True))
    router.close()
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().err)  # Ray's colours off
    assert f"(raylet) {kill}" in shown
    assert (tmp_path / "ray.log").read_text() == f"(worker pid=raylet) {kill}\n"


def test_a_failed_run_shows_the_dead_process_last_lines_and_files_them(tmp_path, capsys, console):
    from relayrl.config import Config
    from relayrl.controller.run import RunDir

    router = logs.capture(tmp_path / "logs")
    try:
        router(batch("TrainerActor", 4242, "loss is nan at step 3", "Fatal Python error: Aborted"))
        died = RuntimeError("The actor died unexpectedly.\n\tpid: 4242\n")
        RunDir(Config(), tmp_path, None).fail(died)
    finally:
        logs.release()
    heading = f"relayrl: last 2 lines of pid 4242 ({tmp_path / 'logs' / 'trainer-4242.log'}):"
    shown = [heading, "  loss is nan at step 3", "  Fatal Python error: Aborted"]
    assert capsys.readouterr().err.splitlines() == shown
    assert (tmp_path / "logs" / "error.log").read_text().splitlines()[-3:] == shown


def test_console_handler_prints_relayrl_lines_as_the_library_printed_them(capsys):
    """INFO bare on stdout (``relayrl eval``: stderr), WARNING and above bare on stderr; installed once."""
    import logging

    log = logging.getLogger("relayrl.test_logs")
    handler = logs.ConsoleHandler()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # the relayrl logger may hold a console handler from an earlier test
    try:
        log.info("relayrl: an info line")
        log.warning("relayrl: a warning line")
        assert capsys.readouterr() == ("relayrl: an info line\n", "relayrl: a warning line\n")
        handler.info_stream = "stderr"
        log.info("relayrl: eval: starting the engine")
        assert capsys.readouterr() == ("", "relayrl: eval: starting the engine\n")
    finally:
        log.removeHandler(handler)
        log.setLevel(logging.NOTSET)
        log.propagate = True


def test_show_on_console_installs_one_handler(console):
    import logging

    assert logs.show_on_console("stderr") is console
    assert [h for h in logging.getLogger("relayrl").handlers if isinstance(h, logs.ConsoleHandler)] == [console]
