"""Soak: over a long run, does any process's memory or open files, or /dev/shm, grow with the steps?

Launches ``relayrl train`` (``--recipe``, ``--steps``; ``mode=async rollout.stream=true``, then any extra overrides)
and, every ``--every`` seconds while it runs, samples every process of the run: the driver and its descendants
(the engines' fork server and the engine host, core and worker it forks; Ray's GCS, raylet, agents and workers:
rollout actor, trainer ranks, reward scorer and workers; resource trackers) and the processes registered under any
of them (``relayrl.rollout.cleanup.owned``: engine processes that live outside their actor's tree). Per process:
RSS and open file descriptors (psutil); for the box: the entries in /dev/shm and their bytes, and those the run's
processes map or hold open. A sample belongs to the last step in the run's ``metrics.jsonl``.

Over the steps after the first fifth (100-499 of 500; the samples after the last step are the shutdown's), every
series (RSS and fds, in total and per process kind; processes; /dev/shm) is judged by ``trend``:

    blocks    the window is cut into 10 spans of equal steps and the series averaged in each: one step's
              allocations average out, and block means are far less correlated than neighbouring samples
    slope     least squares of the block means on their mean step, per 100 steps, with its standard error from
              their scatter about the line (n - 2 = 8 degrees of freedom)
    verdict   "grows" ("shrinks") when the slope is more than 3 standard errors above (below) 0, else "flat":
              a drift the scatter cannot explain, not a threshold on its size
    change    slope x the window's steps: what the fitted line adds over the window

RSS counts pages shared between processes (the fork server's children share its imports) once per process: a
kind's sum is not the box's memory, but a leak in any process shows in it. After the run exits the bench waits
``--linger`` seconds and reports the run's processes still alive and the /dev/shm entries its processes held that
are still there; entries other programs on the box made meanwhile are counted apart. The raw samples go to
``<work>/processes.csv`` (one row per process per sample) and ``<work>/shm.csv``.

    .venv/bin/python -m bench.soak                          # grpo_tiny, 500 steps, async + streaming
    .venv/bin/python -m bench.soak --steps 200 rollout.num_replicas=2
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.common import RELAYRL, ROOT, load_note
from relayrl.rollout.cleanup import SHM_DIR, held_by, owned, segments_in_use

DEFAULTS = ["mode=async", "rollout.stream=true"]
"""Overrides before the user's: the mode with the most calls per step (every group its own generate call), where
anything kept per call adds up soonest."""
KINDS = (
    ("engine core", ("VLLM::EngineCore",)),
    ("engine worker", ("VLLM::Worker",)),
    ("rollout actor", ("ray::RolloutActor",)),
    ("trainer rank", ("ray::TrainerActor",)),
    ("reward scorer", ("ray::RewardScorer",)),
    ("reward worker", ("ray::RewardWorker",)),
    ("resource tracker", ("multiprocessing.resource_tracker",)),
    ("raylet", ("raylet/raylet",)),
    ("gcs", ("gcs_server",)),
    ("ray agents", ("ray::DashboardAgent", "ray::RuntimeEnvAgent")),
    ("ray idle worker", ("ray::IDLE",)),
    ("ray daemons", ("site-packages/ray/",)),  # the dashboard, log monitor, autoscaler monitor
)
"""A process's kind by a fragment of its command line (the first that matches); the driver, the fork server and
the engine host are told apart by their place in the tree (``kind_of``)."""
SERVER = "multiprocessing.forkserver"
MiB = 2**20


def kind_of(cmdline: str, parent_cmdline: str, is_driver: bool) -> str:
    """The kind of a process. The engine host is forked from the fork server without an exec, so it keeps the
    server's command line; its parent is a server, the server's is not."""
    if is_driver:
        return "driver"
    if SERVER in cmdline:
        return "engine host" if SERVER in parent_cmdline else "fork server"
    return next((kind for kind, marks in KINDS if any(m in cmdline for m in marks)), "other")


# ---------------------------------------------------------------- the verdict (pure; tests/test_bench_soak.py)


@dataclass(frozen=True)
class Trend:
    """One series over the window."""

    start: float  # the first block's mean
    slope: float  # least-squares slope of the block means, per 100 steps
    se: float  # its standard error, per 100 steps
    change: float  # slope x the window's steps
    verdict: str  # "grows", "shrinks", "flat" (within 3 standard errors of 0) or "too few samples"


def block_means(
    steps: Sequence[float], values: Sequence[float], lo: int, hi: int, blocks: int
) -> tuple[list[float], list[float]]:
    """(mean step, mean value) of each of ``blocks`` equal spans of steps [lo, hi) that holds a sample."""
    width = (hi - lo) / blocks
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for step, value in zip(steps, values):
        if lo <= step < hi:
            spans[min(int((step - lo) / width), blocks - 1)].append((step, value))
    xs = [statistics.fmean(s for s, _ in spans[i]) for i in sorted(spans)]
    ys = [statistics.fmean(v for _, v in spans[i]) for i in sorted(spans)]
    return xs, ys


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope b of ys on xs and its standard error sqrt(sum(residual^2) / (n - 2) / Sxx), with
    Sxx = sum((x - mean x)^2)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residuals = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    return slope, math.sqrt(residuals / (len(xs) - 2) / sxx)


def trend(
    steps: Sequence[float], values: Sequence[float], lo: int, hi: int, blocks: int = 10, sigmas: float = 3.0
) -> Trend:
    """The verdict on one series over steps [lo, hi): growth beyond noise when the block means' slope is more
    than ``sigmas`` standard errors from 0."""
    xs, ys = block_means(steps, values, lo, hi, blocks)
    if len(xs) < 3:
        return Trend(math.nan, math.nan, math.nan, math.nan, "too few samples")
    slope, se = fit(xs, ys)
    verdict = "flat" if abs(slope) <= sigmas * se else "grows" if slope > 0 else "shrinks"
    return Trend(ys[0], 100 * slope, 100 * se, slope * (hi - lo), verdict)


# ---------------------------------------------------------------- sampling the run (not unit-tested)


class Steps:
    """The last step in the run's ``metrics.jsonl``, read as it grows."""

    def __init__(self, out: Path) -> None:
        self.out, self.offset, self.partial, self.step = out, 0, "", 0
        self.file: Path | None = None  # found once the run has made its directory

    def read(self) -> int:
        self.file = self.file or next(self.out.glob("*/metrics.jsonl"), None)
        if self.file is None:
            return 0
        with open(self.file, "rb") as f:
            f.seek(self.offset)
            text = f.read().decode()
            self.offset = f.tell()
        *lines, self.partial = (self.partial + text).split("\n")
        for line in filter(str.strip, lines):
            self.step = json.loads(line)["step"]
        return self.step


class Watch:
    """The run's processes, found again at every sample (Ray starts workers as it goes); every one ever seen,
    with its last kind, for the check after the run."""

    def __init__(self, driver: int) -> None:
        self.driver = psutil.Process(driver)
        self.seen: dict[int, tuple[psutil.Process, str]] = {}

    def processes(self) -> list[psutil.Process]:
        try:
            found = {p.pid: p for p in [self.driver, *self.driver.children(recursive=True)]}
        except psutil.NoSuchProcess:
            return []
        for pid in list(found):
            for p in owned(pid):
                found.setdefault(p.pid, p)
        return list(found.values())

    def sample(self) -> tuple[list[tuple[int, str, int, int]], set[int]]:
        """(pid, kind, RSS bytes, open fds) of every live process of the run, and the inodes of the /dev/shm
        files they map or hold open."""
        procs = self.processes()
        cmdlines = {p.pid: _cmdline(p) for p in procs}
        rows, held = [], set()
        for p in procs:
            try:
                with p.oneshot():
                    if p.status() == psutil.STATUS_ZOMBIE:
                        continue
                    parent = cmdlines.get(p.ppid(), "")
                    rss, fds = p.memory_info().rss, p.num_fds()
                held |= held_by(Path(f"/proc/{p.pid}"), f"{SHM_DIR}/")
            except (psutil.Error, OSError):
                continue  # it exited while we looked
            kind = kind_of(cmdlines[p.pid], parent, p.pid == self.driver.pid)
            self.seen[p.pid] = (self.seen.get(p.pid, (p, kind))[0], kind)
            rows.append((p.pid, kind, rss, fds))
        return rows, held


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def shm_files() -> dict[int, tuple[str, int]]:
    """inode -> (name, bytes) of every entry in /dev/shm."""
    out = {}
    for entry in os.scandir(SHM_DIR):
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        out[st.st_ino] = (entry.name, st.st_size)
    return out


def series_of(rows: list[tuple[int, str, int, int]], shm: dict[int, tuple[str, int]], held: set[int]) -> dict:
    """One sample's values: RSS (MiB) and fds in total and per kind, processes, /dev/shm entries and MiB (the
    box's, and those the run holds)."""
    out: dict[str, float] = defaultdict(float)
    for _, kind, rss, fds in rows:
        out["RSS total (MiB)"] += rss / MiB
        out[f"RSS {kind} (MiB)"] += rss / MiB
        out["fds total"] += fds
        out[f"fds {kind}"] += fds
    out["processes"] = len(rows)
    ours = [size for ino, (_, size) in shm.items() if ino in held]
    out["/dev/shm entries (box)"] = len(shm)
    out["/dev/shm MiB (box)"] = sum(size for _, size in shm.values()) / MiB
    out["/dev/shm entries held by the run"] = len(ours)
    out["/dev/shm MiB held by the run"] = sum(ours) / MiB
    out["/dev/shm sem.mp-* (box)"] = sum(name.startswith("sem.mp-") for name, _ in shm.values())
    return out


@dataclass
class Soak:
    """What one run measured."""

    steps: list[int]  # [samples] the last step logged at each sample
    values: list[dict[str, float]]  # [samples] series name -> value
    shm_before: dict[int, tuple[str, int]]
    held_ever: set[int]  # inodes of /dev/shm files the run's processes held at some sample
    watch: Watch
    exit_code: int
    wall_s: float
    sampler_cpu_s: float  # this process's CPU time: what sampling took from the run


def soak(cmd: list[str], work: Path, out: Path, every: float) -> Soak:
    """Run ``cmd`` (output in ``work/relayrl.log``), sampling every ``every`` seconds until it exits."""
    shm_before, steps, values, held_ever = shm_files(), [], [], set()
    start = time.time()
    with (
        open(work / "relayrl.log", "w") as log,
        open(work / "processes.csv", "w", newline="") as pf,
        open(work / "shm.csv", "w", newline="") as sf,
    ):
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        watch, reader = Watch(proc.pid), Steps(out)
        pw, sw = csv.writer(pf), csv.writer(sf)
        pw.writerow(["t_s", "step", "pid", "kind", "rss_bytes", "fds"])
        shm_series = [name for name in series_of([], {}, set()) if name.startswith("/dev/shm")]
        sw.writerow(["t_s", "step", *shm_series])
        while proc.poll() is None:
            t = time.time() - start
            rows, held = watch.sample()
            shm, step = shm_files(), reader.read()
            held_ever |= held & shm.keys()
            sample = series_of(rows, shm, held)
            steps.append(step)
            values.append(sample)
            pw.writerows([f"{t:.2f}", step, *row] for row in rows)
            sw.writerow([f"{t:.2f}", step, *(f"{sample[name]:.6g}" for name in shm_series)])
            time.sleep(max(0.0, every - (time.time() - start - t)))
    cpu = os.times()
    wall = time.time() - start
    return Soak(steps, values, shm_before, held_ever, watch, proc.returncode, wall, cpu.user + cpu.system)


def report(run: Soak, lo: int, hi: int) -> list[str]:
    """The table of trends over steps [lo, hi): every series that is not 0 throughout the window."""
    window = [v for s, v in zip(run.steps, run.values) if lo <= s < hi]
    names = sorted({k for v in window for k, x in v.items() if x}, key=_order)
    lines = [f"{'series':40}{'start':>10}{'slope / 100 steps':>22}{'change':>10}{'of start':>10}   verdict"]
    for name in names:
        t = trend(run.steps, [v.get(name, 0.0) for v in run.values], lo, hi)
        slope, share = f"{t.slope:+.3g} ± {t.se:.2g}", f"{100 * t.change / t.start:+.2f}%" if t.start else ""
        lines.append(f"{name:40}{t.start:>10.4g}{slope:>22}{t.change:>+10.3g}{share:>10}   {t.verdict}")
    return lines


def _order(name: str) -> tuple[int, str]:
    """Totals first, then per kind; RSS, fds, processes, /dev/shm."""
    group = next(i for i, p in enumerate(("RSS", "fds", "processes", "/dev/shm")) if name.startswith(p))
    return group, "" if "total" in name else name


def leftovers(run: Soak, linger: float) -> list[str]:
    """What the run left: its processes still alive ``linger`` s after it exited, and the /dev/shm entries its
    processes held (at some sample) that are still there. An entry no sample saw held (made and dropped between
    two) counts with other programs' and is named if nobody holds it."""
    time.sleep(linger)
    alive = []
    for p, kind in run.watch.seen.values():
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{p.pid} ({kind})")
        except psutil.Error:
            continue
    after = shm_files()
    new = {ino: name for ino, (name, _) in after.items() if ino not in run.shm_before}
    held, _ = segments_in_use()
    ours = sorted(name for ino, name in new.items() if ino in run.held_ever)
    others = [ino for ino in new if ino not in run.held_ever]
    unheld = ", ".join(sorted(new[ino] for ino in others if ino not in held)) or "none"
    return [
        f"processes of the run alive {linger:.0f} s after it exited: {', '.join(alive) or 'none'}",
        f"/dev/shm entries the run's processes held, still there: {', '.join(ours) or 'none'}",
        f"/dev/shm entries others made while it ran (never held by the run): {len(others)}; held by nobody: {unheld}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--recipe", default="grpo_tiny")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--linger", type=float, default=10.0, help="seconds to wait after the run before checking")
    ap.add_argument("--work", type=Path, default=None, help="where the run, its log and the samples go")
    ap.add_argument("overrides", nargs="*", help="relayrl overrides, after mode=async rollout.stream=true")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="relayrl-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    out = work / "run"
    cmd = [sys.executable, "-m", "relayrl.cli", "train", "--config-name", args.recipe, f"run.steps={args.steps}"]
    cmd += [f"run.output_dir={out}", *RELAYRL, *DEFAULTS, *args.overrides]
    print(f"work dir: {work}", flush=True)
    run = soak(cmd, work, out, args.every)
    lo, hi = args.steps // 5, args.steps
    print(
        f"\nsoak: {args.recipe}, {max(run.steps, default=0)} of {args.steps} steps "
        f"({' '.join(DEFAULTS + args.overrides)}), exit {run.exit_code}, {run.wall_s:.0f} s, {len(run.steps)} samples "
        f"every {args.every:g} s (sampling used {run.sampler_cpu_s:.1f} CPU-s); window steps {lo}-{hi - 1}, 10 blocks; "
        f"{load_note()}"
    )
    print("\n".join(report(run, lo, hi)))
    print("\n".join(leftovers(run, args.linger)))


if __name__ == "__main__":
    main()
