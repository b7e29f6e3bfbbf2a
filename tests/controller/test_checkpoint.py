"""Run checkpoints on disk (``controller/checkpoint.py``, ``controller/run.py``), with a fake trainer:
a crash or a failed write at any point of a save leaves nothing that looks complete and the previous
checkpoint loadable, an async write is committed only once it is on disk (with the driver state of its
step), resume skips a checkpoint that fails verification, torn jsonl lines and a mismatched prompt log
on resume, run dirs that cannot collide, and ``resume=auto`` that leaves a live run alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TypeVar

import pytest

from relayrl.config import ConfigError, load_config
from relayrl.controller import checkpoint
from relayrl.controller.checkpoint import MARKER, Checkpointer, find_resume, latest
from relayrl.controller.driver import resolve_resume, restart_point
from relayrl.controller.run import RunDir, new_run_dir
from relayrl.logs import show_on_console
from relayrl.monitor.runs import read_jsonl
from relayrl.trainer import manifest
from relayrl.trainer.manifest import MANIFEST, UntrustedCheckpoint

T = TypeVar("T")


class FakeTrainer:
    """``TrainerGroup``'s checkpoint calls: writes a shard file; the write 'lands' when ``written``."""

    def __init__(self, fail_after_first_file: bool = False):
        self.fail, self.written, self.saves = fail_after_first_file, True, 0

    def save_checkpoint(self, path: str, asynchronous: bool) -> float:
        self.saves += 1
        (Path(path) / "dcp").mkdir()
        (Path(path) / "dcp" / "shard0.distcp").write_bytes(b"x" * 64)
        if self.fail:
            raise RuntimeError("killed mid-write")
        (Path(path) / "rng-rank0.pt").write_bytes(b"rng")
        return 0.0

    def checkpoint_written(self, wait: bool) -> bool:
        if wait:
            self.written = True
        return self.written


@pytest.fixture
def console(capsys):
    """What the user sees: relayrl's console handler on, its lines read from ``capsys`` (the warnings these
    tests expect go to stderr). Not ``caplog``: a run earlier in the session may have put Ray's quiet-mode
    filter, which drops records below ERROR, on the handler ``caplog`` reads."""
    show_on_console()
    return capsys


def found(value: T | None) -> T:
    """``value``, which the test expects to be there (``latest``, ``find_resume``)."""
    assert value is not None
    return value


def _state(trained: int) -> dict:
    return {"counts": {"issued": trained, "trained": trained, "dropped": 0}, "sampler": {}, "pending": []}


def test_a_crash_inside_the_trainer_write_leaves_no_checkpoint_and_is_cleaned_up(tmp_path, console):
    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save(2, FakeTrainer(), _state(8))
    ckpt.save(4, FakeTrainer(fail_after_first_file=True), _state(16))  # reported, not raised
    assert "step 4 was not written (RuntimeError: killed mid-write)" in console.readouterr().err
    assert (tmp_path / "checkpoints" / ".step_000004.tmp" / "dcp").is_dir()  # the torn write is there
    assert latest(tmp_path) == checkpoint.step_dir(tmp_path, 2)  # ... and ignored
    assert found(find_resume(str(tmp_path), "x", str(tmp_path)))[1].name == "step_000002"
    ckpt = Checkpointer(tmp_path, keep=2)  # the resumed run saves
    ckpt.save(4, FakeTrainer(), _state(16))
    ckpt.finish()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000002", "step_000004"]
    assert checkpoint.driver_state(found(latest(tmp_path)))["step"] == 4


def test_a_crash_before_the_marker_is_durable_leaves_no_checkpoint(tmp_path, monkeypatch, console):
    real = checkpoint.write_durable

    def crash_on_marker(path: Path, text: str) -> None:
        if path.name == MARKER:
            raise OSError("power cut")
        real(path, text)

    monkeypatch.setattr(checkpoint, "write_durable", crash_on_marker)
    Checkpointer(tmp_path, keep=2, asynchronous=False).save(2, FakeTrainer(), _state(8))
    assert "step 2 was not written (OSError: power cut)" in console.readouterr().err
    assert (tmp_path / "checkpoints" / ".step_000002.tmp" / "driver.json").exists()
    assert not (tmp_path / "checkpoints" / ".step_000002.tmp" / MANIFEST).exists()
    assert latest(tmp_path) is None
    assert not (tmp_path / "checkpoints" / "step_000002").exists()


def test_async_write_commits_only_when_on_disk_with_the_state_of_its_step(tmp_path):
    trainer, ckpt = FakeTrainer(), Checkpointer(tmp_path, keep=1)
    state = _state(8)
    trainer.written = False
    ckpt.save(2, trainer, state)
    state["counts"]["trained"] = 99  # the loop goes on: later counts must not leak in
    ckpt.poll()
    assert latest(tmp_path) is None  # the shards are not on disk yet: no COMPLETE
    trainer.written = True
    ckpt.poll()
    assert checkpoint.driver_state(found(latest(tmp_path)))["counts"]["trained"] == 8
    trainer.written = False
    ckpt.save(4, trainer, _state(16))
    ckpt.finish()  # end of run: waits for the write, then commits
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000004"]  # keep=1
    assert ckpt.take_stall() >= 0.0 and ckpt.take_stall() == 0.0


def test_next_save_waits_for_the_previous_write(tmp_path):
    trainer, ckpt = FakeTrainer(), Checkpointer(tmp_path, keep=2)
    trainer.written = False
    ckpt.save(2, trainer, _state(8))
    trainer.written = False
    ckpt.save(4, trainer, _state(16))  # commits step 2 first (its write is waited for)
    assert latest(tmp_path).name == "step_000002"


def test_final_is_published_only_when_complete(tmp_path):
    final = tmp_path / "checkpoints" / "final"

    def half_then_crash(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("killed while saving the HF model")

    with pytest.raises(RuntimeError):
        checkpoint.durable_dir(final, half_then_crash)
    assert not final.exists()
    checkpoint.durable_dir(final, lambda tmp: (tmp / "model.safetensors").write_bytes(b"w"))
    assert sorted(p.name for p in final.parent.iterdir()) == ["final"]  # the torn .final.tmp is gone
    assert (final / "model.safetensors").read_bytes() == b"w"


# ---- torn lines and the prompt log on resume ---------------------------------------------------------
def _config(tmp_path: Path):
    return load_config("grpo_tiny", [f"run.output_dir={tmp_path}", "logging.wandb=disabled", "logging.console=false"])


def _lines(step_ids: list[list[int]]) -> str:
    return "".join(json.dumps({"step": i + 1, "prompt_ids": ids}) + "\n" for i, ids in enumerate(step_ids))


def test_read_jsonl_drops_a_torn_last_line_and_refuses_a_damaged_middle(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
    assert [r["step"] for _, r in read_jsonl(path)] == [1, 2]
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(path)


def test_reopen_truncates_torn_last_lines_then_appends_cleanly(tmp_path):
    cfg = _config(tmp_path)
    run = RunDir.create(cfg)
    run.logger.close()
    (run.path / "prompts.jsonl").write_text(_lines([[0, 1], [2, 3], [4, 5]]) + '{"step": 4, "prompt_i')
    (run.path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward/mean": 0.5}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "rew'
    )
    reopened = RunDir.reopen(cfg, run.path, {"step": 2, **_state(4)})
    reopened.logger.close()
    assert (run.path / "prompts.jsonl").read_text() == _lines([[0, 1], [2, 3]])
    assert [r["step"] for _, r in read_jsonl(run.path / "metrics.jsonl")] == [1, 2]
    assert reopened.rewards == [0.5, 0.5]
    with open(run.path / "prompts.jsonl", "a") as f:  # the scheduler's next append
        f.write(json.dumps({"step": 3, "prompt_ids": [6, 7]}) + "\n")
    assert [r["step"] for _, r in read_jsonl(run.path / "prompts.jsonl")] == [1, 2, 3]


@pytest.mark.parametrize(
    "log, trained",
    [
        ([[0, 1]], 4),  # a step missing
        ([[0, 1], [2]], 4),  # ids lost from a step
        ([[0, 1], [2, 3]], 6),
    ],
)  # counts disagree
def test_resume_refuses_a_prompt_log_that_disagrees_with_the_checkpoint(tmp_path, log, trained):
    cfg = _config(tmp_path)
    run = RunDir.create(cfg)
    run.logger.close()
    (run.path / "prompts.jsonl").write_text(_lines(log))
    with pytest.raises(ConfigError, match=r"prompts\.jsonl.*step 2.*run\.resume=") as err:
        RunDir.reopen(cfg, run.path, {"step": 2, **_state(trained)})
    assert "\n" not in str(err.value)
    assert (run.path / "prompts.jsonl").read_text() == _lines(log)  # refused: nothing was cut


# ---- run directories ---------------------------------------------------------------------------------
def test_two_runs_started_in_the_same_second_get_their_own_dirs(tmp_path, monkeypatch):
    first = new_run_dir(tmp_path, "grpo", stamp="20260101-120000")
    second = new_run_dir(tmp_path, "grpo", stamp="20260101-120000")
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name == "grpo-20260101-120000-2"
    monkeypatch.setattr("relayrl.controller.run.time.strftime", lambda fmt: "20260101-120001")
    cfg = _config(tmp_path)
    a, b = RunDir.create(cfg), RunDir.create(cfg)
    a.logger.close(), b.logger.close()
    assert a.path != b.path and (a.path / "config.yaml").exists() and (b.path / "config.yaml").exists()


def _run_with_checkpoint(root: Path, name: str, pid: int, status: str = "running") -> Path:
    run = root / name
    Checkpointer(run, keep=1, asynchronous=False).save(2, FakeTrainer(), _state(8))
    (run / "status.json").write_text(
        json.dumps({"status": status, "pid": pid, "host": __import__("socket").gethostname()})
    )
    return run


def test_resume_auto_skips_a_run_whose_driver_is_alive(tmp_path):
    older = _run_with_checkpoint(tmp_path, "grpo-20260101-120000", pid=2**22 + 12345, status="running")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        newer = _run_with_checkpoint(tmp_path, "grpo-20260101-120001", pid=live.pid)
        assert found(find_resume(str(tmp_path), "grpo", "auto"))[0] == older  # the live one is left alone
    finally:
        live.kill()
        live.wait()
    assert found(find_resume(str(tmp_path), "grpo", "auto"))[0] == newer  # its driver is gone: resumable


def test_a_failed_background_write_costs_the_checkpoint_not_the_run(tmp_path, console):
    class Failing(FakeTrainer):
        def checkpoint_written(self, wait: bool) -> bool:
            raise OSError("No space left on device")

    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save(2, FakeTrainer(), _state(8))
    ckpt.save(4, Failing(), _state(16))
    ckpt.poll()
    assert "step 4 was not written (OSError: No space left" in console.readouterr().err
    assert latest(tmp_path).name == "step_000002" and ckpt.pending is None
    ckpt.save(6, FakeTrainer(), _state(24))  # goes on; the failed write's dir is deleted
    ckpt.finish()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002", "step_000006"]


# ---- failed writes in save() and finish() --------------------------------------------------------------
class FullDisk(FakeTrainer):
    """Its shard write runs out of space half-way."""

    def save_checkpoint(self, path: str, asynchronous: bool) -> float:
        (Path(path) / "dcp").mkdir()
        (Path(path) / "dcp" / "shard0.distcp").write_bytes(b"x" * 16)
        raise OSError(28, "No space left on device")


def _fail_at(monkeypatch, name: str) -> None:
    """Make the commit's write of ``name`` (driver.json or the manifest) run out of space half-way."""
    real = checkpoint.write_durable

    def write_durable(path: Path, text: str) -> None:
        if path.name == name:
            path.write_text(text[:3])
            raise OSError(28, "No space left on device")
        real(path, text)

    def write_manifest(root: Path) -> None:
        write_durable(root / MANIFEST, '{"files": {}}')

    monkeypatch.setattr(checkpoint, "write_durable", write_durable)
    monkeypatch.setattr(checkpoint.manifest, "write", write_manifest)


@pytest.mark.parametrize("where", ["shards", "driver.json", MANIFEST])
def test_a_failed_write_in_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, console, where):
    ckpt = Checkpointer(tmp_path, keep=1, asynchronous=False)
    ckpt.save(2, FakeTrainer(), _state(8))
    console.readouterr()
    if where != "shards":
        _fail_at(monkeypatch, where)
    ckpt.save(4, FullDisk() if where == "shards" else FakeTrainer(), _state(16))  # does not raise
    lines = console.readouterr().err.splitlines()
    assert lines == [
        (
            "relayrl: checkpoint step 4 was not written (OSError: [Errno 28] No space left on "
            "device); the earlier checkpoints stay as they were"
        )
    ]
    assert latest(tmp_path).name == "step_000002" and ckpt.pending is None
    manifest.verify(found(latest(tmp_path)))  # still loadable, untouched
    torn = tmp_path / "checkpoints" / ".step_000004.tmp"
    assert torn.is_dir() and not checkpoint.step_dir(tmp_path, 4).exists()
    if where != MANIFEST:
        assert not (torn / MANIFEST).exists()  # a torn write gets no manifest
    monkeypatch.undo()
    ckpt.save(6, FakeTrainer(), _state(24))  # the run goes on
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000006"]


def test_a_failed_write_found_by_finish_is_one_line(tmp_path, console):
    class Failing(FakeTrainer):
        def checkpoint_written(self, wait: bool) -> bool:
            if wait:
                raise PermissionError(13, "Permission denied")
            return False

    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save(2, FakeTrainer(), _state(8))
    ckpt.save(4, Failing(), _state(16))  # commits step 2; step 4's write is in flight
    ckpt.finish()  # does not raise
    assert console.readouterr().err.splitlines() == [
        (
            "relayrl: checkpoint step 4 was not written (PermissionError: [Errno 13] Permission denied); "
            "the earlier checkpoints stay as they were"
        )
    ]
    assert latest(tmp_path).name == "step_000002"
    manifest.verify(found(latest(tmp_path)))


# ---- verification on resume --------------------------------------------------------------------------
def _two_checkpoints(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A finished run ``grpo-1`` with checkpoints at steps 2 and 4 (driver state and prompt log agree)."""
    run = tmp_path / "grpo-1"
    ckpt = Checkpointer(run, keep=2, asynchronous=False)
    ckpt.save(2, FakeTrainer(), _state(4))
    ckpt.save(4, FakeTrainer(), _state(8))
    (run / "prompts.jsonl").write_text(_lines([[0, 1], [2, 3], [4, 5], [6, 7]]))
    (run / "status.json").write_text(json.dumps({"status": "finished", "pid": 1, "host": "x"}))
    return run, checkpoint.step_dir(run, 2), checkpoint.step_dir(run, 4)


def test_a_committed_checkpoint_lists_every_file_in_its_manifest(tmp_path):
    _, step2, _ = _two_checkpoints(tmp_path)
    listed = json.loads((step2 / MANIFEST).read_text())["files"]
    assert sorted(listed) == [MARKER, "dcp/shard0.distcp", "driver.json", "rng-rank0.pt"]
    assert listed["dcp/shard0.distcp"]["size"] == 64
    manifest.verify(step2)


def test_resume_skips_a_checkpoint_that_fails_verification_and_takes_the_previous_one(tmp_path, console):
    run, step2, step4 = _two_checkpoints(tmp_path)
    (step4 / "dcp" / "shard0.distcp").write_bytes(b"y" * 64)  # same size, other bytes
    console.readouterr()
    assert find_resume(str(tmp_path), "grpo", "auto") == (run, step2)
    assert find_resume(str(tmp_path), "grpo", str(run)) == (run, step2)
    lines = console.readouterr().err.splitlines()
    assert len(lines) == 2 and all(x.startswith("relayrl: skipping step_000004: checkpoint ") for x in lines)
    assert "dcp/shard0.distcp does not match its sha256" in lines[0]
    with pytest.raises(UntrustedCheckpoint, match="step_000004 refused"):  # named explicitly: refused
        find_resume(str(tmp_path), "grpo", str(step4))
    cfg = load_config("grpo_tiny", [f"run.output_dir={tmp_path}", f"run.resume={step4}"])
    with pytest.raises(ConfigError, match=r"step_000004 refused: dcp/shard0\.distcp") as err:
        resolve_resume(cfg)
    assert "\n" not in str(err.value)
    (step2 / "driver.json").unlink()  # now neither verifies
    assert find_resume(str(tmp_path), "grpo", "auto") is None
    with pytest.raises(FileNotFoundError, match="no complete, verified checkpoint"):
        find_resume(str(tmp_path), "grpo", str(run))


def test_a_restart_after_a_trainer_death_skips_a_checkpoint_that_fails_verification(tmp_path, console):
    cfg = _config(tmp_path)
    run = RunDir.create(cfg)
    Checkpointer(run.path, keep=2, asynchronous=False).save(2, FakeTrainer(), _state(4))
    Checkpointer(run.path, keep=2, asynchronous=False).save(4, FakeTrainer(), _state(8))
    (run.path / "prompts.jsonl").write_text(_lines([[0, 1], [2, 3], [4, 5], [6, 7]]))
    (checkpoint.step_dir(run.path, 4) / "driver.json").chmod(0o666)
    resume, reopened = restart_point(cfg, run)
    reopened.logger.close()
    assert resume is not None and resume[1].name == "step_000002" and resume[2]["step"] == 2
    assert "skipping step_000004" in console.readouterr().err
