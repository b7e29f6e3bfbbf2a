"""`relayrl eval` on the tiny model: real vLLM rollout actor, a tiny jsonl dataset, a reward we can recompute."""

import json
from math import comb

import pytest

from relayrl.cli import main

N = 4


def length_multiple_of_3(prompts, completions, **columns):
    """Passes (1.0) when the completion length is a multiple of 3: about a third of random text does."""
    return [1.0 if len(c) % 3 == 0 else 0.0 for c in completions]


@pytest.fixture(scope="module")
def evaluated(ray_session, tiny_llama, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    data = tmp / "tiny.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is {a} + {a}?", "answer": str(2 * a)}) + "\n" for a in range(5))
    )
    out = tmp / "out"
    with pytest.MonkeyPatch.context() as mp:  # 4 completions per call: 3 chunks, 2 in flight, in order
        mp.setattr("relayrl.monitor.evaluate.CHUNK_COMPLETIONS", N)
        rc = main(
            [
                "eval",
                str(tiny_llama),
                "--config-name",
                "grpo_tiny",
                "data.task=jsonl",
                f"data.path={data}",
                "rewards=[{fn:tests.monitor.test_eval:length_multiple_of_3}]",
                "rollout.num_cpus=0.5",
                "-n",
                str(N),
                "-k",
                "1",
                "2",
                "4",
                "--limit",
                "3",
                "--out",
                str(out),
            ]
        )
    assert rc == 0
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    return rows, json.loads((out / "summary.json").read_text())


def test_accuracy_and_pass_at_k_match_a_hand_count(evaluated):
    rows, summary = evaluated
    assert len(rows) == 3 * N and sorted({r["prompt_id"] for r in rows}) == [0, 1, 2]
    passed = [len(r["completion"]) % 3 == 0 for r in rows]  # re-score the texts ourselves
    assert [r["passed"] for r in rows] == passed
    assert 0 < sum(passed) < len(rows), "all-pass or all-fail would not test the counting"
    assert summary["accuracy"] == pytest.approx(sum(passed) / len(rows))
    counts = [sum(p for r, p in zip(rows, passed) if r["prompt_id"] == i) for i in range(3)]
    for k in (1, 2, 4):
        by_hand = sum(1 - comb(N - c, k) / comb(N, k) for c in counts) / 3
        assert summary["pass_at_k"][str(k)] == pytest.approx(by_hand), k
    assert summary["pass_at_k"]["1"] == pytest.approx(summary["accuracy"])
    assert summary["mean_reward"] == pytest.approx(sum(passed) / len(rows))  # weight 1: reward = pass
    assert (summary["prompts"], summary["samples_per_prompt"]) == (3, N)
    assert summary["split"].startswith("data.task=jsonl data.path=")  # a file task: no held-out split


def test_prompts_are_chat_formatted_and_columns_reach_the_reward(evaluated):
    rows, _ = evaluated
    for i in range(3):  # each chunk's groups land under their own prompt, in order
        assert all(f"What is {i} + {i}?" in r["prompt"] for r in rows if r["prompt_id"] == i)
    assert [r["prompt_id"] for r in rows] == sorted(r["prompt_id"] for r in rows)
    assert all(r["rewards"] == {"length_multiple_of_3": float(len(r["completion"]) % 3 == 0)} for r in rows)


def test_k_larger_than_n_is_one_line(capsys):
    assert main(["eval", "tiny-llama", "--config-name", "grpo_tiny", "-n", "2", "-k", "4"]) == 2
    assert "pass@k needs 1 <= k <= n; got k=[4] with n=2" in capsys.readouterr().err
