"""``NoSignal``: one warning after ``steps`` flat steps in a row, and only one."""

from relayrl.monitor.signal import FLAT_FRACTION, NoSignal


def _steps(watch: NoSignal, flats: list[float | None]) -> list[str | None]:
    return [watch.observe({} if f is None else {"reward/zero_std_groups": f, "reward/mean": 0.0}) for f in flats]


def test_warns_once_on_the_step_the_streak_reaches_n():
    lines = _steps(NoSignal(3), [1.0, 0.95, 0.9, 1.0, 1.0, 1.0, 1.0])
    assert [line is not None for line in lines] == [False, False, True, False, False, False, False]
    line = lines[2]
    assert line is not None and "3 steps in a row" in line and "reward mean 0.000" in line


def test_a_step_with_signal_resets_the_streak():
    assert _steps(NoSignal(3), [1.0, 1.0, 0.5, 1.0, 1.0]) == [None] * 5
    assert FLAT_FRACTION == 0.9
    assert _steps(NoSignal(2), [1.0, 0.89, 1.0]) == [None] * 3  # just under 90 % flat is a signal


def test_steps_without_scores_neither_count_nor_reset():
    assert [x is not None for x in _steps(NoSignal(2), [1.0, None, 1.0])] == [False, False, True]


def test_zero_means_never():
    assert _steps(NoSignal(0), [1.0] * 10) == [None] * 10
