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


def test_a_pipelined_engine_runs_its_stages_as_its_own_worker_processes():
    """``rollout.pp_size``: vLLM's ``pipeline_parallel_size``, its workers this actor's processes ("mp")."""
    from relayrl.rollout.engine_args import engine_args

    def args(**rollout):
        return engine_args("tiny", ModelConfig(), RolloutConfig(**rollout), 0, WeightSyncConfig())

    pipelined = args(pp_size=2, enforce_eager=False)
    assert (pipelined.pipeline_parallel_size, pipelined.distributed_executor_backend) == (2, "mp")
    assert (args().pipeline_parallel_size, args().distributed_executor_backend) == (1, None)
