"""Elastic rollout on a real run: how soon a replica asked for with ``relayrl scale`` serves, and what it costs.

One ``relayrl train`` of the main job's recipe (``grpo_arith``, SmolLM2-135M-Instruct) starts with one
replica. After ``--at`` steps the bench asks for a second (``relayrl.scale``), and after ``--down`` more steps
for one again. It prints:

- the seconds from the request to the console's ``joined`` line (engine start-up, connect, sync of the current
  version), with the floor beside it: the first engine's own start-up in the same run (``startup/engine_s``);
- the steps logged between the request and the first step with 2 replicas serving;
- mean step time with 1 replica, then 2, then 1 again (on this 2-core box a second engine shares the cores
  with the first and the trainer, so more replicas do not make steps faster here; on a cluster they run on
  their own nodes);
- that every step trained and the accounting line (``issued = trained + dropped + in flight``).

    python -m bench.swarm
    python -m bench.swarm --steps 16 --at 3 --down 6
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import RELAYRL, ROOT, load_note
from relayrl import scale
from relayrl.monitor.runs import read_records


def wait_for(what: str, check, proc: subprocess.Popen, timeout_s: float = 1800.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (got := check()) is not None:
            return got
        if proc.poll() is not None:
            raise SystemExit(f"the run ended while waiting for {what}")
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--at", type=int, default=3, help="steps with 1 replica before asking for 2")
    parser.add_argument("--down", type=int, default=6, help="steps with 2 replicas before asking for 1")
    parser.add_argument("--recipe", default="grpo_arith")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="relayrl-swarm-"))
    overrides = [f"run.steps={args.steps}", f"run.output_dir={work}", "placement.num_cpus=5", *RELAYRL]
    print(f"{args.recipe} {' '.join(args.overrides)}; {load_note()}; run in {work}", flush=True)
    log_path = work / "train.log"
    with log_path.open("w") as log:
        cmd = [sys.executable, "-m", "relayrl", "train", "--config-name", args.recipe, *overrides, *args.overrides]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        run = wait_for("the run dir", lambda: next(iter(work.glob("*/metrics.jsonl")), None), proc).parent
        steps = lambda n: lambda: len(read_records(run)) >= n or None  # noqa: E731
        wait_for(f"step {args.at}", steps(args.at), proc)
        asked_step, t_up = len(read_records(run)), time.monotonic()
        scale(str(run), 2)
        wait_for("the join", lambda: "joined after" in log_path.read_text() or None, proc)
        join_s = time.monotonic() - t_up
        first_two = wait_for(
            "a step with 2", lambda: next((r for r in read_records(run) if r["rollout/replicas"] == 2), None), proc
        )
        wait_for(f"{args.down} steps with 2", steps(first_two["step"] + args.down - 1), proc)
        scale(str(run), 1)
        code = proc.wait()
    text = log_path.read_text()
    records = read_records(run)
    by_count: dict[str, list[float]] = {"1 (before)": [], "2": [], "1 (after)": []}
    for r in records[1:]:  # step 1 holds the engines' warm-up
        key = "2" if r["rollout/replicas"] == 2 else ("1 (before)" if r["step"] < first_two["step"] else "1 (after)")
        by_count[key].append(r["timing/step"])
    engine_s = records[0].get("startup/engine_s", float("nan"))
    print(f"| run exit code | {code} |")
    print(f"| join: request -> joined (s) | {join_s:.1f} |")
    print(f"| floor: the first engine's start-up in this run (s) | {engine_s:.1f} |")
    print(f"| join / floor | {join_s / engine_s:.2f} |")
    between = first_two["step"] - asked_step - 1
    print(f"| steps logged between the request (after step {asked_step}) and the first with 2 | {between} |")
    for key, times in by_count.items():
        if times:
            print(f"| s/step with {key} replica(s), {len(times)} steps | {statistics.mean(times):.2f} |")
    print(f"| every step trained | {[r['step'] for r in records] == list(range(1, args.steps + 1))} |")
    line = re.search(r"prompts: issued .*", text)
    print(f"| accounting | {line.group(0) if line else 'missing'} |")


if __name__ == "__main__":
    main()
