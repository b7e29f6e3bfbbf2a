"""Step-time breakdown and completions/s of relayrl's sync GRPO loop vs a plain HF-generate GRPO loop.

Both run in this one process tree on the same box, same model, same settings (grpo_arith: 4 prompts x
G=8 = 32 completions per step, <= 32 new tokens, temperature 1.0, AdamW, PPO-clip loss):

* relayrl: the real system (Ray controller, vLLM rollout actor, FSDP2 trainer rank, shm weight sync).
* baseline: one Python process, ``model.generate`` (HF, KV cache, batched) -> reward -> GRPO advantages ->
  one forward/backward over the batch -> AdamW; no weight sync needed (same model object).

The first step of each is warm-up and excluded. Usage::

    .venv/bin/python bench/sync_step.py [--steps 4] [--model smollm2] [key=value overrides ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

STAGES = {"generate": "timing/generate", "score": "timing/reward", "train": "timing/train", "sync": "timing/sync"}
"""Column of this table -> the schema metric it reads (relayrl/monitor/schema.py)."""


def run_relayrl(steps: int, overrides: list[str]) -> dict[str, float]:
    import ray

    from relayrl.config import load_config
    from relayrl.controller import train

    cfg = load_config("grpo_arith", [f"run.steps={steps}", "run.output_dir=/tmp/relayrl-bench",
                                     "logging.wandb=disabled", "run.save_final=false", *overrides])
    result = train(cfg)
    ray.shutdown()
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    out = {f"{s}_s": statistics.mean(r[key] for r in rows) for s, key in STAGES.items()}
    out["step_s"] = statistics.mean(r["timing/step"] for r in rows)
    out["completions_per_s"] = sum(r["rollout/completions"] for r in rows) / sum(r["timing/step"] for r in rows)
    return out


def run_baseline(steps: int, model_name: str, prompts_per_step: int = 4, group: int = 8,
                 max_tokens: int = 32) -> dict[str, float]:
    """A plain synchronous GRPO loop with transformers' generate, the way a first prototype is written."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relayrl.config import DataConfig
    from relayrl.data import load_task
    from relayrl.data.sampler import PromptSampler, chat_formatter
    from relayrl.models import resolve_model
    from relayrl.rewards.builtin import last_number_correct
    from relayrl.algorithms.advantages import grpo_advantages
    from relayrl.algorithms.logprobs import token_logprobs
    from relayrl.algorithms.losses import masked_token_sum, ppo_clip_loss

    path = resolve_model(model_name)
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    sampler = PromptSampler(load_task(DataConfig()), prompts_per_step, 0, chat_formatter(tok, True))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = sampler.next_batch()
        enc = tok([p.prompt for p in batch], return_tensors="pt", padding=True, add_special_tokens=False)
        model.eval()
        with torch.no_grad():
            seqs = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                  max_new_tokens=max_tokens, num_return_sequences=group,
                                  pad_token_id=tok.pad_token_id or tok.eos_token_id)
        t1 = time.perf_counter()
        P = enc["input_ids"].shape[1]
        texts = tok.batch_decode(seqs[:, P:], skip_special_tokens=True)
        answers = [p.columns["answer"] for p in batch for _ in range(group)]
        rewards = torch.tensor(last_number_correct([], texts, answer=answers))
        adv = grpo_advantages(rewards, torch.arange(len(batch)).repeat_interleave(group))
        t2 = time.perf_counter()
        attn = (seqs != (tok.pad_token_id or -1)).long()
        attn[:, :P] = enc["attention_mask"].repeat_interleave(group, 0)
        mask = attn[:, 1:].clone().float()
        mask[:, : P - 1] = 0
        for i in range(0, len(seqs), 8):  # same micro-batch size as relayrl's default
            sl = slice(i, i + 8)
            lp = token_logprobs(model(input_ids=seqs[sl], attention_mask=attn[sl], use_cache=False).logits, seqs[sl])
            loss, _ = ppo_clip_loss(lp, lp.detach(), adv[sl], mask[sl], 0.2)
            (masked_token_sum(loss, mask[sl]) / mask.sum()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        times.append({"generate_s": t1 - t0, "score_s": t2 - t1, "train_s": t3 - t2, "step_s": t3 - t0,
                      "completions": len(seqs)})
    rows = times[1:]
    out = {k: statistics.mean(r[k] for r in rows) for k in ("generate_s", "score_s", "train_s", "step_s")}
    out["sync_s"] = 0.0
    out["completions_per_s"] = sum(r["completions"] for r in rows) / sum(r["step_s"] for r in rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="steps per system, the first is warm-up")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("overrides", nargs="*", help="relayrl overrides, e.g. rollout.max_tokens=32")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    ours = run_relayrl(args.steps, [f"model.path={args.model}", *args.overrides])
    base = run_baseline(args.steps, args.model)
    print(f"\n{'seconds per step':<22}{'relayrl':>10}{'HF loop':>10}")
    for key in ("generate_s", "score_s", "train_s", "sync_s", "step_s"):
        print(f"{key:<22}{ours[key]:>10.2f}{base[key]:>10.2f}")
    print(f"{'completions/s':<22}{ours['completions_per_s']:>10.2f}{base['completions_per_s']:>10.2f}")
    print(f"ratio relayrl / HF-generate loop: {ours['completions_per_s'] / base['completions_per_s']:.2f}x")


if __name__ == "__main__":
    main()
