import pytest

from relayrl.monitor.passk import mean_pass_at_k, pass_at_k


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)  # pass@1 = c/n
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 2, 4) == 1.0  # all 4 drawn: one of them passes
    assert pass_at_k(4, 1, 3) == pytest.approx(0.75)  # 1 - C(3,3)/C(4,3) = 1 - 1/4


def test_mean_over_prompts_and_bad_input():
    assert mean_pass_at_k([0, 1, 4], 4, 2) == pytest.approx((0 + 0.5 + 1) / 3)
    with pytest.raises(ValueError, match="k=5 must be in"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c=5"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="no prompts"):
        mean_pass_at_k([], 4, 1)
