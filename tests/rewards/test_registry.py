import pytest

from relayrl.rewards import REWARDS, load_reward_fn, load_reward_fns
from relayrl.rewards.builtin import answer_format, arith_correct

NOT_CALLABLE = 3


def strict(prompts, completions):
    return [0.0] * len(completions)


def my_reward(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def test_short_names_and_import_paths_resolve():
    assert set(REWARDS) == {
        "arith_correct",
        "answer_format",
        "exact_match",
        "last_number_correct",
        "digit_fraction",
        "env_reward",
        "math_verify",
        "think_format",
        "regex_match",
        "length_penalty",
        "code_exec",
        "think_answer_format",
        "answer_tag_correct",
        "countdown_correct",
        "count_correct",
        "reward_model",
    }
    assert load_reward_fn("arith_correct") is arith_correct
    assert load_reward_fn("relayrl.rewards.builtin:answer_format") is answer_format
    assert load_reward_fn("tests.rewards.test_registry:my_reward")(["p"], ["abc"]) == [3.0]


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "nope",
            (
                r"reward 'nope' is neither a built-in \(arith_correct, answer_format, exact_match, "
                r"last_number_correct, digit_fraction, env_reward, math_verify, .*, reward_model\) nor an import "
                r"path; write module:function"
            ),
        ),
        ("no_such_module_xyz:f", r"reward 'no_such_module_xyz:f': cannot import module 'no_such_module_xyz'"),
        ("relayrl.rewards.builtin:missing", r"module 'relayrl.rewards.builtin' has no attribute 'missing'; check"),
        ("tests.rewards.test_registry:NOT_CALLABLE", r"is a int, not a function; point it at fn\(prompts"),
        ("a:b:c", r"neither a built-in"),
    ],
)
def test_bad_specs_give_one_line_errors(spec, message):
    with pytest.raises(ValueError, match=message) as info:
        load_reward_fn(spec)
    assert "\n" not in str(info.value)


def test_load_reward_fns_names_and_dedupes():
    named = load_reward_fns(
        [
            ("arith_correct", 1),
            ("relayrl.rewards.builtin:answer_format", 0.1),
            ("relayrl.rewards.builtin:arith_correct", 2),
        ]
    )
    assert [(n, w) for n, _, w in named] == [("arith_correct", 1.0), ("answer_format", 0.1), ("arith_correct_2", 2.0)]
    assert named[2][1] is arith_correct


def test_kwargs_bind_to_functions_and_construct_classes(tmp_path):
    fn = load_reward_fn("regex_match", {"pattern": r"\d+"})
    assert fn(["p", "p"], ["12", "x"]) == [1.0, 0.0] and fn.__name__ == "regex_match"
    named = load_reward_fns([("length_penalty", 0.5, {"max_chars": 4, "buffer_chars": 2})])
    assert named[0][0] == "length_penalty" and named[0][1]([""], ["abc"]) == [-0.5]
    with pytest.raises(
        ValueError, match=r"reward 'tests.rewards.test_registry:strict' rejects kwargs=\{'patern': 'x'\}"
    ):
        load_reward_fn("tests.rewards.test_registry:strict", {"patern": "x"})
    with pytest.raises(ValueError, match=r"reward_model path='/no/such/rm' is not a local HF model directory"):
        load_reward_fn("reward_model", {"path": "/no/such/rm"})
    with pytest.raises(ValueError, match=r"reward 'reward_model' rejects kwargs=\{\} \(.*missing .* 'path'\)"):
        load_reward_fn("reward_model")
