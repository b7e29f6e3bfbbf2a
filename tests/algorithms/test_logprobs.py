"""Next-token logprobs and entropy against hand-worked softmaxes."""

import math

import pytest
import torch

from relayrl.algorithms.logprobs import token_entropy, token_logprobs


def _logits():
    # V = 2. Position 0: [0, ln 3] -> p = [.25, .75]; position 1: [ln 3, 0] -> p = [.75, .25]; position 2 unused.
    return torch.tensor([[[0.0, math.log(3)], [math.log(3), 0.0], [5.0, -5.0]]])


def test_token_logprobs_hand_numbers():
    ids = torch.tensor([[0, 1, 1]])  # next tokens: 1 at position 0, 1 at position 1
    lp = token_logprobs(_logits(), ids)
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.75), math.log(0.25)]]))


def test_temperature_divides_logits():
    # tau = 2: position 0 logits [0, ln sqrt 3] -> p1 = sqrt3 / (1 + sqrt3) = 0.633975 -> ln = -0.455746
    lp = token_logprobs(_logits(), torch.tensor([[0, 1, 1]]), temperature=2.0)
    assert lp[0, 0].item() == pytest.approx(-0.455746, abs=1e-6)


def test_matches_log_softmax_reference():
    g = torch.Generator().manual_seed(0)
    logits, ids = torch.randn(3, 7, 11, generator=g), torch.randint(0, 11, (3, 7), generator=g)
    ref = torch.log_softmax(logits[:, :-1] / 0.7, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, ids, 0.7), ref)


def test_entropy_hand_numbers():
    # p = [.25, .75]: H = .25 ln 4 + .75 ln(4/3) = 0.562335 ; uniform over 4 -> ln 4
    h = token_entropy(_logits())
    assert h[0, 0].item() == pytest.approx(0.562335, abs=1e-6)
    assert token_entropy(torch.zeros(1, 2, 4))[0, 0].item() == pytest.approx(math.log(4))


def test_bad_input():
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(_logits(), torch.tensor([[0, 1, 1]]), temperature=0.0)
    with pytest.raises(ValueError, match="input_ids"):
        token_logprobs(_logits(), torch.tensor([[0, 1]]))
