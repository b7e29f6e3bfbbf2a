"""Benchmarks: each runs what it compares side by side in one run, on this box, and prints ratios.

Run them from the repository root as modules (``.venv/bin/python -m bench.vs_trl --help``); they
import each other and ``bench.common`` as ``bench.<name>``, as the tests under ``tests/`` do.
Current figures and the command behind each are in docs/benchmarks.md.

    vs_trl          relayrl against TRL's GRPOTrainer on one recipe; ``--variants``: async, bf16...
    startup_floor   launch -> first step against the bare pipeline relayrl is built from
    floor           each phase of a run's step against this box's physical floor
    trainer_step    one trainer step of a grpo_arith-shaped batch, by packing budget
    weight_sync     weight-sync transports and commits, against memcpy
    checkpoint      synchronous vs background checkpoint saves
    cpu_gemm        vLLM's packed CPU GEMM against unpacked weights
    code_reward     the ``code_exec`` reward's judge against a one-process baseline
    plan_accuracy   ``relayrl plan``'s predictions against measured layouts
"""
