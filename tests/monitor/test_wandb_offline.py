"""A real offline wandb run: files must land under the run dir, holding the logged values."""

import json
import re

from relayrl.config import LoggingConfig
from relayrl.monitor.metrics import WandbSink, make_logger


def logged_values(log: bytes, key: bytes) -> list[bytes]:
    """Every JSON value recorded under ``key`` in a wandb record log: after the key, the value field's tag
    (``0x82 0x01``) and its one-byte length, exactly that many bytes. (Reading digits up to the first non-digit
    also took a byte after the value that happened to be a digit: CI once read ``0.257`` for ``0.25``.)"""
    return [
        log[m.end() : m.end() + m.group(1)[0]] for m in re.finditer(re.escape(key) + rb"\x82\x01([\x01-\x7f])", log)
    ]


def test_offline_run_files_land_in_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)  # anything written to the cwd would show up here too
    run_dir = tmp_path / "runs" / "demo-1"
    logger = make_logger(LoggingConfig(wandb="offline", console=False), run_dir, {"trainer": {"lr": 0.125}}, 3)
    wandb_sink = next(s for s in logger.sinks if isinstance(s, WandbSink))
    for step in (1, 2, 3):
        logger.log(step, {"reward/mean": step / 4})
    logger.log_samples(3, [{"prompt": "p", "completion": "Answer: 1", "reward": 1.0}])
    logger.close()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing written outside the run dir
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith(wandb_sink.run.id)
    # wandb 0.31 keeps history and config only in the binary record log that `wandb sync` uploads;
    # history items are stored as (key, JSON value) strings, so the values can be read back from it.
    log = next(runs[0].glob("run-*.wandb")).read_bytes()
    assert list(dict.fromkeys(logged_values(log, b"reward/mean"))) == [b"0.25", b"0.5", b"0.75"]
    assert b"0.125" in log  # the run config
    table = json.loads(next((runs[0] / "files" / "media" / "table").glob("samples_3_*.table.json")).read_text())
    assert table == {"columns": ["prompt", "completion", "reward"], "data": [["p", "Answer: 1", 1.0]]}


def test_a_resumed_run_dir_continues_one_wandb_run(tmp_path, monkeypatch):
    from relayrl.monitor.runs import scan_runs

    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "runs" / "demo-1"
    ids = []
    for step in (1, 2):  # first start, then a resume of the same run dir
        sink = WandbSink(run_dir, "relayrl", "offline", {"run": {"steps": 2}})
        sink.log(step, {"reward/mean": step / 4})
        ids.append(sink.run.id)
        sink.close()
    assert ids[0] == ids[1] == (run_dir / "wandb" / "run_id").read_text().strip()
    segments = list((run_dir / "wandb").glob("offline-run-*"))
    # one folder per open, each named by the one id (a second open in the same second adds "-1"):
    # `wandb sync` uploads both into that run
    assert len(segments) == 2 and all(f"-{ids[0]}" in p.name for p in segments)
    other = WandbSink(tmp_path / "runs" / "demo-2", "relayrl", "offline")
    assert other.run.id != ids[0]  # a different run dir is a different wandb run
    other.close()
    (run_dir / "config.yaml").write_text("run:\n  steps: 2\n")
    assert [i.path.name for i in scan_runs(tmp_path / "runs")] == ["demo-1"]  # demo-2 has no config.yaml
