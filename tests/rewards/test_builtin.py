import pytest

from relayrl.rewards import builtin
from relayrl.rewards.builtin import answer_format, arith_correct, exact_match, parse_answer

# (completion, what parse_answer reads)
CASES = [
    ("Answer: 12", 12),
    ("Answer: 12.", 12),  # sentence punctuation is fine
    ("Answer: 12!\nThanks", 12),
    ("Answer:12", 12),
    ("12 + 7 = 19, so Answer: 19 because", 19),
    ("Answer: -3", -3),  # negative numbers
    ("Answer: 1,200", 1200),  # thousands separators
    ("Answer: 5\nwait, no. Answer: 6", 6),  # the last Answer: is the final word
    ("Answer: 5 Answer: six", None),  # ... even when it is malformed
    ("answer: 12", None),  # case-sensitive, as the prompt spells it
    ("The sum is 12", None),  # no fallback to the last number
    ("Answer: 1 2", None),  # ambiguous
    ("Answer: 12.5", None),  # not an integer
    ("Answer: 12,5", None),
    ("Answer: ", None),
    ("Answer:\n12", None),  # the number must be on the same line
    ("Answer: x12", None),
    ("", None),
]


@pytest.mark.parametrize("completion, expected", CASES)
def test_parse_answer(completion, expected):
    assert parse_answer(completion) == expected


def test_arith_correct_and_format_on_tricky_completions():
    completions = [c for c, _ in CASES]
    answers = ["12"] * len(completions)
    correct = arith_correct([""] * len(completions), completions, answer=answers)
    fmt = answer_format([""] * len(completions), completions, answer=answers)
    assert correct == [float(v == 12) for _, v in CASES]
    assert correct == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert fmt == [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]


def test_arith_correct_matches_negative_and_comma_answers_and_extra_columns():
    out = arith_correct(
        ["p"] * 3, ["Answer: -3", "Answer: 1,200", "Answer: 7"], answer=["-3", "1200", " 7 "], question=["a", "b", "c"]
    )
    assert out == [1.0, 1.0, 1.0]


def test_arith_correct_non_integer_answer_is_a_clear_error():
    with pytest.raises(ValueError, match=r"arith_correct needs integer answers, got '3\.5'; use exact_match"):
        arith_correct(["p"], ["Answer: 3"], answer=["3.5"])


def test_arith_correct_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="is shorter than"):
        arith_correct(["p", "p"], ["Answer: 3", "Answer: 3"], answer=["3"])


def test_exact_match_strips_whitespace_only():
    out = exact_match(["p"] * 5, [" 42\n", "42.", "Answer: 42", "", "abc"], answer=["42", "42", "42", "", "ABC"])
    assert out == [1.0, 0.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("12 + 7 = 19", 19),
        ("The sum is 1,200.", 1200),
        ("-5 then 3", 3),
        ("Answer: 9\n\nThis is a classic example", 9),
        ("no digits", None),
        ("", None),
    ],
)
def test_last_number_reads_the_final_integer(completion, expected):
    assert builtin.last_number(completion) == expected


def test_last_number_correct_grades_value_not_format():
    got = builtin.last_number_correct(
        [""] * 4, ["12 + 7 = 19", "Answer: 19", "19 or 20", "nineteen"], answer=["19"] * 4
    )
    assert got == [1.0, 1.0, 0.0, 0.0]


def test_digit_fraction_counts_non_space_characters():
    assert builtin.digit_fraction([""] * 3, ["ab12 ", "   ", "7"]) == [0.5, 0.0, 1.0]


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("So the answer is $\\boxed{\\frac{1}{2}}$.", "0.5", 1.0),
        ("1/2", "\\frac{1}{2}", 1.0),
        ("Natalia sold 48 + 24 = 72 clips.", "Natalia sold 48/2 = 24 clips in May.\n#### 72", 1.0),  # GSM8K row
        ("The answer is $\\boxed{3}$", "4", 0.0),
        ("I don't know", "4", 0.0),
        ("anything", "", None),  # a reference that does not parse: the reward does not apply
    ],
)
def test_math_verify(completion, answer, expected):
    assert builtin.math_verify(["p"], [completion], answer=[answer]) == [expected]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<think>12 + 7 is 19</think>\nAnswer: 19", 1.0),
        ("  <think>\nhmm\n</think> 19", 1.0),
        ("<think>no answer after</think>  \n", 0.0),
        ("Answer: 19", 0.0),
        ("x <think>a</think> 19", 0.0),  # text before the block
        ("<think>a</think><think>b</think> 19", 0.0),  # two blocks
        ("<think>a</think> 19 </think>", 0.0),
        ("<think></think> 19", 0.0),  # empty thinking
    ],
)
def test_think_format(completion, expected):
    assert builtin.think_format([""], [completion]) == [expected]


def test_regex_match_is_a_full_match():
    got = builtin.regex_match([""] * 3, ["Answer: 12", "Answer: 12 because", "answer: 12"], pattern=r"Answer: -?\d+")
    assert got == [1.0, 0.0, 0.0]


def test_length_penalty_by_hand():
    # max 10, buffer 4: no penalty up to 6 chars, then -1/4 per char, -1 beyond 10
    got = builtin.length_penalty([""] * 5, ["x" * n for n in (0, 6, 7, 10, 11)], max_chars=10, buffer_chars=4)
    assert got == [0.0, 0.0, -0.25, -1.0, -1.0]
    with pytest.raises(ValueError, match="buffer_chars"):
        builtin.length_penalty([""], ["x"], max_chars=10, buffer_chars=0)
