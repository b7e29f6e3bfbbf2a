"""build_once: one build under concurrent callers, stale temp dirs cleaned, foreign dirs left alone."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest

from relayrl.models._cache import build_once, models_dir


def _slow_write(tmp: Path, log: Path) -> None:
    """A fake build: counts its calls in ``log`` and takes long enough for callers to overlap."""
    with open(log, "a") as f:
        f.write("built\n")
    time.sleep(0.5)
    (tmp / "config.json").write_text("{}")
    (tmp / "model.safetensors").write_bytes(b"")


def _build_in_child(out: str, log: str) -> str:
    return str(build_once(Path(out), lambda tmp: _slow_write(tmp, Path(log))))


def test_concurrent_callers_build_once(tmp_path):
    out, log = tmp_path / "m", tmp_path / "calls.log"
    with mp.get_context("spawn").Pool(2) as pool:
        results = pool.starmap(_build_in_child, [(str(out), str(log))] * 2)
    assert results == [str(out), str(out)]
    assert log.read_text().count("built") == 1
    assert not out.with_name("m.tmp").exists()


def test_second_call_does_not_rebuild(tmp_path):
    log = tmp_path / "calls.log"
    for _ in range(2):
        build_once(tmp_path / "m", lambda tmp: _slow_write(tmp, log))
    assert log.read_text().count("built") == 1


def test_stale_tmp_from_crashed_build_is_replaced(tmp_path):
    stale = tmp_path / "m.tmp"
    stale.mkdir()
    (stale / "junk").write_text("half-written")
    out = build_once(tmp_path / "m", lambda tmp: _slow_write(tmp, tmp_path / "log"))
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert not stale.exists()


def test_failed_build_leaves_nothing_and_next_call_builds(tmp_path):
    def broken(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_once(tmp_path / "m", broken)
    assert not (tmp_path / "m").exists()
    assert (build_once(tmp_path / "m", lambda tmp: _slow_write(tmp, tmp_path / "log")) / "config.json").is_file()


def test_build_that_writes_no_weights_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match=r"model\.safetensors"):
        build_once(tmp_path / "m", lambda tmp: (tmp / "config.json").write_text("{}"))
    assert not (tmp_path / "m").exists()


def test_incomplete_existing_dir_is_not_deleted(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="delete it or choose another directory"):
        build_once(tmp_path / "m", lambda tmp: _slow_write(tmp, tmp_path / "log"))
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"


def test_models_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAYRL_CACHE", str(tmp_path / "env"))
    assert models_dir() == tmp_path / "env" / "models"
    assert models_dir(tmp_path / "arg") == tmp_path / "arg" / "models"
    monkeypatch.delenv("RELAYRL_CACHE")
    assert models_dir() == Path.home() / ".cache" / "relayrl" / "models"
