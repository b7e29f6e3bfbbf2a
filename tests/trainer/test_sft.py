"""The supervised warm start (``sft``): worked examples, TRL's prompt-completion jsonl, and a fine-tune that
learns its rows, writes a model vLLM and the trainer can load, and is reused on resume."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from relayrl.config import ConfigError, DataConfig, load_config
from relayrl.data import load_task, worked_examples
from relayrl.rewards.tasks import answer_tag_correct, countdown_correct, think_answer_format
from relayrl.trainer.sft import read_prompt_completion, warm_start


@pytest.mark.parametrize("task", ["wordproblem", "countdown"])
def test_worked_examples_are_fresh_problems_with_answers_the_rewards_pay_for(task):
    cfg = DataConfig(task=task, num_prompts=64)
    rows = worked_examples(cfg, 16)
    training = {r["question"] for r in load_task(cfg)}
    assert len(rows) == 16 and not {r["prompt"] for r in rows} & training
    completions = [r["completion"] for r in rows]
    assert think_answer_format([""] * 16, completions) == [1.0] * 16
    if task == "wordproblem":
        answers = [c.rsplit("<answer>", 1)[1].split("</answer>")[0].strip() for c in completions]
        assert answer_tag_correct([""] * 16, completions, answers) == [1.0] * 16
    else:
        nums = [json.loads(r["prompt"].split("numbers ")[1].split("]")[0] + "]") for r in rows]
        targets = [int(r["prompt"].split("equals ")[1].split(".")[0]) for r in rows]
        assert countdown_correct([""] * 16, completions, nums=nums, target=targets) == [1.0] * 16


def test_worked_examples_need_a_task_with_solutions():
    with pytest.raises(ConfigError, match=r"sft\.path"):
        worked_examples(DataConfig(task="arith"), 4)


def test_prompt_completion_jsonl_names_a_bad_line(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text('{"prompt": "1+1?", "completion": "2"}\n\n{"prompt": "2+2?"}\n')
    with pytest.raises(ConfigError, match="line 3 needs"):
        read_prompt_completion(path)
    path.write_text('{"prompt": [{"role": "user", "content": "1+1?"}], "completion": "2"}\nnot json\n')
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        read_prompt_completion(path)


def test_negative_steps_and_missing_file_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"sft\.steps=-1"):
        load_config("grpo_tiny", ["sft.steps=-1"])
    with pytest.raises(ConfigError, match=r"sft\.path="):
        load_config("grpo_tiny", [f"sft.path={tmp_path / 'none.jsonl'}"])


def test_warm_start_learns_its_rows_and_is_reused(tiny_llama, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relayrl.trainer.sft import encode

    rows = [{"prompt": f"say {w}", "completion": f"{w} {w} {w}"} for w in ("apple", "river", "stone", "cloud")]
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(
        "grpo_tiny",
        [f"model.path={tiny_llama}", f"sft.path={path}", "sft.steps=30", "sft.batch_size=4", "sft.lr=1e-3"],
    )
    out = warm_start(cfg, tiny_llama, tmp_path / "sft")
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
    losses = json.loads((out / "sft.json").read_text())["losses"]
    assert len(losses) == 30 and sum(losses[-5:]) < 0.5 * sum(losses[:5])

    def completion_nll(model_dir) -> float:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "say river"}], tokenize=False, add_generation_prompt=True
        )
        ids, labels = encode(tok, str(prompt), "river river river")
        with torch.no_grad():
            return float(model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss)

    assert completion_nll(out) < 0.5 * completion_nll(tiny_llama)
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert warm_start(cfg, tiny_llama, out) == out and (out / "model.safetensors").stat().st_mtime_ns == mtime


def test_no_fresh_problem_left_is_a_config_error():
    with pytest.raises(ConfigError, match=r"raise data\.max_operand or lower data\.num_prompts"):
        worked_examples(DataConfig(task="countdown", ops=[1], max_operand=3), 8)


def test_the_chunked_loss_equals_hf_cross_entropy_with_and_without_checkpointing(tiny_llama):
    """The SFT loss through the chunked head (and every layer checkpointed) against HF's ``labels=`` loss
    on full logits: the same value and gradients (fp32)."""
    from transformers import AutoModelForCausalLM

    from relayrl.trainer import head
    from relayrl.trainer.recompute import checkpoint_layers
    from relayrl.trainer.sft import IGNORE, collate, sft_loss

    batch = [([5, 9, 3, 7, 8], [IGNORE, IGNORE, 3, 7, 8]), ([4, 6, 2], [IGNORE, 6, 2])]
    ids, labels, mask = collate(batch, pad_id=0)
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32)
    expected = ref(input_ids=ids, attention_mask=mask, labels=labels).loss
    expected.backward()
    for every in (0, 1):
        model = AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32)
        head.install(model.get_output_embeddings())
        checkpoint_layers(model, every)
        loss = sft_loss(model, ids, labels, mask, chunk=2)
        loss.backward()
        assert abs(float(loss) - float(expected)) < 1e-6
        for (name, a), b in zip(ref.named_parameters(), model.parameters()):
            torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=name)


SMOLLM2 = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3}
SMOLLM2 |= {"intermediate_size": 1536}  # 1.27 MB of activations a token: long past ~5.1k tokens in 24 GiB


def test_sft_child_with_long_batches_starts_again_under_the_long_rows_malloc(monkeypatch):
    """The SFT child starts under the heap settings; batches of long rows make it exec itself under
    ``LONG_ROWS_MALLOC_ENV`` (the heap settings dropped), once: short batches, or a process already under the long
    rows' settings, go on."""
    from relayrl.config import CPU_MALLOC_ENV, LONG_ROWS_MALLOC_ENV, runtime
    from relayrl.trainer import sft

    monkeypatch.setattr(runtime, "has_cuda", lambda: False)
    execs: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr("os.execve", lambda exe, argv, env: execs.append((exe, argv, env)))
    monkeypatch.setattr("relayrl.trainer.recompute.rank_memory_bytes", lambda device, ranks: 24 << 30)
    monkeypatch.setattr("sys.argv", ["sft.py", "/tmp/job.json"])
    for key, value in CPU_MALLOC_ENV.items():
        monkeypatch.setenv(key, value)
    sft.restart_for_long_rows(SMOLLM2, 2048)  # 2.6 GB of activations: short
    assert execs == []
    sft.restart_for_long_rows(SMOLLM2, 8192)  # 10.4 GB, over a quarter of 24 GB: long
    (exe, argv, env) = execs.pop()
    assert exe == sys.executable and argv[1:] == ["-m", "relayrl.trainer.sft", "/tmp/job.json"]
    assert {k: env.get(k) for k in CPU_MALLOC_ENV} == {**dict.fromkeys(CPU_MALLOC_ENV), **LONG_ROWS_MALLOC_ENV}
    for key in CPU_MALLOC_ENV:
        monkeypatch.delenv(key)
    for key, value in LONG_ROWS_MALLOC_ENV.items():
        monkeypatch.setenv(key, value)
    sft.restart_for_long_rows(SMOLLM2, 8192)  # already restarted: it goes on
    assert execs == []
