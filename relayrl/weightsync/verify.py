"""Post-sync verification: does the engine score tokens exactly as the trainer does?

A sync can be bit-exact at the transport and still be wrong in the engine (a tied lm_head that
was not re-tied, a repacked weight left stale: both seen on vLLM CPU). The end-to-end check is to
score the same sequences on both sides and compare per-token logprobs over completion tokens:

    mismatch = | log pi_engine(y_t | y_<t) - log pi_trainer(y_t | y_<t) |

fp32 on CPU agrees to ~1e-5 nats; a missed weight shows up as 0.1-1 nats.
"""

from __future__ import annotations

from relayrl.monitor.schema import MISMATCH_MAX_ABS, MISMATCH_MEAN_ABS, MISMATCH_TOKENS


def logprob_mismatch(engine: list[list[float]], trainer: list[list[float]], starts: list[int]) -> dict[str, float]:
    """Mean / max |engine - trainer| over positions ``starts[i]:`` of each sequence's logprob list.

    ``starts[i]`` is the index of the first completion token's logprob (prompt length - 1).
    """
    diffs = [
        abs(e - t)
        for eng, tr, s in zip(engine, trainer, starts, strict=True)
        for e, t in zip(eng[s:], tr[s:], strict=True)
    ]
    if not diffs:
        return {MISMATCH_MEAN_ABS: 0.0, MISMATCH_MAX_ABS: 0.0, MISMATCH_TOKENS: 0.0}
    return {
        MISMATCH_MEAN_ABS: sum(diffs) / len(diffs),
        MISMATCH_MAX_ABS: max(diffs),
        MISMATCH_TOKENS: float(len(diffs)),
    }
