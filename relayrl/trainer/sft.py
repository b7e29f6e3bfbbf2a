"""Supervised warm start: fine-tune the model on prompt/completion rows before RL (``sft.steps > 0``).

A model that never produces the task's answer format gives GRPO nothing to compare (every group scores 0).
A short SFT phase on worked solutions, the step that DeepSeek-R1's cold start and TRL's ``SFTTrainer`` take,
teaches the format; RL then improves what the answers say. It runs in a child of the driver before Ray starts
(the engines and ranks are not up yet, so it has the cores), on the rows of ``worked_examples`` (a generated
task's fresh problems with their solutions) or a local jsonl in TRL's prompt-completion format.

Loss: token-mean cross-entropy over completion tokens only (the prompt, formatted by the chat template as the
RL prompts are, is context), completions ending in the tokenizer's EOS. AdamW at a constant ``sft.lr``,
gradients clipped at 1. The model is written, durably, to ``<run dir>/sft`` with its tokenizer and ``sft.json``
(losses, seconds); RL loads it as its model and as its KL reference. A resumed run finds it there and does not
train it again.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch

from relayrl.config import Config, ConfigError

logger = logging.getLogger(__name__)

IGNORE = -100
"""Label of a position the loss skips (HF's convention)."""
Example = tuple[list[int], list[int]]
"""One training sequence: (token ids, labels), the labels ``IGNORE`` outside the completion."""
SUMMARY = "sft.json"
"""In the fine-tuned model's directory: ``{"losses": [per step], "examples": n, "seconds": wall}``."""


def warm_start(cfg: Config, model_path: Path, out: Path) -> Path:
    """The fine-tuned model directory ``out``, trained from ``model_path`` unless ``out`` is already there."""
    from relayrl.controller.checkpoint import durable_dir

    if (out / "config.json").is_file():
        logger.info("relayrl: sft: reusing the warm-started model in %s", out)
        return out
    rows = sft_rows(cfg)
    t0 = time.perf_counter()
    losses: list[float] = []
    durable_dir(out, lambda tmp: losses.extend(fine_tune_in_child(cfg, model_path, rows, tmp)))
    first, last = _mean(losses[:5]), _mean(losses[-5:])
    logger.info(
        "relayrl: sft: %d steps on %d examples in %.0f s, loss first-5 %.3f -> last-5 %.3f; model in %s",
        len(losses),
        len(rows),
        time.perf_counter() - t0,
        first,
        last,
        out,
    )
    return out


def sft_rows(cfg: Config) -> list[dict[str, Any]]:
    """The warm start's rows: ``sft.path``'s, else the environment's demonstrations of fresh problems (rows
    ``{"sample": row}``, replayed through the environment in the child: ``env_examples``), else worked
    examples of the task."""
    from relayrl.data import sft_problems, worked_examples
    from relayrl.envs import load_env_class

    if cfg.sft.path:
        return read_prompt_completion(Path(cfg.sft.path))
    if cfg.env.name:
        if not hasattr(load_env_class(cfg.env.name), "demonstration"):
            raise ConfigError(
                f"sft: environment {cfg.env.name} has no demonstration(sample) to learn from; "
                "set sft.path to a jsonl of prompt/completion rows or sft.steps=0"
            )
        return [{"sample": row} for row in sft_problems(cfg.data, cfg.sft.examples)]
    return worked_examples(cfg.data, cfg.sft.examples)


def read_prompt_completion(path: Path) -> list[dict[str, Any]]:
    """Rows of a TRL prompt-completion jsonl; a bad line is named with its number and what it lacks."""
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"sft.path={path} line {i} is not JSON ({exc.msg}); fix or remove the line") from None
        if not isinstance(row, dict) or not isinstance(row.get("completion"), str) or "prompt" not in row:
            raise ConfigError(
                f'sft.path={path} line {i} needs "prompt" (text or chat messages) and "completion" (text); fix it'
            )
        rows.append(row)
    if not rows:
        raise ConfigError(f"sft.path={path} holds no rows; add prompt/completion lines or set sft.steps=0")
    return rows


def fine_tune_in_child(cfg: Config, model_path: Path, rows: list[dict[str, Any]], out: Path) -> list[float]:
    """``fine_tune`` in a child process started with the trainer ranks' malloc settings (``CPU_MALLOC_ENV``:
    glibc reads them at start-up; without them every step faults its vocab-wide logits in afresh, which costs
    more than the step's arithmetic on this box; a child whose batches are long starts itself again under the
    long rows' settings, ``restart_for_long_rows``). Its losses come back in ``out/sft_losses.json``."""
    import os
    import subprocess
    import sys

    from relayrl.config import CPU_MALLOC_ENV

    job = {
        "model_path": str(model_path),
        "rows": rows,
        "out": str(out),
        "dtype": cfg.model.dtype,
        "chat_template": cfg.data.chat_template,
        "seed": cfg.run.seed,
        "steps": cfg.sft.steps,
        "batch_size": cfg.sft.batch_size,
        "lr": cfg.sft.lr,
        "env": [cfg.env.name, cfg.env.kwargs] if cfg.env.name else None,
        "activation_checkpointing": cfg.trainer.activation_checkpointing,
        "logits_chunk": cfg.trainer.logits_chunk,
    }
    (out / "sft_job.json").write_text(json.dumps(job))
    env = {**os.environ, **CPU_MALLOC_ENV}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "relayrl.trainer.sft", str(out / "sft_job.json")], env=env)
    (out / "sft_job.json").unlink()
    if done.returncode != 0:
        raise RuntimeError(f"sft: the fine-tuning process exited with status {done.returncode} (its error is above)")
    losses = json.loads((out / SUMMARY).read_text())["losses"]
    summary = {"losses": losses, "examples": len(rows), "seconds": time.perf_counter() - t0}
    (out / SUMMARY).write_text(json.dumps(summary))
    return losses


def fine_tune(job: dict[str, Any]) -> list[float]:
    """Train ``job["steps"]`` steps on ``job["rows"]`` and save the model and tokenizer into ``job["out"]``; the
    step losses. Run in the child of ``fine_tune_in_child``, which it may start again (``restart_for_long_rows``)
    once the rows are tokenized, before the model loads."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from relayrl.data import chat_formatter

    torch.manual_seed(job["seed"])
    tokenizer = AutoTokenizer.from_pretrained(job["model_path"])
    if job.get("env"):
        env_name, env_kwargs = job["env"]
        examples = env_examples(tokenizer, env_name, env_kwargs, job["rows"])
    else:
        fmt = chat_formatter(tokenizer, job["chat_template"])
        examples = [encode(tokenizer, fmt(r["prompt"]), r["completion"]) for r in job["rows"]]
    tokens = max(len(ids) for ids, _ in examples) * job["batch_size"]
    restart_for_long_rows(AutoConfig.from_pretrained(job["model_path"]).to_dict(), tokens)
    model = AutoModelForCausalLM.from_pretrained(job["model_path"], dtype=getattr(torch, job["dtype"]))
    _memory_plan(model, job, tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=job["lr"], weight_decay=0.0)
    losses, steps = [], job["steps"]
    for step, batch in enumerate(batches(examples, job["batch_size"], steps, job["seed"]), 1):
        ids, labels, mask = collate(batch, tokenizer.pad_token_id or 0)
        loss = sft_loss(model, ids, labels, mask, job.get("logits_chunk", 1024))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 10 == 0 or step == steps:
            logger.info("relayrl: sft step %d/%d loss %.3f", step, steps, losses[-1])
    model.save_pretrained(job["out"])
    tokenizer.save_pretrained(job["out"])
    return losses


def restart_for_long_rows(model_config: dict[str, Any], tokens: int) -> None:
    """The SFT child starts under the heap settings (``CPU_MALLOC_ENV``). When its batches of ``tokens`` tokens are
    long (``recompute.long_rows``, as for a trainer rank), it starts itself again under ``malloc_env(long_rows=True)``
    (glibc reads them only at start-up), so a long row's activations cannot ratchet the heap
    (``config.runtime.LONG_ROWS_MALLOC_ENV``). A process already under its settings goes on."""
    import os
    import sys

    from relayrl.config import CPU_MALLOC_ENV, malloc_env
    from relayrl.trainer import recompute

    memory = recompute.rank_memory_bytes(torch.device("cpu"), 1)
    env = malloc_env(recompute.long_rows(model_config, tokens, memory))
    if all(os.environ.get(k) == v for k, v in env.items()):
        return
    logger.info("relayrl: sft batches of %d tokens are long; restarting under %s", tokens, env)
    kept = {k: v for k, v in os.environ.items() if k not in CPU_MALLOC_ENV}
    os.execve(sys.executable, [sys.executable, "-m", "relayrl.trainer.sft", *sys.argv[1:]], {**kept, **env})


def _memory_plan(model: torch.nn.Module, job: dict[str, Any], tokens: int) -> None:
    """The trainer's memory settings on the SFT model: its head scores in chunks (``head.py``), and
    ``trainer.activation_checkpointing`` applies as on the policy (``auto`` sized at a batch's ``tokens``)."""
    from relayrl.trainer import head, recompute

    head.install(head.lm_head(model))
    config = cast(Any, model).config.to_dict()
    memory = recompute.rank_memory_bytes(torch.device("cpu"), 1)
    every = recompute.resolve_every(job.get("activation_checkpointing", "auto"), config, tokens, memory)
    recompute.checkpoint_layers(model, every)


def sft_loss(
    model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, chunk: int
) -> torch.Tensor:
    """Token-mean cross-entropy of ``labels`` [B, L] (``IGNORE`` skipped), the logits of position t scoring
    label t + 1, through the chunked head (no [B, L, V] logits); equal to HF's ``labels=`` loss."""
    from relayrl.trainer import head

    targets = labels[:, 1:]
    valid = targets != IGNORE
    keep = torch.arange(ids.shape[1] - 1)
    with head.scoring(model, head.Request(targets.clamp(min=0), 1.0, chunk)):
        logprobs = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep).logits[..., 0]
    return -(logprobs * valid).sum() / valid.sum().clamp(min=1)


def env_examples(tokenizer: Any, name: str, kwargs: dict[str, Any], rows: list[dict[str, Any]]) -> list[Example]:
    """One example per model turn of each row's demonstration (``env.demonstration(sample)``), replayed through
    a fresh environment: each turn's prompt is the episode so far exactly as the environment renders it in a
    run (its tools in the chat template, earlier calls and their results), so the warm start teaches the format
    the episodes will use."""
    import asyncio
    import inspect

    from relayrl.envs import env_factory

    make_env, examples = env_factory(name, kwargs), []
    for row in rows:
        env: Any = make_env()
        if hasattr(env, "setup"):
            env.setup(tokenizer)
        sample = {**row["sample"], "prompt": ""}
        text = env.reset(sample)
        for turn in env.demonstration(sample):
            examples.append(encode(tokenizer, text, turn))
            result = env.step(turn)
            obs, _, done = asyncio.run(_settled(result)) if inspect.isawaitable(result) else result
            if done:
                break
            text += turn + obs
    return examples


async def _settled(result: Any) -> Any:
    return await result


def encode(tokenizer: Any, prompt: str, completion: str) -> Example:
    """(token ids, labels): the formatted prompt then the completion and EOS; labels only on the latter."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    target = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + target, [IGNORE] * len(prompt_ids) + target


def batches(examples: list[Example], size: int, steps: int, seed: int) -> Iterator[list[Example]]:
    """``steps`` batches of ``size`` examples, in epochs each shuffled with ``seed``."""
    rng, order = random.Random(f"relayrl-sft/{seed}"), list[int]()
    for _ in range(steps):
        batch: list[Example] = []
        while len(batch) < size:
            if not order:
                order = list(range(len(examples)))
                rng.shuffle(order)
            batch.append(examples[order.pop()])
        yield batch


def collate(batch: list[Example], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded (input ids, labels, attention mask) [B, L]."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id)
    labels = torch.full((len(batch), width), IGNORE)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        ids[i, : len(x)], labels[i, : len(y)], mask[i, : len(x)] = torch.tensor(x), torch.tensor(y), 1
    return ids, labels, mask


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(len(xs), 1)


if __name__ == "__main__":  # the child of ``fine_tune_in_child``
    import sys

    from relayrl.logs import show_on_console

    show_on_console()
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(spec["out"], SUMMARY).write_text(json.dumps({"losses": fine_tune(spec)}))
