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

    .venv/bin/python bench/startup_floor.py [--pairs 2] [--recipe grpo_arith] [relayrl overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 30.0
"""Issue 16 part 5: the first step logged within this many seconds of launch."""
BARE_ENV = {"TORCHDYNAMO_DISABLE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}


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
    llm = LLM(model=job["model"], dtype=job["dtype"], max_model_len=job["max_model_len"], seed=job["seed"],
              kv_cache_memory_bytes=job["kv_cache_bytes"], enforce_eager=True, disable_log_stats=True,
              enable_chunked_prefill=False, max_num_batched_tokens=max(2048, job["max_model_len"]))
    mark(work, "engine", "engine ready", t0)
    params = SamplingParams(n=job["group_size"], max_tokens=job["max_tokens"], temperature=job["temperature"],
                            top_p=job["top_p"], logprobs=0, seed=job["seed"])
    outputs = llm.generate([p["prompt"] for p in job["prompts"]], params, use_tqdm=False)
    mark(work, "engine", "generated", t0)
    from relayrl.rewards import load_reward_fns

    fns, rows = load_reward_fns(job["rewards"]), []
    for prompt, out in zip(job["prompts"], outputs):
        texts = [c.text for c in out.outputs]
        rows.append({"prompt_ids": list(out.prompt_token_ids),
                     "completion_ids": [list(c.token_ids) for c in out.outputs],
                     "rewards": rewards(fns, prompt, texts)})
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
    rows, cols = scored.nonzero(as_tuple=True)            # the LM head only where a completion token is scored
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
    from vs_trl import prompt_rows            # bench/vs_trl.py, beside this script

    from relayrl.config import load_config
    from relayrl.models import resolve_model

    cfg = load_config(recipe, ["run.steps=1", *overrides])
    if cfg.model.dtype != "float32" or cfg.trainer.dtype != "float32":
        sys.exit("this bench's bare trainer runs float32; run it without dtype overrides")
    path = resolve_model(cfg.model.path)
    rows = prompt_rows(cfg, AutoTokenizer.from_pretrained(path), 1)
    job = {"model": str(path), "dtype": cfg.model.dtype, "max_model_len": cfg.model.max_model_len,
           "seed": cfg.run.seed, "kv_cache_bytes": int(cfg.rollout.kv_cache_gb * 2**30),
           "group_size": cfg.algorithm.group_size, "max_tokens": cfg.rollout.max_tokens,
           "temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p, "lr": cfg.trainer.lr,
           "rewards": [[s.fn, s.weight, s.kwargs] for s in cfg.rewards],
           "prompts": [{"prompt": r.pop("prompt"), "columns": r} for r in rows]}
    work.mkdir(parents=True, exist_ok=True)
    (work / "job.json").write_text(json.dumps(job))


def run_bare(work: Path) -> dict[str, float]:
    """Both bare children at once; ``{"role: event": seconds since their launch}``."""
    (work / "marks.jsonl").unlink(missing_ok=True)
    (work / "rollout.json").unlink(missing_ok=True)
    env = {**os.environ, **BARE_ENV}
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, "--child", role, str(work), str(t0)], env=env,
                              stdout=log, stderr=subprocess.STDOUT)
             for role in ("engine", "trainer") for log in [(work / f"{role}.log").open("w")]]
    for role, proc in zip(("engine", "trainer"), procs):
        if proc.wait() != 0:
            for p in procs:
                p.kill()
            sys.exit(f"bare {role} exited {proc.returncode}; see {work / (role + '.log')}")
    rows = [json.loads(line) for line in (work / "marks.jsonl").read_text().splitlines()]
    marks = {f"{r['role']}: {r['event']}": r["s"] for r in rows}
    return {**marks, "(generate)": marks["engine: generated"] - marks["engine: engine ready"],
            "(update)": marks["trainer: first step done"] - max(marks["engine: scored"],
                                                              marks["trainer: model + AdamW ready"])}


def run_relayrl(recipe: str, overrides: list[str], work: Path) -> dict[str, float]:
    """``relayrl train ... run.steps=1``; its launch -> first step and start-up metrics."""
    from vs_trl import run_relayrl as run

    side = run(recipe, 1, overrides, work)
    first = json.loads((side.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    loop = side.first_step_at - first["startup/first_step_s"]
    return {"step loop starts (engines + trainer up)": loop, "  of which engines up (startup/engines_up_s)":
            first["startup/engines_up_s"], "first step: generate": first["timing/generate"],
            "first step: update": first["timing/update"], "first step: sync": first["timing/sync"],
            "first step logged": side.first_step_at}


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
    print(f"\nmedian launch -> first step: relayrl {got:.1f} s, bare pipeline {floor:.1f} s: relayrl takes "
          f"{got / floor:.2f}x the bare pipeline ({got - floor:+.1f} s)")
    print(f"    bare engine ready {ready:.1f} s after launch; relayrl's step loop starts "
          f"{statistics.median(o['step loop starts (engines + trainer up)'] for o in ours):.1f} s after launch")
    print(f"    {'PASS' if got <= GOAL_S else 'MISS'}  first step logged <= {GOAL_S:g} s after launch: {got:.1f} s "
          f"(bare pipeline {'under' if floor <= GOAL_S else 'over'} it: {floor:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=2, help="(bare, relayrl) pairs, alternated")
    parser.add_argument("--recipe", default="grpo_arith")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.child:
        role, work, t0 = args.child
        return (engine_child if role == "engine" else trainer_child)(Path(work), float(t0))
    work = Path(tempfile.mkdtemp(prefix="relayrl-startup-"))
    print(f"work dir (logs): {work}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    write_job(args.recipe, overrides, work / "bare")
    bare, ours = [], []
    for i in range(args.pairs):
        bare.append(run_bare(work / "bare"))
        ours.append(run_relayrl(args.recipe, overrides, work / f"relayrl-{i}"))
        print(f"pair {i + 1}: bare {bare[-1]['trainer: first step done']:.1f} s, relayrl "
              f"{ours[-1]['first step logged']:.1f} s", flush=True)
    report(bare, ours)


if __name__ == "__main__":
    main()
