import json

import pytest

from relayrl.data import JsonlError, load_jsonl


def write(tmp_path, *lines: str):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_gsm8k_answer_is_split_into_final_number_and_solution(tmp_path):
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
    path = write(
        tmp_path,
        json.dumps({"question": "How many clips?", "answer": solution}),
        "",
        json.dumps({"question": "Big?", "answer": "so #### 1,200 ", "id": 7}),
        json.dumps({"question": "Plain", "answer": 3}),
    )
    rows = load_jsonl(path)
    assert rows == [
        {"question": "How many clips?", "answer": "72", "solution": solution},
        {"question": "Big?", "answer": "1200", "solution": "so #### 1,200 ", "id": 7},
        {"question": "Plain", "answer": "3"},
    ]


@pytest.mark.parametrize(
    "lines, expected",
    [
        (['{"question": "q", "answer": "1"}', '{"question": "q", "answer": '], r"train\.jsonl:2: invalid JSON"),
        (['{"question": "q"}'], r"train\.jsonl:1: missing key\(s\) answer \(has: question\)"),
        (['["q", "1"]'], r"train\.jsonl:1: expected a JSON object, got list"),
        (['{"question": "q", "answer": "####  "}'], r"train\.jsonl:1: answer has '####' but nothing after it"),
        (["", "   "], r"train\.jsonl: file has no rows"),
    ],
)
def test_bad_files_give_one_line_errors_with_location(tmp_path, lines, expected):
    with pytest.raises(JsonlError, match=expected) as info:
        load_jsonl(write(tmp_path, *lines))
    assert "\n" not in str(info.value) and ";" in str(info.value)  # one line, with a fix after ';'


def test_missing_file(tmp_path):
    with pytest.raises(JsonlError, match=r"no such file; point data\.path"):
        load_jsonl(tmp_path / "nope.jsonl")
