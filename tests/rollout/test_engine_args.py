"""The vLLM engine arguments ``Rollout`` builds from relayrl's configs (no engine is started)."""

from __future__ import annotations

from relayrl.config import ModelConfig, RolloutConfig, WeightSyncConfig


def test_a_streaming_engine_runs_at_most_in_flight_sequences():
    """``rollout.stream``: vLLM's ``max_num_seqs`` is ``rollout.in_flight`` (the driver submits twice that, the
    rest wait in the engine); chunks leave it at vLLM's default."""
    from relayrl.rollout.engine_args import engine_args  # its call imports vLLM

    def args(**rollout):
        return engine_args("tiny", ModelConfig(), RolloutConfig(**rollout), 0, WeightSyncConfig())

    assert args(stream=True, in_flight=8).max_num_seqs == 8
    assert args(in_flight=8).max_num_seqs is None  # not streaming: vLLM's default
