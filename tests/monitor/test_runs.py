import json
import subprocess
import sys

from relayrl.cli import main
from relayrl.controller.run import RunDir
from relayrl.monitor.runs import run_info, scan_runs


def make_run(root, name, rewards, steps_total=3):
    path = root / name
    path.mkdir()
    (path / "config.yaml").write_text(f"run:\n  steps: {steps_total}\n")
    (path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, "reward/mean": r}) + "\n" for i, r in enumerate(rewards))
    )
    return RunDir(None, path, None)  # type: ignore[arg-type]  # reading a run back needs no Config


def test_status_and_best_reward_from_files(tmp_path):
    make_run(tmp_path, "a-finished", [0.1, 0.7, 0.4]).write_status("finished", steps_done=3)
    failed = make_run(tmp_path, "b-failed", [0.2])
    try:
        raise RuntimeError("engine died\nsecond line")
    except RuntimeError as exc:
        failed.fail(exc)
    make_run(tmp_path, "c-running", [0.3]).write_status("running")  # this process: alive
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = make_run(tmp_path, "d-killed", [0.5, None])
    killed.write_status("running")
    record = json.loads((killed.path / "status.json").read_text())
    (killed.path / "status.json").write_text(json.dumps({**record, "pid": int(dead.stdout)}))
    make_run(tmp_path, "e-old-complete", [0.0, 0.25, 0.5])  # no status.json
    make_run(tmp_path, "f-old-partial", [0.0])
    (tmp_path / "not-a-run").mkdir()

    infos = {i.path.name: i for i in scan_runs(tmp_path)}
    assert sorted(infos) == ["a-finished", "b-failed", "c-running", "d-killed", "e-old-complete", "f-old-partial"]
    assert {n: i.status for n, i in infos.items()} == {
        "a-finished": "finished",
        "b-failed": "failed",
        "c-running": "running",
        "d-killed": "failed",
        "e-old-complete": "finished",
        "f-old-partial": "unknown",
    }
    a = infos["a-finished"]
    assert (a.best_reward, a.best_step, a.last_reward, a.steps_done, a.steps_total) == (0.7, 2, 0.4, 3, 3)
    assert infos["b-failed"].error == "RuntimeError: engine died"
    assert "engine died" in (tmp_path / "b-failed" / "logs" / "error.log").read_text()
    assert "exited without finishing" in infos["d-killed"].error
    assert infos["d-killed"].best_reward == 0.5  # null rewards are skipped


def test_half_written_last_line_is_skipped(tmp_path):
    run = make_run(tmp_path, "r", [0.5])
    with (run.path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "reward/me')
    assert run_info(run.path).steps_done == 1


def test_cli_runs_lists_them(tmp_path, capsys):
    make_run(tmp_path, "grpo-1", [0.1, 0.9, 0.4]).write_status("finished")
    assert main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "grpo-1" in out and "finished" in out and "0.900 (step 2)" in out
    assert main(["runs", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_error_line_shows_a_ray_task_errors_cause_without_colour_codes():
    from relayrl.controller.run import error_line

    class TaskError(Exception):  # the shape of ray.exceptions.RayTaskError: a `cause` attribute
        def __init__(self, cause):
            super().__init__("\x1b[36mray::ReplayBuffer.ready()\x1b[39m (pid=1)\n  Traceback ...")
            self.cause = cause

    assert (
        error_line(TaskError(TypeError("ready() takes 3 positional arguments\nmore")))
        == "TypeError: ready() takes 3 positional arguments"
    )
    assert error_line(ValueError("\x1b[31mbad\x1b[0m value")) == "ValueError: bad value"


def test_step_0_eval_line_is_not_a_step(tmp_path):
    """eval.before_first_step writes the initial model's eval/* as step 0: 3 training steps stay 3/3."""
    run = make_run(tmp_path, "with-eval", [0.1, 0.7, 0.4])
    lines = (run.path / "metrics.jsonl").read_text()
    (run.path / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/greedy_accuracy": 0.5}) + "\n" + lines)
    info = run_info(run.path)
    assert (info.steps_done, info.steps_total, info.status, info.best_reward) == (3, 3, "finished", 0.7)


def test_interrupted_run_says_what_it_keeps_and_resume_auto_takes_it(tmp_path, capsys, console):
    from relayrl.controller.checkpoint import MARKER, find_resume, step_dir
    from relayrl.trainer import manifest

    run = make_run(tmp_path, "grpo-7", [0.1, 0.2, 0.3], steps_total=9)
    run.rewards = [0.1, 0.2, 0.3]
    run.interrupt()
    err = capsys.readouterr().err
    assert "interrupted after 3 step(s)" in err and "no checkpoint yet" in err
    record = json.loads((run.path / "status.json").read_text())
    assert (record["status"], record["steps_done"]) == ("interrupted", 3)
    assert run_info(run.path).status == "interrupted"
    assert not (run.path / "logs" / "error.log").exists()  # nothing failed: no traceback

    ckpt = step_dir(run.path, 2)
    ckpt.mkdir(parents=True)
    (ckpt / MARKER).write_text("")
    (ckpt / "driver.json").write_text(json.dumps({"step": 2}))
    manifest.write(ckpt)
    run.interrupt()
    assert "run.resume=auto continues from step_000002" in capsys.readouterr().err
    assert find_resume(str(tmp_path), "grpo", "auto") == (run.path, ckpt)  # an interrupted run is not live
