"""One trainer step (forward, backward, AdamW) at long sequence lengths: relayrl's trainer beside the floor and TRL.

Per case (a length L and a layout) and configuration, one subprocess loads the model, runs exactly ONE step on
the case's tokens (no warm-up: the long step itself is the measurement) and reports the step's wall seconds
(model load and setup excluded) and the process's peak resident set (``ru_maxrss``, load included; GB here
is 2^30 bytes). Each configuration runs in its own process, so a peak is that configuration's alone. The step
is each process's first: all three create AdamW's moments in it; floor and trl copy their weights out of the
safetensors mapping at load (``own_weights``), as relayrl's FSDP2 load does, so no one pays those page faults
in the step. The box is shared: the load average is printed before and after.

Layouts, random tokens (speed and memory do not depend on what they say), rewards alternating 0, 1 inside
every group so that no group is dropped for zero reward spread and every advantage is non-zero:

    one      one sequence of L tokens: a 64-token prompt and an (L - 64)-token completion. GRPO (relayrl's
             default estimator) learns nothing from a group of one (``algorithm.group_size >= 2``; a lone
             sample has advantage 0 and its micro-batch is skipped), so relayrl gets a group of TWO: the
             L-token sequence and a 1-token-completion sibling sharing its prompt; with the default shared
             prefix the step's packed row holds L + 1 tokens. floor and trl compute the L-token sequence
             alone ([1, L]), so the sibling is relayrl's cost only.
    seg256   L / 256 sequences of 256 tokens: groups of 4 (a smaller last group when L / 256 is not a
             multiple of 4) with a distinct 32-token prompt per group and 224-token completions.

Configurations:

    relayrl  ``TrainerActor`` in-process (one FSDP2 rank over gloo) with ``TrainerConfig`` defaults, one
             ``train_step``; ``model.max_model_len`` is the layout's sequence length (a run that trains
             L-token sequences must set it so), which is what ``trainer.activation_checkpointing=auto``
             sizes against a quarter of the box's memory: the decision is printed per case.
    relayrl-full  the same with ``trainer.activation_checkpointing=full``: set beside ``relayrl`` where
             ``auto`` leaves checkpointing off, it shows what checkpointing saves and costs.
    floor    the physical floor for the same work: the HF model (``attn_implementation="sdpa"``), every
             decoder layer checkpointed (``recompute.checkpoint_layers(model, 1)``), the chunked LM head
             (``head.install`` / ``head.scoring``, chunks of ``trainer.logits_chunk``), each sequence its own
             batch row without padding or packing (one: [1, L]; seg256: [L / 256, 256], causal SDPA, every
             prompt computed per sequence), loss = -mean logprob of the completion tokens, backward, fused
             AdamW step.
    trl      TRL's GRPOTrainer loss as TRL computes it (TRL is not installed here; ``trl_logprobs`` restates
             its float32 path): HF gradient checkpointing (``use_reentrant=False``, train mode), full logits
             ``model(ids, mask, logits_to_keep=C + 1).logits[:, :-1] / temperature``, TRL's
             ``selective_log_softmax`` (gather minus a per-row ``logsumexp``), loss = token mean over the
             completion of -exp(lp - lp.detach()) * A with A = 1, backward, the HF Trainer's default gradient
             clip (1.0) and optimizer (fused AdamW for torch >= 2.8). seg256 is its padded batch
             [L / 256, 256] (TRL does not pack or share prompts). Left out, to TRL's advantage: the no-grad
             entropy TRL computes for logging, the generation and its reference/old-logprob forwards.

A child killed for memory (SIGKILL from the OOM killer, or an allocation error) shows as OOM, one past
``--timeout`` as timeout. The table also gives relayrl / floor and relayrl / trl (time, memory), and per L
relayrl's per-token cost of seg256 over seg256 at the smallest L.

Goals it checks (issue [long-context]), printed, never asserted: with the defaults one 16k sequence trains on
this box; peak trainer memory for an 8k row at most 6 GB; a step at 8k and at 16k at most 1.2x the floor's
time; a 16k row of 256-token sequences within 1.2x of a 1k row per token; relayrl's longest trainable single
sequence at least TRL's. Usage (the full default set takes about an hour of every core)::

    .venv/bin/python -m bench.long_context [--lengths 1024 4096 16384] [--layouts one seg256] \\
        [--configs relayrl floor trl] [--tiny] [--timeout 1800] [--threads N]

Each case's children run under the glibc malloc settings relayrl's rank would start with for it (``case_env``,
``config.runtime.malloc_env``: ``CPU_MALLOC_ENV`` for short micro-batches, ``LONG_ROWS_MALLOC_ENV`` for long ones);
floor and trl get the same, so each row compares like with like. The progress lines name the setting.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import torch

from bench.common import ROOT, load_note
from relayrl.config import CPU_MALLOC_ENV, AlgorithmConfig, ModelConfig, TrainerConfig, malloc_env
from relayrl.types import Trajectory, TrajectoryGroup, VersionSpan

CONFIGS = ("relayrl", "relayrl-full", "floor", "trl")
LAYOUTS = ("one", "seg256")
ONE_PROMPT = 64
SEG_LEN, SEG_PROMPT, SEG_GROUP = 256, 32, 4
DEFAULTS = TrainerConfig()
TEMPERATURE = 1.0
RESULT = "RESULT "
OOM_MARKERS = ("MemoryError", "not enough memory", "Cannot allocate memory", "can't allocate memory")


@dataclass(frozen=True)
class Case:
    """One row of the table: ``length`` tokens in the step, laid out as ``layout``."""

    length: int
    layout: str

    @property
    def seq_len(self) -> int:
        """Tokens of the case's longest sequence (what ``model.max_model_len`` must hold)."""
        return self.length if self.layout == "one" else SEG_LEN


# ---------------------------------------------------------------- the case's tokens


def _tokens(g: torch.Generator, vocab: int, n: int) -> list[int]:
    return torch.randint(10, vocab, (n,), generator=g).tolist()


def _group(prompt_id: int, prompt: list[int], completions: list[list[int]]) -> TrajectoryGroup:
    """A group whose rewards alternate 0, 1 (every group has reward spread, every advantage is non-zero)."""
    trajs = [
        Trajectory(
            prompt_id, i, prompt, c, [-1.0] * len(c), "", "stop", [VersionSpan(0, 0, len(c))], reward=float(i % 2)
        )
        for i, c in enumerate(completions)
    ]
    return TrajectoryGroup(prompt_id, f"prompt {prompt_id}", {}, trajs)


def seg_group_sizes(sequences: int) -> list[int]:
    """Groups of ``SEG_GROUP`` sequences, the remainder as a last smaller group (at least 2: GRPO's minimum)."""
    sizes = [SEG_GROUP] * (sequences // SEG_GROUP) + ([sequences % SEG_GROUP] if sequences % SEG_GROUP else [])
    if not sizes or min(sizes) < 2:
        raise SystemExit(f"seg256 needs L / {SEG_LEN} = {sequences} sequences in groups of >= 2; pick another L")
    return sizes


def case_groups(case: Case, vocab: int, seed: int = 0) -> list[TrajectoryGroup]:
    """The step's groups (module docstring): one: the L-token sequence and its 1-token sibling; seg256:
    groups of 256-token sequences with a distinct prompt each."""
    g = torch.Generator().manual_seed(seed)
    if case.layout == "one":
        prompt, long = _tokens(g, vocab, ONE_PROMPT), _tokens(g, vocab, case.length - ONE_PROMPT)
        sibling = [10 + (long[0] - 9) % (vocab - 10)]  # differs from long[0]: the shared prefix is the prompt
        return [_group(0, prompt, [long, sibling])]
    if case.length % SEG_LEN:
        raise SystemExit(f"seg256 needs L a multiple of {SEG_LEN}, got {case.length}")
    groups = []
    for p, n in enumerate(seg_group_sizes(case.length // SEG_LEN)):
        prompt = _tokens(g, vocab, SEG_PROMPT)
        groups.append(_group(p, prompt, [_tokens(g, vocab, SEG_LEN - SEG_PROMPT) for _ in range(n)]))
    return groups


def case_rows(case: Case, groups: list[TrajectoryGroup]) -> tuple[torch.Tensor, int]:
    """(token ids [R, S], prompt length P) the floor and TRL compute: one: the L-token sequence ([1, L]);
    seg256: every sequence, a row each ([L / 256, 256])."""
    trajs = [groups[0].trajectories[0]] if case.layout == "one" else [t for g in groups for t in g.trajectories]
    ids = torch.tensor([t.prompt_token_ids + t.completion_token_ids for t in trajs])
    return ids, len(trajs[0].prompt_token_ids)


# ---------------------------------------------------------------- children: one step each


def peak_gb() -> float:
    """This process's peak resident set so far, GB = KiB / 2^20 (Linux ``ru_maxrss`` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def checkpoint_decision(path: str, trainer: TrainerConfig, model: ModelConfig) -> str:
    """What ``trainer.activation_checkpointing`` resolves to for this case, as ``TrainerActor`` decides it."""
    from relayrl.trainer import recompute

    model_config = json.loads((Path(path) / "config.json").read_text())
    tokens = max(trainer.max_tokens_per_micro_batch, model.max_model_len)
    memory = recompute.rank_memory_bytes(torch.device("cpu"), 1)
    every = recompute.resolve_every(trainer.activation_checkpointing, model_config, tokens, memory)
    gb = recompute.activation_bytes(model_config, tokens) / 2**30
    return (
        f"ckpt {'off' if every == 0 else f'every {every}'} ({trainer.activation_checkpointing}, {gb:.1f} GB@{tokens})"
    )


def step_relayrl(
    path: str, case: Case, groups: list[TrajectoryGroup], threads: int, checkpointing: str = "auto"
) -> dict:
    """relayrl's ``TrainerActor`` with ``TrainerConfig`` defaults (``num_threads`` only under ``--threads``)."""
    from relayrl.trainer.actor import TrainerActor

    trainer = TrainerConfig(
        num_threads=0 if threads == os.cpu_count() else threads, activation_checkpointing=checkpointing
    )
    model = ModelConfig(path=path, max_model_len=case.seq_len)
    algo = AlgorithmConfig(group_size=max(len(g.trajectories) for g in groups))
    actor = TrainerActor(0, 1, "127.0.0.1", 0, path, model, trainer, algo, temperature=TEMPERATURE, seed=0)
    actor.setup()
    load = peak_gb()
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        stats = actor.train_step([groups])
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        actor.close()
    note = (
        checkpoint_decision(path, trainer, model)
        + f"; train_step's own train_seconds {stats.get('train_seconds', float('nan')):.2f}"
    )
    if not stats.get("tokens") or stats.get("skipped_micro_batches"):
        note += f" STEP SKIPPED (tokens {stats.get('tokens')}, skipped {stats.get('skipped_micro_batches')})"
    return {"s": seconds, "cpu": cpu, "load_gb": load, "note": note}


def own_weights(model: torch.nn.Module) -> None:
    """Give the weights private memory, as relayrl's load does (FSDP2 copies them into its shards): loaded by
    ``from_pretrained`` they are copy-on-write views of the safetensors file, and the first optimizer step
    would pay a page fault per 4 KiB of weights (seconds on this box) inside the timed step. Tied weights
    stay tied (``parameters()`` yields a shared one once and ``.data`` swaps its storage in place)."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()


def step_floor(path: str, case: Case, groups: list[TrajectoryGroup], threads: int) -> dict:
    """The floor (module docstring): per-sequence rows, every layer checkpointed, the chunked head."""
    from transformers import AutoModelForCausalLM

    from relayrl.trainer import head, recompute

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    own_weights(model)
    recompute.checkpoint_layers(model, 1)
    head.install(model.get_output_embeddings())
    optimizer = torch.optim.AdamW(model.parameters(), lr=DEFAULTS.lr, fused=True)
    ids, prompt = case_rows(case, groups)
    load = peak_gb()
    t0, c0 = time.perf_counter(), time.process_time()
    keep = torch.arange(prompt - 1, ids.shape[1] - 1)  # the positions that predict completion tokens
    request = head.Request(ids[:, prompt:], TEMPERATURE, DEFAULTS.logits_chunk)
    with head.scoring(model, request):
        logprobs = model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits[..., 0]  # [R, C]
    (-logprobs.mean()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"s": seconds, "cpu": cpu, "load_gb": load, "note": f"rows {tuple(ids.shape)}"}


def trl_logprobs(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """TRL's ``selective_log_softmax`` (``trl/trainer/utils.py``), its float32 branch, restated: the target's
    logit minus the logsumexp over the vocabulary, the logsumexp one row at a time ("to reduce peak memory").
    logits [R, C, V], index [R, C] -> [R, C]."""
    selected = torch.gather(logits, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
    return selected - torch.stack([torch.logsumexp(row, dim=-1) for row in logits])


def step_trl(path: str, case: Case, groups: list[TrajectoryGroup], threads: int) -> dict:
    """TRL's GRPO loss computation (module docstring): HF gradient checkpointing, full logits."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_cache=False)
    own_weights(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=DEFAULTS.lr, fused=True)
    ids, prompt = case_rows(case, groups)
    completion = ids.shape[1] - prompt
    load = peak_gb()
    t0, c0 = time.perf_counter(), time.process_time()
    mask = torch.ones_like(ids)
    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=completion + 1).logits
    logits = logits[:, :-1, :][:, -completion:] / TEMPERATURE  # [R, C, V]
    logps = trl_logprobs(logits, ids[:, -completion:])
    per_token = -torch.exp(logps - logps.detach()) * 1.0  # advantage 1
    completion_mask = mask[:, -completion:]
    ((per_token * completion_mask).sum() / completion_mask.sum()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"s": seconds, "cpu": cpu, "load_gb": load, "note": f"rows {tuple(ids.shape)}"}


STEPS = {
    "relayrl": step_relayrl,
    "relayrl-full": functools.partial(step_relayrl, checkpointing="full"),
    "floor": step_floor,
    "trl": step_trl,
}


def model_path(tiny: bool) -> str:
    from relayrl.models import resolve_model

    return str(resolve_model("tiny-llama" if tiny else "smollm2"))


def child(config: str, case: Case, tiny: bool, threads: int) -> None:
    """Run one configuration's step on ``case`` and print its result as one ``RESULT {json}`` line."""
    from transformers import AutoConfig

    path = model_path(tiny)
    groups = case_groups(case, AutoConfig.from_pretrained(path).vocab_size)
    out = STEPS[config](path, case, groups, threads)
    print(RESULT + json.dumps({**out, "gb": peak_gb()}), flush=True)


# ---------------------------------------------------------------- parent: cases, children, table


def run_child(config: str, case: Case, args: argparse.Namespace, env: dict[str, str]) -> dict:
    """One child process; its result, or ``{"error": "OOM" | "timeout" | "fail(rc)"}``."""
    cmd = [sys.executable, "-m", "bench.long_context", "--child", config, str(case.length), case.layout]
    cmd += ["--threads", str(args.threads), *(["--tiny"] if args.tiny else [])]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": "timeout"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT)]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1][len(RESULT) :])
    if done.returncode == -9 or any(m in done.stderr for m in OOM_MARKERS):
        return {"error": "OOM"}
    print(f"  {config} {case}: exited {done.returncode}; last lines:\n{done.stderr[-3000:]}", flush=True)
    return {"error": f"fail({done.returncode})"}


def cell(r: dict | None, key: str) -> str:
    if r is None:
        return "-"
    return r["error"] if "error" in r else f"{r[key]:.2f}"


def ratio(a: dict | None, b: dict | None, key: str) -> str:
    if not a or not b or "error" in a or "error" in b:
        return "-"
    return f"{a[key] / b[key]:.2f}x"


def ok(r: dict | None) -> TypeGuard[dict]:
    return r is not None and "error" not in r


def print_table(cases: list[Case], configs: list[str], res: dict) -> None:
    head = f"{'L':>6} {'layout':<7}" + "".join(f"{c + ' s':>12}{c + ' GB':>12}" for c in configs)
    head += "".join(f"{'r/' + b + ' ' + k:>12}" for b in ("floor", "trl") for k in ("s", "GB"))
    print(head)
    for case in cases:
        row = [res.get((c, case)) for c in configs]
        line = f"{case.length:>6} {case.layout:<7}" + "".join(f"{cell(r, 's'):>12}{cell(r, 'gb'):>12}" for r in row)
        rel = res.get(("relayrl", case))
        line += "".join(f"{ratio(rel, res.get((b, case)), k):>12}" for b in ("floor", "trl") for k in ("s", "gb"))
        print(line)


def print_per_token(cases: list[Case], res: dict) -> None:
    """relayrl's seg256 seconds per token at each L over those at the smallest L that ran."""
    seg = [c for c in cases if c.layout == "seg256" and ok(res.get(("relayrl", c)))]
    if not seg:
        return
    base = min(seg, key=lambda c: c.length)
    per = res[("relayrl", base)]["s"] / base.length
    for c in sorted(seg, key=lambda c: c.length):
        rate = res[("relayrl", c)]["s"] / c.length
        print(f"relayrl seg256 per-token cost at L={c.length} over L={base.length}: {rate / per:.2f}x")


def print_goals(res: dict) -> None:
    """The issue's goals, as far as this run's cases reach (n/a: the case did not run)."""
    get = res.get
    one16 = get(("relayrl", Case(16384, "one")))
    print("goals (issue [long-context]; measured, not asserted):")
    print(f"  one 16k sequence trains with the defaults: {'n/a' if one16 is None else ok(one16)}")
    for lay in LAYOUTS:
        r = get(("relayrl", Case(8192, lay)))
        print(f"  8k {lay} peak memory <= 6 GB: {'n/a' if r is None else cell(r, 'gb') + ' GB'}")
    for n in (8192, 16384):
        for lay in LAYOUTS:
            rel, flo = get(("relayrl", Case(n, lay))), get(("floor", Case(n, lay)))
            print(f"  {n} {lay} step <= 1.2x floor: {ratio(rel, flo, 's') if ok(rel) and ok(flo) else 'n/a'}")
    a, b = get(("relayrl", Case(16384, "seg256"))), get(("relayrl", Case(1024, "seg256")))
    per = f"{a['s'] / 16384 / (b['s'] / 1024):.2f}x" if ok(a) and ok(b) else "n/a"
    print(f"  16k seg256 per token <= 1.2x a 1k seg256: {per}")
    longest = {
        c: max((k[1].length for k, r in res.items() if k[0] == c and k[1].layout == "one" and ok(r)), default=0)
        for c in ("relayrl", "trl")
    }
    print(f"  longest single sequence trained (of those tried): relayrl {longest['relayrl']}, trl {longest['trl']}")


def long_case(case: Case, tiny: bool) -> bool:
    """Whether relayrl's one rank counts the case's micro-batches as long (``recompute.rank_rows_are_long``)."""
    from relayrl.trainer import recompute

    model = ModelConfig(path=model_path(tiny), max_model_len=case.seq_len)
    return recompute.rank_rows_are_long(model.path, TrainerConfig(), model, 1)


def case_env(long: bool) -> dict[str, str]:
    """This environment with the malloc settings relayrl's rank starts with for a case, long or not (module
    docstring)."""
    env = {k: v for k, v in os.environ.items() if k not in CPU_MALLOC_ENV}
    return {**env, **malloc_env(long)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384], help="tokens in the step")
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--tiny", action="store_true", help="the tiny Llama instead of SmolLM2-135M (smoke tests)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per child before it counts as timeout")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads per child")
    ap.add_argument("--child", nargs=3, metavar=("CONFIG", "L", "LAYOUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        config, length, layout = args.child
        child(config, Case(int(length), layout), args.tiny, args.threads)
    else:
        run_all(args)


def run_all(args: argparse.Namespace) -> None:
    """Every (case, configuration) in its own child, one after the other; progress, then the table."""
    cases = [Case(n, lay) for n in args.lengths for lay in args.layouts]
    print(
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}  model {model_path(args.tiny)}  threads {args.threads}  "
        f"{load_note()}  one step per child, load excluded; 'one' = GRPO group of 2 for relayrl (the L-token "
        f"sequence + a 1-token sibling on its prompt), the L-token sequence alone for floor and trl"
    )
    res: dict[tuple[str, Case], dict] = {}
    for case in cases:
        long = long_case(case, args.tiny)
        malloc = "LONG_ROWS_MALLOC_ENV" if long else "CPU_MALLOC_ENV"
        for config in args.configs:
            r = res[(config, case)] = run_child(config, case, args, case_env(long))
            print(
                f"  {config:<8} L={case.length:<6} {case.layout:<7} {cell(r, 's')} s  {cell(r, 'gb')} GB  [{malloc}] "
                f"(cpu {cell(r, 'cpu')} s; peak at load {cell(r, 'load_gb')} GB)  {r.get('note', '')}",
                flush=True,
            )
    print_table(cases, args.configs, res)
    print_per_token(cases, res)
    print_goals(res)
    print(f"after: {load_note()}")


if __name__ == "__main__":
    main()
