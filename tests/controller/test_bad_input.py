"""Bad rewards or models stop `train` with one line before Ray or any actor starts."""

from __future__ import annotations

import json
import re

import pytest

from relayrl.config import ConfigError, load_config
from relayrl.controller import driver
from relayrl.controller.driver import train


@pytest.mark.parametrize(
    "override, expected",
    [
        ("rewards=[{fn: no_such_pkg.rewards:f}]", "rewards: reward 'no_such_pkg.rewards:f': cannot import module"),
        ("rewards=[{fn: relayrl.rewards.builtin:nope}]", "has no attribute 'nope'"),
        ("model.path=/no/such/model", "model.path"),
    ],
)
def test_bad_input_fails_before_ray_starts(override, expected, tmp_path, monkeypatch):
    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before the bad input was reported")

    monkeypatch.setattr(driver, "start_ray", no_ray)
    cfg = load_config("grpo_tiny", [override, f"run.output_dir={tmp_path}"])
    with pytest.raises(ConfigError) as err:
        train(cfg)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not any(tmp_path.iterdir()), "no run directory should be created for a config error"


@pytest.mark.parametrize(
    "make_override, expected",
    [
        (lambda d, m: [f"model.path={m}", "model.max_model_len=100000"], "exceeds the model's context"),
        (lambda d, m: [f"model.path={m}", "rollout.max_tokens=256"], "leaves no room for the prompt"),
        (lambda d, m: [f"model.path={m}", "rollout.kv_cache_gb=0.000001"], "is less than one model.max_model_len"),
        (lambda d, m: [f"model.path={m}", "data.task=jsonl", f"data.path={d / 'empty.jsonl'}"], "has no rows"),
        (lambda d, m: [f"model.path={m}", "data.task=jsonl", f"data.path={d / 'bad.jsonl'}"], "bad.jsonl:2"),
        (
            lambda d, m: [f"model.path={m}", "data.task=jsonl", f"data.path={d / 'budget.jsonl'}"],
            "budget.jsonl row 1: its max_tokens column is 0, not an integer >= 1",
        ),
    ],
)
def test_context_and_dataset_are_checked_before_ray(make_override, expected, tmp_path, tiny_llama, monkeypatch):
    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before the bad input was reported")

    data = tmp_path / "data"
    data.mkdir()
    (data / "empty.jsonl").write_text("")
    (data / "bad.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n{"question": \n')
    budgets = [{"question": f"{i}+1?", "answer": str(i + 1), "max_tokens": budget} for i, budget in enumerate((8, 0))]
    (data / "budget.jsonl").write_text("".join(json.dumps(r) + "\n" for r in budgets))
    monkeypatch.setattr(driver, "start_ray", no_ray)
    cfg = load_config("grpo_tiny", [*make_override(data, tiny_llama), f"run.output_dir={tmp_path / 'runs'}"])
    with pytest.raises(ConfigError) as err:
        train(cfg)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


def _no_ray(monkeypatch) -> None:
    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before the bad input was reported")

    monkeypatch.setattr(driver, "start_ray", no_ray)


def test_a_prompt_too_long_for_the_context_names_its_row_before_ray(tmp_path, tiny_llama, monkeypatch):
    """One long row among short ones (not the first, not the last): the error names it and the fix. The same
    file with a context that fits passes the check (Ray is then reached)."""
    _no_ray(monkeypatch)
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)]
    rows[3]["question"] = "What is " + " + ".join(["1"] * 80) + "?"
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = [f"model.path={tiny_llama}", "data.task=jsonl", f"data.path={data}", f"run.output_dir={tmp_path / 'runs'}"]
    with pytest.raises(ConfigError) as err:
        train(load_config("grpo_tiny", [*base, "model.max_model_len=128", "rollout.max_tokens=16"]))
    message = str(err.value)
    assert f"{data} row 3 " in message and "\n" not in message
    tokens = int(re.search(r"\.\.\.\) is (\d+) prompt tokens", message).group(1))
    assert tokens > 128 - 16 and f"needs model.max_model_len>={tokens + 16} (now 128)" in message
    assert not (tmp_path / "runs").exists()
    with pytest.raises(AssertionError, match="Ray was started"):  # every row fits: the check passes
        train(load_config("grpo_tiny", [*base, f"model.max_model_len={tokens + 16}", "rollout.max_tokens=16"]))


def _budget_files(tmp_path) -> tuple[str, str]:
    """A training file whose rows are fine, and a held-out file whose second row has a budget of 0."""
    train_rows = [{"question": f"{i}+1?", "answer": str(i + 1)} for i in range(4)]
    held_rows = [{"question": f"{i}+2?", "answer": str(i + 2), "max_tokens": b} for i, b in enumerate((8, 0))]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_rows))
    return str(tmp_path / "train.jsonl"), str(tmp_path / "held.jsonl")


def test_heldout_rows_of_eval_every_are_checked_before_ray(tmp_path, tiny_llama, monkeypatch):
    """eval.every evaluates data.eval_path's rows during training: a bad budget there is refused before Ray,
    naming the held-out file and its row. Without eval.every those rows are not used, and Ray is reached."""
    _no_ray(monkeypatch)
    train_file, held_file = _budget_files(tmp_path)
    base = [f"model.path={tiny_llama}", "data.task=jsonl", f"data.path={train_file}", f"data.eval_path={held_file}"]
    base.append(f"run.output_dir={tmp_path / 'runs'}")
    with pytest.raises(ConfigError) as err:
        train(load_config("grpo_tiny", [*base, "eval.every=1"]))
    message = str(err.value)
    assert message.startswith(f"held-out: data.eval_path={held_file} row 1: its max_tokens column is 0")
    assert "\n" not in message and not (tmp_path / "runs").exists()
    with pytest.raises(AssertionError, match="Ray was started"):
        train(load_config("grpo_tiny", base))


def test_relayrl_eval_checks_the_rows_it_scores_before_any_engine(tmp_path, tiny_llama, monkeypatch):
    """``relayrl eval`` on the held-out split refuses the bad budget before it generates."""
    from relayrl.monitor import evaluate

    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was started before the bad row was reported")

    monkeypatch.setattr(evaluate, "generate", no_engine)
    train_file, held_file = _budget_files(tmp_path)
    overrides = [f"model.path={tiny_llama}", "data.task=jsonl", f"data.path={train_file}"]
    cfg = load_config("grpo_tiny", [*overrides, f"data.eval_path={held_file}", "eval.split=heldout"])
    with pytest.raises(ConfigError, match=r"^held-out: data.eval_path=.*held.jsonl row 1: its max_tokens column is 0"):
        evaluate.evaluate(cfg)


def test_generated_prompts_are_checked_with_the_chat_template(tmp_path, tiny_llama, monkeypatch):
    """arith prompts are short, but the chat template's tokens count: a context that holds the question
    alone but not the formatted prompt is refused."""
    _no_ray(monkeypatch)
    from transformers import AutoTokenizer

    from relayrl.data import chat_formatter, make_arith_rows

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    questions = [r["question"] for r in make_arith_rows(64, 99, 0)]
    bare = max(len(ids) for ids in tokenizer(questions)["input_ids"])
    formatted = tokenizer([chat_formatter(tokenizer, True)(q) for q in questions])["input_ids"]
    assert min(map(len, formatted)) > bare  # the context holds every bare question
    cfg = load_config(
        "grpo_tiny",
        [
            f"model.path={tiny_llama}",
            "data.num_prompts=64",
            "data.max_operand=99",
            "rollout.max_tokens=8",
            f"model.max_model_len={bare + 8}",
            f"run.output_dir={tmp_path / 'runs'}",
        ],
    )
    with pytest.raises(ConfigError, match=r"arith row \d+ .* tokens; with rollout.max_tokens=8"):
        train(cfg)


@pytest.mark.parametrize(
    "raised, status", [(KeyboardInterrupt(), "interrupted"), (RuntimeError("the raylet did not start"), "failed")]
)
def test_a_run_stopped_while_ray_starts_says_so_in_status_json(raised, status, tmp_path, tiny_llama, monkeypatch):
    """Ctrl-C or an error inside ray.init (the run directory exists by then) ends the run's status.json as
    interrupted or failed, never left at running."""

    def stopped(*args, **kwargs):
        raise raised

    monkeypatch.setattr(driver, "start_ray", stopped)
    cfg = load_config("grpo_tiny", [f"model.path={tiny_llama}", f"run.output_dir={tmp_path}", "logging.wandb=disabled"])
    with pytest.raises(type(raised)):
        train(cfg)
    (run,) = tmp_path.glob("grpo_tiny-*")
    record = json.loads((run / "status.json").read_text())
    assert record["status"] == status and record["steps_done"] == 0
    if status == "failed":
        assert "the raylet did not start" in record["error"]


def test_a_pipelined_engine_needs_kv_cache_for_its_own_layers_only():
    """tiny-llama's shape, fp32: K and V of 2 layers x 1 KV head x 64 dims x 4 bytes = 1024 B a token, 256 KiB a
    256-token sequence; with rollout.pp_size=2 a worker holds one layer: 512 B a token, 128 KiB. A 0.0002 GB
    (~210 KB) cache holds one sequence on a pipelined worker only."""
    from relayrl.preflight import check_kv_cache

    shape = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "hidden_size": 128}
    base = ["model.max_model_len=256", "rollout.kv_cache_gb=0.0002", "model.dtype=float32"]
    with pytest.raises(ConfigError, match=r"is less than one model\.max_model_len=256 sequence"):
        check_kv_cache(load_config("grpo_tiny", base), shape)
    check_kv_cache(load_config("grpo_tiny", [*base, "rollout.pp_size=2", "rollout.enforce_eager=false"]), shape)
