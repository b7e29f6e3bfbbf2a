"""Engine-vs-trainer logprob mismatch, worked by hand."""

from __future__ import annotations

import pytest

from relayrl.weightsync.verify import logprob_mismatch


def test_only_completion_positions_count():
    engine = [[-9.0, -1.0, -2.0], [-5.0, -0.5]]
    trainer = [[-1.0, -1.1, -2.0], [-5.0, -0.2]]
    # seq 0 from index 1: |−1−(−1.1)| = 0.1, 0 ; seq 1 from index 1: 0.3  -> mean 0.4/3, max 0.3
    got = logprob_mismatch(engine, trainer, starts=[1, 1])
    assert got["mismatch/tokens"] == 3
    assert got["mismatch/mean_abs"] == pytest.approx(0.4 / 3) and got["mismatch/max_abs"] == pytest.approx(0.3)


def test_no_completion_tokens_is_zero_and_lengths_must_agree():
    assert logprob_mismatch([[-1.0]], [[-2.0]], starts=[1])["mismatch/tokens"] == 0
    with pytest.raises(ValueError, match=r"zip\(\) argument 2 is shorter"):  # zip(strict=True)'s own error
        logprob_mismatch([[-1.0, -2.0]], [[-1.0]], starts=[0])
