import json
from itertools import pairwise

import pytest

from relayrl.data import Prompt, PromptSampler, chat_formatter, make_arith_rows
from relayrl.models.tiny import build_tokenizer

ROWS = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]


def take(sampler: PromptSampler, n: int) -> list[list[Prompt]]:
    return [sampler.next_batch() for _ in range(n)]


def ids(batches) -> list[int]:
    return [p.prompt_id for b in batches for p in b]


def test_batches_cover_each_epoch_once_in_a_new_order_with_unique_ids():
    sampler = PromptSampler(ROWS, batch_size=2, seed=0)
    got = ids(take(sampler, 10))  # 20 prompts = 4 epochs of 5 rows
    assert len(set(got)) == 20
    for epoch in range(4):
        chunk = got[epoch * 5 : (epoch + 1) * 5]
        assert sorted(chunk) == [epoch * 5 + i for i in range(5)]  # id = epoch * len(rows) + row index
    orders = [tuple(i % 5 for i in got[e * 5 : (e + 1) * 5]) for e in range(4)]
    assert len(set(orders)) > 1  # reshuffled per epoch
    assert sampler.state_dict() == {"epoch": 4, "position": 0, "seed": 0, "num_rows": 5}


def test_batch_content_matches_its_row_and_crosses_epoch_boundary():
    sampler = PromptSampler(ROWS, batch_size=3, seed=1, format_prompt=lambda q: f"<{q}>")
    first, second = take(sampler, 2)
    assert len(second) == 3 and sampler.state_dict()["epoch"] == 1 and sampler.state_dict()["position"] == 1
    for p in first + second:
        row = ROWS[p.prompt_id % 5]
        assert p.prompt == f"<{row['question']}>" and p.columns == row
        assert p.columns is not row  # a copy: reward fns can't corrupt the dataset


def test_same_seed_same_stream_other_seed_differs():
    rows = make_arith_rows(50, 20, seed=0)
    a = ids(take(PromptSampler(rows, 4, seed=7), 30))
    assert a == ids(take(PromptSampler(rows, 4, seed=7), 30))
    assert a != ids(take(PromptSampler(rows, 4, seed=8), 30))


def test_resume_from_state_dict_continues_the_same_stream():
    straight = PromptSampler(ROWS, 2, seed=5)
    expected = ids(take(straight, 7))
    first = PromptSampler(ROWS, 2, seed=5)
    head = ids(take(first, 3))
    resumed = PromptSampler(ROWS, 2, seed=5)
    resumed.load_state_dict(dict(first.state_dict()))
    assert head + ids(take(resumed, 4)) == expected


def test_resume_refuses_other_data_or_seed():
    state = PromptSampler(ROWS, 2, seed=5).state_dict()
    with pytest.raises(ValueError, match="seed=5 but this sampler has seed=6"):
        PromptSampler(ROWS, 2, seed=6).load_state_dict(state)
    with pytest.raises(ValueError, match="num_rows=5 but this sampler has num_rows=4"):
        PromptSampler(ROWS[:4], 2, seed=5).load_state_dict(state)


def test_bad_arguments():
    with pytest.raises(ValueError, match="no rows"):
        PromptSampler([], 2, 0)
    with pytest.raises(ValueError, match=r"run\.prompts_per_step"):
        PromptSampler(ROWS, 0, 0)


def test_chat_formatter_applies_template_with_generation_prompt():
    tokenizer = build_tokenizer()
    fmt = chat_formatter(tokenizer, use_chat_template=True)
    assert fmt("What is 1 + 2?") == "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    assert chat_formatter(tokenizer, use_chat_template=False)("hi") == "hi"
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match=r"data\.chat_template=false"):
        chat_formatter(tokenizer, use_chat_template=True)


def test_each_prompt_carries_a_seed_from_the_sampling_seed_and_its_id():
    """Completions are seeded from (run seed, prompt id): the same ids get the same seeds in another sampler
    (a resumed run), another sampling seed changes every one, and seed ranges [s, s + G) do not collide."""
    from relayrl.data.sampler import prompt_seed

    batches = take(PromptSampler(ROWS, 3, seed=2, sampling_seed=11), 4)
    seeds = {p.prompt_id: p.seed for b in batches for p in b}
    assert all(s == prompt_seed(11, pid) for pid, s in seeds.items())
    assert all(s is not None and 0 <= s < 2**62 for s in seeds.values())
    again = take(PromptSampler(ROWS, 3, seed=2, sampling_seed=11), 4)
    assert [[p.seed for p in b] for b in again] == [[p.seed for p in b] for b in batches]
    other = take(PromptSampler(ROWS, 3, seed=2, sampling_seed=12), 4)
    assert all(p.seed != q.seed for b, c in zip(batches, other) for p, q in zip(b, c))
    first = PromptSampler(ROWS, 1, seed=4).next_batch()[0]  # default: the data seed
    assert first.seed == prompt_seed(4, first.prompt_id)
    bases = sorted(prompt_seed(11, pid) for pid in range(1000))
    assert all(b - a >= 64 for a, b in pairwise(bases))  # group sizes up to 64 never share seeds


def test_prompt_json_is_the_checkpoint_format():
    """``driver.json`` keeps pending prompts as the dicts checkpoints always held; they load back equal."""
    prompt = PromptSampler(ROWS, 1, seed=0, sampling_seed=3).next_batch()[0]
    saved = prompt.to_json()
    assert list(saved) == ["prompt_id", "prompt", "columns", "seed"]
    assert saved["columns"] == ROWS[prompt.prompt_id]
    assert Prompt.from_json(json.loads(json.dumps(saved))) == prompt
    greedy = Prompt(1, "q", temperature=0.0)
    assert Prompt.from_json(greedy.to_json()) == greedy
