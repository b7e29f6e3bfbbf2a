"""Users' own data through HF ``datasets`` (``data.task=hf``): local json/jsonl/parquet/csv files and
save_to_disk directories, a column mapping, chat messages as prompts, a held-out split, one-line errors."""

from __future__ import annotations

import json
import socket

import datasets
import pytest

from relayrl.config import ConfigError, DataConfig, load_config
from relayrl.data import load_heldout, load_hf, load_task, split_heldout

ROWS = [{"problem": "1 + 1?", "solution": "#### 2", "id": 0}, {"problem": "2 + 3?", "solution": "5", "id": 1}]
EXPECTED = [
    {"question": "1 + 1?", "answer": "2", "solution": "#### 2", "id": 0},
    {"question": "2 + 3?", "answer": "5", "id": 1},
]


def write(tmp_path, fmt: str, rows=ROWS):
    """``rows`` written as ``fmt`` (a file suffix, or ``disk`` / ``diskdict`` for save_to_disk)."""
    table = datasets.Dataset.from_list(rows)
    path = tmp_path / f"train{fmt}"
    if fmt == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == ".json":
        table.to_json(path, lines=False)
    elif fmt == ".parquet":
        table.to_parquet(path)
    elif fmt == ".csv":
        table.to_csv(path, index=False)
    elif fmt == "disk":
        table.save_to_disk(path)
    else:
        datasets.DatasetDict({"train": table, "test": table.select([1])}).save_to_disk(path)
    return path


@pytest.mark.parametrize("fmt", [".jsonl", ".json", ".parquet", ".csv", "disk", "diskdict"])
def test_every_local_format_loads_with_the_column_mapping_and_no_network(tmp_path, monkeypatch, fmt):
    path = write(tmp_path, fmt)

    def no_network(*args, **kwargs):
        raise AssertionError("the hf loader opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    rows = load_hf(path, prompt_key="problem", answer_key="solution")
    # the GSM8K '#### 2' is split as data.task=jsonl splits it; other columns pass through
    assert [{**r, "id": int(r["id"])} for r in rows] == EXPECTED


def test_a_saved_dataset_dict_reads_the_named_split(tmp_path):
    path = write(tmp_path, "diskdict")
    assert [r["question"] for r in load_hf(path, "problem", "solution", split="test")] == ["2 + 3?"]
    with pytest.raises(ConfigError, match=r"no split 'dev' \(has: train, test\); set data.split"):
        load_hf(path, "problem", "solution", split="dev")


def test_chat_messages_are_prompts(tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
    path = write(tmp_path, ".parquet", [{"messages": messages, "answer": 4}])
    assert load_hf(path, prompt_key="messages") == [{"question": messages, "answer": "4"}]
    bad = write(tmp_path, ".jsonl", [{"messages": [*messages, {"role": "assistant", "content": "4"}], "answer": 4}])
    with pytest.raises(ConfigError, match="messages end with a 'assistant' turn; end each prompt with the user"):
        load_hf(bad, prompt_key="messages")
    cfg = DataConfig(task="hf", path=str(path), prompt_key="messages", chat_template=False)
    with pytest.raises(ConfigError, match=r"prompts are chat messages.*set data\.chat_template=true"):
        load_task(cfg)


def test_columns_are_copied_under_the_names_rewards_read(tmp_path):
    rows = load_hf(write(tmp_path, ".jsonl"), prompt_key="problem", answer_key=None, columns={"tests": "solution"})
    assert [(r["question"], r["tests"], r["solution"]) for r in rows] == [
        ("1 + 1?", "#### 2", "#### 2"),
        ("2 + 3?", "5", "5"),
    ]


def test_answer_key_null_loads_prompts_alone(tmp_path):
    rows = load_hf(write(tmp_path, ".csv"), prompt_key="problem", answer_key=None)
    assert [sorted(r) for r in rows] == [["id", "question", "solution"]] * 2


@pytest.mark.parametrize(
    "make, kwargs, expected",
    [
        (
            lambda p: write(p, ".jsonl"),
            {},
            (
                r"no column 'question', 'answer' \(has: problem, solution, id\); "
                r"set data.prompt_key / data.answer_key"
            ),
        ),
        (lambda p: write(p, ".csv"), {"prompt_key": "problem", "answer_key": "sol"}, r"no column 'sol'"),
        (
            lambda p: write(p, ".csv"),
            {"prompt_key": "problem", "answer_key": None, "columns": {"tests": "test_list"}},
            (
                r"no column 'test_list' \(has: problem, solution, id\); set data.prompt_key / data.answer_key / "
                r"data.columns"
            ),
        ),
        (lambda p: p / "nope.parquet", {}, "no such file or directory; point data.path"),
        (lambda p: (p / "a.txt").write_text("x") and p / "a.txt", {}, r"unknown file type '.txt'; use one of"),
        (lambda p: (p / "d").mkdir() or p / "d", {}, "a directory not written by save_to_disk"),
        (lambda p: (p / "b.parquet").write_text("not parquet") and p / "b.parquet", {}, "cannot read as parquet"),
        (lambda p: write(p, ".jsonl", [{"question": 3, "answer": 1}]), {}, "row 0: column 'question' holds int"),
        (lambda p: write(p, ".jsonl", [{"question": "q", "answer": None}]), {}, "row 0: column 'answer' is empty"),
        (
            lambda p: write(p, ".csv"),
            {"prompt_key": "problem", "answer_key": "solution", "split": "test"},
            "data.split=test applies to save_to_disk directories",
        ),
    ],
)
def test_bad_input_gives_one_line_config_errors(tmp_path, make, kwargs, expected):
    with pytest.raises(ConfigError, match=expected) as info:
        load_hf(make(tmp_path), **kwargs)
    assert "\n" not in str(info.value) and ";" in str(info.value)


def test_split_heldout_by_distinct_prompt():
    rows = [{"question": q} for q in "abcdeabcde"]  # 5 distinct prompts, each twice
    train, held = split_heldout(rows, 0.4, seed=0)  # round(5 * 0.4) = 2 prompts held out
    assert len({r["question"] for r in held}) == 2 and len(held) == 4 and len(train) == 6
    assert not {r["question"] for r in held} & {r["question"] for r in train}
    assert split_heldout(rows, 0.4, seed=0) == (train, held)
    assert split_heldout(rows, 0.0, seed=0) == (rows, [])
    with pytest.raises(ConfigError, match=r"holds out 0; it must leave at least one prompt on each side"):
        split_heldout(rows, 0.05, seed=0)  # round(0.25) = 0


def _heldout(cfg: DataConfig, n: int, seed: int) -> tuple[list[dict], str]:
    held = load_heldout(cfg, n, seed=seed)
    assert held is not None
    return held


def test_heldout_fraction_keeps_prompts_out_of_training_and_eval_scores_them(tmp_path):
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(10)]
    path = write(tmp_path, ".jsonl", rows)
    for task in ("jsonl", "hf"):
        cfg = DataConfig(task=task, path=str(path), heldout_fraction=0.3)
        train, (held, where) = load_task(cfg), _heldout(cfg, 0, seed=1)
        assert len(train) == 7 and len(held) == 3 and sorted(train + held, key=lambda r: int(r["answer"])) == rows
        assert where == f"held-out: data.heldout_fraction=0.3 of {path}"
    assert load_heldout(DataConfig(task="hf", path=str(path)), 0, seed=1) is None


def test_eval_path_and_eval_split_name_the_heldout_data(tmp_path):
    path, test = write(tmp_path, "diskdict"), write(tmp_path, ".csv", [{"problem": "9 + 9?", "solution": "18"}])
    cfg = DataConfig(task="hf", path=str(path), prompt_key="problem", answer_key="solution", eval_split="test")
    rows, where = _heldout(cfg, 0, seed=1)
    assert [r["question"] for r in rows] == ["2 + 3?"] and where == f"held-out: data.eval_path={path} split test"
    cfg = DataConfig(task="hf", path=str(path), prompt_key="problem", answer_key="solution", eval_path=str(test))
    assert [r["answer"] for r in _heldout(cfg, 0, seed=1)[0]] == ["18"]


def test_generated_heldout_problems_are_not_training_problems():
    cfg = DataConfig(task="countdown", num_prompts=50, max_operand=5)
    held, where = _heldout(cfg, 20, seed=1)
    assert len(held) == 20 and where == "held-out: 20 countdown problems no training row holds"
    assert not {r["question"] for r in held} & {r["question"] for r in load_task(cfg)}


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["data.task=hf"], "data.task=hf needs data.path"),
        (
            ["data.task=csv"],
            (
                "data.task='csv' is not supported; "
                "use one of arith, multiply, countdown, wordproblem, facts, count, jsonl, hf"
            ),
        ),
        (["data.prompt_key=problem"], "data.prompt_key applies to data.task=hf"),
        (["data.heldout_fraction=0.1"], "data.heldout_fraction / data.eval_path apply to file tasks"),
        (["data.eval_path=/nonexistent"], "data.eval_path=/nonexistent does not exist"),
    ],
)
def test_data_config_errors_name_the_field(overrides, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_config("grpo_tiny", overrides)


def test_data_config_errors_for_file_fields(tmp_path):
    path = str(write(tmp_path, ".jsonl"))
    with pytest.raises(ConfigError, match=r"data.heldout_fraction=1.0 must be in \[0, 1\)"):
        DataConfig(task="hf", path=path, heldout_fraction=1.0)
    with pytest.raises(ConfigError, match="both name a held-out split; set only one"):
        DataConfig(task="hf", path=path, heldout_fraction=0.1, eval_split="test")


def test_train_reports_hf_data_problems_before_ray(tmp_path, tiny_llama, monkeypatch):
    from relayrl.controller import driver

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before the bad input was reported")

    monkeypatch.setattr(driver, "start_ray", no_ray)
    path = write(tmp_path, ".parquet")
    base = [f"model.path={tiny_llama}", "data.task=hf", f"data.path={path}", f"run.output_dir={tmp_path / 'runs'}"]
    with pytest.raises(ConfigError, match=r"no column 'question', 'answer'.*set data.prompt_key"):
        driver.train(load_config("grpo_tiny", base))
    long = [
        {"messages": [{"role": "system", "content": "word " * 200}, {"role": "user", "content": "hi"}], "answer": 1}
    ]
    long_path = write(tmp_path, ".json", long)
    overrides = [*base[:2], f"data.path={long_path}", "data.prompt_key=messages", base[3]]
    with pytest.raises(ConfigError, match=r"train.json row 0 .* prompt tokens; .* raise model.max_model_len"):
        driver.train(load_config("grpo_tiny", overrides))
    assert not (tmp_path / "runs").exists()


def test_relayrl_eval_scores_the_heldout_prompts_of_a_file(tmp_path):
    from relayrl.data.eval_split import eval_rows

    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(10)]
    path = write(tmp_path, ".jsonl", rows)
    cfg = load_config("grpo_tiny", ["data.task=hf", f"data.path={path}", "data.heldout_fraction=0.2"])
    held, where = eval_rows(cfg, 0)
    assert len(held) == 2 and where == f"held-out: data.heldout_fraction=0.2 of {path}"
    assert not {r["question"] for r in held} & {r["question"] for r in load_task(cfg.data)}
    assert len(eval_rows(cfg, 1)[0]) == 1  # --limit cuts it
