"""Launch -> first step: ``relayrl train`` against the bare pipeline it is built from, same box, same job (issue 16
part 5: first step logged <= 30 s after launch).

The bare pipeline is the least a first GRPO step needs with the same libraries: two processes started at once, no
Ray, no config system, no checks, nothing logged:

engine   imports vLLM and builds one ``vllm.LLM`` with the recipe's engine settings (dtype, context, KV cache,
         eager with Dynamo off as relayrl's engines run; the engine core in this process,
         ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so vLLM is imported once), generates the first step's prompts x
         ``algorithm.group_size`` (``rollout.max_tokens``, temperature, top_p, a logprob per token), scores them with
         the recipe's reward functions and writes the token ids and rewards to a file;
trainer  imports torch and transformers, loads the float32 model, makes AdamW (``trainer.lr``), waits for that
         file and runs one update: one padded forward and backward over every (prompt, completion) row (the LM
         head only at completion tokens, as relayrl's trainer), the policy-gradient loss with group-normalised
         rewards, one optimizer step. relayrl computes each group's prompt once (shared-prefix packing); this
         trainer computes it for every row, so its update is not a floor, only the plain way.

Its first step ends when the optimizer step returns; no weight sync is counted (its floor, ~0.2 s here, is
``bench/weight_sync.py``'s). The prompts are chat-formatted by this script before the clock starts (the same
prompts relayrl's sampler gives its first step). relayrl's side is ``relayrl train --config-name RECIPE
run.steps=1``: generate, reward, update, sync, log. Both clocks start when this script starts the subprocesses;
relayrl's ends when its first step's metrics row is written (``wall_time``). Pairs alternate (bare, relayrl) so
both sides share the box's drift. Nothing is asserted: a bench prints, tests prove.

Both sides are CPU-bound on a small box, so each run also counts the work done until its first step: the box's
busy CPU-seconds (``/proc/stat``) and, per role, the CPU time of the processes the run started (sampled every
0.25 s from ``/proc/<pid>/stat``; a process keeps the role of the last name it had, so a Ray worker that became
the trainer counts as the trainer). Busy CPU-seconds over the box's cores is the first step's floor for that much
work: the time it would take with every core busy from launch on.

    .venv/bin/python -m bench.startup_floor [--pairs 2] [--recipe grpo_arith] [relayrl overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import ROOT, load_note, prompt_rows, run_relayrl

GOAL_S = 30.0
"""Issue 16 part 5: the first step logged within this many seconds of launch."""
BARE_ENV = {"TORCHDYNAMO_DISABLE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}


ROLES = (
    ("trainer", ("TrainerActor", "--child trainer")),
    ("reward pool", ("ray::Reward",)),
    ("engine", ("VLLM::", "relayrl-engine-host", "RolloutActor", "multiprocessing.forkserver", "--child engine")),
    (
        "Ray system",
        (
            "gcs_server",
            "raylet",
            "ray/dashboard",
            "monitor.py",
            "log_monitor",
            "ray::DashboardAgent",
            "ray::RuntimeEnvAgent",
            "ray::IDLE",
        ),
    ),
    ("driver", ("relayrl.cli",)),
)
"""Which role a process plays, by a fragment of its name or command line (the first role that matches)."""
TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- CPU accounting


def role_of(name: str) -> str:
    return next((role for role, marks in ROLES if any(m in name for m in marks)), "other")


def box_busy_s(stat_line: str) -> float:
    """Busy CPU-seconds since boot, all cores, from ``/proc/stat``'s ``cpu`` line: user, nice, system, irq and
    softirq time (not idle, iowait, or steal: time the hypervisor gave to others)."""
    user, nice, system, _idle, _iowait, irq, softirq = map(int, stat_line.split()[1:8])
    return (user + nice + system + irq + softirq) / TICK


def proc_times(stat: str) -> tuple[float, int]:
    """(CPU-seconds, start in ticks after boot) of one ``/proc/<pid>/stat`` text (its name may hold spaces)."""
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK, int(fields[19])


@dataclass
class Sample:
    at: float  # epoch seconds
    busy_s: float  # the box's busy CPU-seconds since boot
    procs: dict[int, tuple[str, float]]  # pid -> (name, CPU-seconds), processes started since the meter


@dataclass
class CpuMeter:
    """Samples the box's busy time and the CPU time of every process started after ``start`` (a thread)."""

    period_s: float = 0.25
    samples: list[Sample] = field(default_factory=list)

    def start(self) -> None:
        self._since_ticks = int(time.clock_gettime(time.CLOCK_BOOTTIME) * TICK) - 1
        self._stop = threading.Event()
        self.samples.append(self.sample())
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.samples.append(self.sample())

    def sample(self) -> Sample:
        with open("/proc/stat") as f:
            busy = box_busy_s(f.readline())
        procs = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    cpu_s, started = proc_times(f.read())
                if started >= self._since_ticks:
                    procs[int(pid)] = (self._name(int(pid)), cpu_s)
            except OSError:  # it ended meanwhile
                continue
        return Sample(time.time(), busy, procs)

    def _name(self, pid: int) -> str:
        """The process's title (Ray and vLLM retitle their processes) or command line, read again each time:
        a Ray worker takes its actor's name after it started. An exiting process has none left: it keeps the
        name it had in the previous sample."""
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            name = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
        if name or not self.samples:
            return name
        return self.samples[-1].procs.get(pid, ("", 0.0))[0]


def cpu_until(samples: list[Sample], at: float) -> dict[str, float]:
    """The box's busy CPU-seconds from the first sample to the first sample at or after ``at``, and per role the
    CPU-seconds of the processes seen until then (each at its last sample, under the last name it had)."""
    upto = [s for s in samples if s.at < at] + [s for s in samples if s.at >= at][:1]
    last: dict[int, tuple[str, float]] = {}
    for s in upto:
        last.update(s.procs)
    roles = {role: 0.0 for role, _ in ROLES} | {"other": 0.0}
    for name, cpu_s in last.values():
        roles[role_of(name)] += cpu_s
    return {"busy CPU-s": upto[-1].busy_s - upto[0].busy_s, **roles}


# ---------------------------------------------------------------- bare pipeline (child processes)


def mark(work: Path, role: str, event: str, t0: float) -> None:
    """Append ``event``'s seconds since ``t0`` to ``work/marks.jsonl``."""
    with (work / "marks.jsonl").open("a") as f:
        f.write(json.dumps({"role": role, "event": event, "s": time.time() - t0}) + "\n")


def engine_child(work: Path, t0: float) -> None:
    """Generate and score the first step's completions; write ``work/rollout.json`` when done."""
    job = json.loads((work / "job.json").read_text())
    from vllm import LLM, SamplingParams

    mark(work, "engine", "vLLM imported", t0)
    llm = LLM(
        model=job["model"],
        dtype=job["dtype"],
        max_model_len=job["max_model_len"],
        seed=job["seed"],
        kv_cache_memory_bytes=job["kv_cache_bytes"],
        enforce_eager=True,
        disable_log_stats=True,
        enable_chunked_prefill=False,
        max_num_batched_tokens=max(2048, job["max_model_len"]),
    )
    mark(work, "engine", "engine ready", t0)
    params = SamplingParams(
        n=job["group_size"],
        max_tokens=job["max_tokens"],
        temperature=job["temperature"],
        top_p=job["top_p"],
        logprobs=0,
        seed=job["seed"],
    )
    outputs = llm.generate([p["prompt"] for p in job["prompts"]], params, use_tqdm=False)
    mark(work, "engine", "generated", t0)
    from relayrl.rewards import load_reward_fns

    fns, rows = load_reward_fns(job["rewards"]), []
    for prompt, out in zip(job["prompts"], outputs):
        texts = [c.text for c in out.outputs]
        rows.append(
            {
                "prompt_ids": list(out.prompt_token_ids),
                "completion_ids": [list(c.token_ids) for c in out.outputs],
                "rewards": rewards(fns, prompt, texts),
            }
        )
    tmp = work / "rollout.tmp"
    tmp.write_text(json.dumps(rows))
    tmp.rename(work / "rollout.json")
    mark(work, "engine", "scored", t0)


def rewards(fns: list[tuple], prompt: dict, texts: list[str]) -> list[float]:
    """The recipe's weighted reward (``load_reward_fns``' ``[(name, fn, weight)]``) of each completion of one
    prompt (``None`` counts 0)."""
    columns = {k: [v] * len(texts) for k, v in prompt["columns"].items()}
    total = [0.0] * len(texts)
    for _, fn, weight in fns:
        for i, r in enumerate(fn([prompt["prompt"]] * len(texts), texts, **columns)):
            total[i] += weight * (r or 0.0)
    return total


def trainer_child(work: Path, t0: float) -> None:
    """Load the model and AdamW, wait for the rollout, run one GRPO update."""
    job = json.loads((work / "job.json").read_text())
    import torch
    from transformers import AutoModelForCausalLM

    mark(work, "trainer", "torch + transformers imported", t0)
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=job["lr"])
    mark(work, "trainer", "model + AdamW ready", t0)
    while not (work / "rollout.json").exists():
        time.sleep(0.02)
    ids, mask, scored, adv = batch(json.loads((work / "rollout.json").read_text()))
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
    rows, cols = scored.nonzero(as_tuple=True)  # the LM head only where a completion token is scored
    logits = model.lm_head(hidden[rows, cols]).float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[rows, cols + 1, None]).squeeze(-1)
    loss = -(logp * adv[rows]).sum() / len(rows)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mark(work, "trainer", "first step done", t0)


def batch(rows: list[dict]):
    """Right-padded ``(ids, attention mask, completion-token mask over ids[:, 1:], advantage per row)``; the
    advantage is the reward less its group's mean, over the group's std (0 where the group agrees)."""
    import torch

    seqs, scored, adv = [], [], []
    for row in rows:
        r = torch.tensor(row["rewards"])
        adv += ((r - r.mean()) / (r.std() + 1e-6)).tolist()
        for completion in row["completion_ids"]:
            seqs.append(row["prompt_ids"] + completion)
            scored.append([0] * (len(row["prompt_ids"]) - 1) + [1] * len(completion))
    width = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    score = torch.tensor([s + [0] * (width - 1 - len(s)) for s in scored])
    return ids, mask, score, torch.tensor(adv)


# ---------------------------------------------------------------- the two sides


def write_job(recipe: str, overrides: list[str], work: Path) -> None:
    """The first step's job, from the recipe, as the bare children read it (``work/job.json``)."""
    from transformers import AutoTokenizer

    from relayrl.config import load_config
    from relayrl.models import resolve_model

    cfg = load_config(recipe, ["run.steps=1", *overrides])
    if cfg.model.dtype != "float32" or cfg.trainer.dtype != "float32":
        sys.exit("this bench's bare trainer runs float32; run it without dtype overrides")
    path = resolve_model(cfg.model.path)
    rows = prompt_rows(cfg, AutoTokenizer.from_pretrained(path), 1)
    job = {
        "model": str(path),
        "dtype": cfg.model.dtype,
        "max_model_len": cfg.model.max_model_len,
        "seed": cfg.run.seed,
        "kv_cache_bytes": int(cfg.rollout.kv_cache_gb * 2**30),
        "group_size": cfg.algorithm.group_size,
        "max_tokens": cfg.rollout.max_tokens,
        "temperature": cfg.rollout.temperature,
        "top_p": cfg.rollout.top_p,
        "lr": cfg.trainer.lr,
        "rewards": [[s.fn, s.weight, s.kwargs] for s in cfg.rewards],
        "prompts": [{"prompt": r.pop("prompt"), "columns": r} for r in rows],
    }
    work.mkdir(parents=True, exist_ok=True)
    (work / "job.json").write_text(json.dumps(job))


def run_bare(work: Path) -> tuple[dict[str, float], float]:
    """Both bare children at once; ``{"role: event": seconds since their launch}`` and when the first step
    ended (epoch seconds)."""
    (work / "marks.jsonl").unlink(missing_ok=True)
    (work / "rollout.json").unlink(missing_ok=True)
    env = {**os.environ, **BARE_ENV}
    t0 = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.startup_floor", "--child", role, str(work), str(t0)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        for role in ("engine", "trainer")
        for log in [(work / f"{role}.log").open("w")]
    ]
    for role, proc in zip(("engine", "trainer"), procs):
        if proc.wait() != 0:
            for p in procs:
                p.kill()
            sys.exit(f"bare {role} exited {proc.returncode}; see {work / (role + '.log')}")
    rows = [json.loads(line) for line in (work / "marks.jsonl").read_text().splitlines()]
    marks = {f"{r['role']}: {r['event']}": r["s"] for r in rows}
    figures = {
        **marks,
        "(generate)": marks["engine: generated"] - marks["engine: engine ready"],
        "(update)": marks["trainer: first step done"]
        - max(marks["engine: scored"], marks["trainer: model + AdamW ready"]),
    }
    return figures, t0 + marks["trainer: first step done"]


def first_step(recipe: str, overrides: list[str], work: Path) -> tuple[dict[str, float], float]:
    """``relayrl train ... run.steps=1``; its launch -> first step and start-up metrics, and when its first
    step was logged (epoch seconds)."""
    side = run_relayrl(recipe, 1, overrides, work)
    first = json.loads((side.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    loop = side.first_step_at - first["startup/first_step_s"]
    return {
        "step loop starts (engines + trainer up)": loop,
        "  of which engines up (startup/engines_up_s)": first["startup/engines_up_s"],
        "first step: generate": first["timing/generate"],
        "first step: update": first["timing/update"],
        "first step: sync": first["timing/sync"],
        "first step logged": side.first_step_at,
    }, first["wall_time"]


def metered(run, *args) -> tuple[dict[str, float], dict[str, float]]:
    """``run(*args)``'s figures and the CPU work (``cpu_until``) from its launch to its first step's end."""
    meter = CpuMeter()
    meter.start()
    try:
        figures, first_step_at = run(*args)
    finally:
        meter.stop()
    return figures, cpu_until(meter.samples, first_step_at)


def report_cpu(bare: list[dict[str, float]], ours: list[dict[str, float]]) -> None:
    """CPU-seconds until the first step, per pair and by role, and the floor they set on this box's cores."""
    cores = os.cpu_count() or 1
    print(f"\nCPU work from launch to the first step (CPU-seconds; pairs in order; {cores} cores):")
    for name, side in (("bare", bare), ("relayrl", ours)):
        print(f"  {name}:")
        for key in side[0]:
            if any(c[key] >= 0.05 for c in side):
                print(f"    {key:<40} " + "  ".join(f"{c[key]:6.1f}" for c in side))
    for name, side in (("bare", bare), ("relayrl", ours)):
        busy = statistics.median(c["busy CPU-s"] for c in side)
        print(
            f"    {name}: median {busy:.1f} busy CPU-s; / {cores} cores = {busy / cores:.1f} s, its first step "
            f"with every core busy from launch on"
        )
    need = GOAL_S * cores
    print(f"    the goal ({GOAL_S:g} s) allows at most {need:.0f} CPU-s on {cores} cores")


def report(bare: list[dict[str, float]], ours: list[dict[str, float]]) -> None:
    """Per-pair figures, medians, and the goal against both."""
    print("\nbare pipeline (seconds after launch; pairs in order):")
    for key in bare[0]:
        print(f"    {key:<40} " + "  ".join(f"{b[key]:6.1f}" for b in bare))
    print("relayrl train run.steps=1:")
    for key in ours[0]:
        print(f"    {key:<40} " + "  ".join(f"{o[key]:6.1f}" for o in ours))
    floor = statistics.median(b["trainer: first step done"] for b in bare)
    ready = statistics.median(b["engine: engine ready"] for b in bare)
    got = statistics.median(o["first step logged"] for o in ours)
    print(
        f"\nmedian launch -> first step: relayrl {got:.1f} s, bare pipeline {floor:.1f} s: relayrl takes "
        f"{got / floor:.2f}x the bare pipeline ({got - floor:+.1f} s)"
    )
    print(
        f"    bare engine ready {ready:.1f} s after launch; relayrl's step loop starts "
        f"{statistics.median(o['step loop starts (engines + trainer up)'] for o in ours):.1f} s after launch"
    )
    print(
        f"    {'PASS' if got <= GOAL_S else 'MISS'}  first step logged <= {GOAL_S:g} s after launch: {got:.1f} s "
        f"(bare pipeline {'under' if floor <= GOAL_S else 'over'} it: {floor:.1f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=2, help="(bare, relayrl) pairs, alternated")
    parser.add_argument("--recipe", default="grpo_arith")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.child:
        role, work, t0 = args.child
        (engine_child if role == "engine" else trainer_child)(Path(work), float(t0))
        return
    work = Path(tempfile.mkdtemp(prefix="relayrl-startup-"))
    print(f"work dir (logs): {work}; {load_note()}", flush=True)
    write_job(args.recipe, overrides, work / "bare")
    bare, ours, bare_cpu, our_cpu = [], [], [], []
    for i in range(args.pairs):
        for figures, cpu, run in (
            (bare, bare_cpu, (run_bare, work / "bare")),
            (ours, our_cpu, (first_step, args.recipe, overrides, work / f"relayrl-{i}")),
        ):
            figures_now, cpu_now = metered(*run)
            figures.append(figures_now)
            cpu.append(cpu_now)
        print(
            f"pair {i + 1}: bare {bare[-1]['trainer: first step done']:.1f} s "
            f"({bare_cpu[-1]['busy CPU-s']:.1f} CPU-s), relayrl {ours[-1]['first step logged']:.1f} s "
            f"({our_cpu[-1]['busy CPU-s']:.1f} CPU-s)",
            flush=True,
        )
    report(bare, ours)
    report_cpu(bare_cpu, our_cpu)


if __name__ == "__main__":
    main()
