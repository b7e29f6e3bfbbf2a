"""``faults.trainer_result`` with real Ray actors: a rank out of memory stops the run with the knobs to turn
(no restart, which would run out again); a rank's other error passes through unchanged."""

from __future__ import annotations

import pytest

from relayrl.controller.faults import MEMORY_KNOBS, TrainerOutOfMemory, trainer_result


class _Rank:
    def step(self, fail: str) -> dict:
        if fail == "memory":
            raise MemoryError("cannot allocate 3.2 GB")
        if fail == "value":
            raise ValueError("a bad row")
        return {"loss": 1.0}


class _Group:
    def dead_ranks(self) -> list[int]:
        return []


@pytest.mark.parametrize("fail", ["memory", "value"])
def test_a_rank_out_of_memory_names_the_knobs(ray_session, fail):
    ranks = [ray_session.remote(_Rank).remote() for _ in range(2)]
    try:
        assert trainer_result(_Group(), [r.step.remote("") for r in ranks]) == {"loss": 1.0}
        refs = [ranks[0].step.remote(""), ranks[1].step.remote(fail)]
        if fail == "memory":
            with pytest.raises(TrainerOutOfMemory, match=r"trainer\.activation_checkpointing") as err:
                trainer_result(_Group(), refs)
            assert MEMORY_KNOBS in str(err.value) and len(str(err.value).splitlines()) == 1
        else:
            with pytest.raises(ray_session.exceptions.RayTaskError, match="a bad row"):
                trainer_result(_Group(), refs)
    finally:
        for r in ranks:
            ray_session.kill(r)
