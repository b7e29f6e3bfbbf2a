"""What ``relayrl eval`` scores: a bounded held-out split that no training row holds, and its progress."""

import pytest

from relayrl.config import DataConfig, load_config
from relayrl.data import make_arith_rows
from relayrl.data.eval_split import eval_rows, heldout_arith_rows
from relayrl.monitor.evaluate import EvalProgress


def _operands(row):
    a, b = row["question"].split("?")[0].removeprefix("What is ").split(" + ")
    return int(a), int(b)


@pytest.mark.parametrize(
    "max_operand, num_prompts, data_seed, eval_seed",
    [
        (9, 4096, 0, 1),  # the README's task: training holds all 100 single-digit pairs
        (9, 40, 3, 7),  # a few training rows: unseen single-digit pairs exist and come first
        (50, 4096, 0, 1),  # ~79% of 51^2 pairs seen
    ],
)
def test_heldout_arith_never_holds_a_training_problem(max_operand, num_prompts, data_seed, eval_seed):
    data = DataConfig(num_prompts=num_prompts, max_operand=max_operand, seed=data_seed)
    train = {r["question"] for r in make_arith_rows(num_prompts, max_operand, data_seed)}
    rows = heldout_arith_rows(data, 64, eval_seed)
    assert len(rows) == 64 and len({r["question"] for r in rows}) == 64  # bounded, distinct
    assert not train & {r["question"] for r in rows}  # disjoint
    assert all(r["answer"] == str(sum(_operands(r))) for r in rows)
    assert rows == heldout_arith_rows(data, 64, eval_seed)  # reproducible
    inside = [r for r in rows if max(_operands(r)) <= max_operand]
    unseen_inside = (max_operand + 1) ** 2 - len(train)
    assert len(inside) == min(64, unseen_inside)  # in-range pairs first


def test_single_digit_heldout_lies_just_outside_the_trained_range():
    rows = heldout_arith_rows(DataConfig(num_prompts=4096, max_operand=9), 64, 1)
    assert all(max(_operands(r)) in range(10, 20) and min(_operands(r)) >= 0 for r in rows)


def test_eval_rows_default_is_64_heldout_prompts_and_data_split_is_training_order():
    cfg = load_config("grpo_arith", [])
    rows, where = eval_rows(cfg, cfg.eval.num_prompts)
    assert len(rows) == 64 and where == "held-out: 64 arith problems no training row holds"
    rows, where = eval_rows(load_config("grpo_arith", ["eval.split=data"]), 5)
    assert rows == make_arith_rows(4096, 9, 0)[:5] and where == "data.task=arith"


def test_a_file_task_says_it_has_no_heldout_split(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text("".join(f'{{"question": "q{i}", "answer": "{i}"}}\n' for i in range(3)))
    rows, where = eval_rows(load_config("grpo_tiny", ["data.task=jsonl", f"data.path={path}"]), 0)
    assert [r["answer"] for r in rows] == ["0", "1", "2"]  # 0: every row
    assert where.startswith(f"data.task=jsonl data.path={path} (this task has no held-out split")


def test_progress_lines_count_prompts_and_end_with_no_time_left(capsys):
    with EvalProgress(64) as progress:  # captured output is not a terminal: plain lines
        for _ in range(4):
            progress.advance(16)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" | ")[0] for line in lines] == [f"eval {k}/64 prompts" for k in (16, 32, 48, 64)]
    assert all("elapsed | ETA " in line for line in lines) and lines[-1].endswith("ETA 0:00")
