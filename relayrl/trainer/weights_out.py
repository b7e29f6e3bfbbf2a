"""``TrainerActor``'s methods that move a rank's trained state out of training, and back: to host memory
while colocated engines generate (``offload`` / ``onload``), to the engines (``connect_rollouts``,
``sync_weights``, and the trainer's half of the post-sync mismatch probe), to an HF model directory
(``save_hf``), and to and from this rank's checkpoint shards (``trainer/checkpoint.py``).

``WeightsOut`` is a mixin of ``TrainerActor`` (``trainer/actor.py``): it keeps no state of its own and reads
the rank's, declared below and set by the actor's ``__init__`` and ``setup``. Like every method of the actor,
these are called on all ranks at once (``TrainerGroup``), and the gathers in them are collectives.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from relayrl.algorithms.logprobs import token_logprobs
from relayrl.config import AlgorithmConfig, ModelConfig, WeightSyncConfig
from relayrl.trainer import checkpoint, lora
from relayrl.trainer.batch import fetch_groups
from relayrl.trainer.critic import Critic
from relayrl.trainer.hf import export, hf_state_dict
from relayrl.trainer.pp_weights import held

if TYPE_CHECKING:
    from vllm.distributed.weight_transfer.base import WeightSource

    from relayrl.trainer.pp_step import PipelinedPolicy
    from relayrl.weightsync.sync import TrainerSync  # imports vLLM: loaded in TrainerActor.setup


class WeightsOut:
    """Offload, weight sync, the probe, HF export and checkpoints of one trainer rank (``TrainerActor``'s)."""

    # The rank's state this mixin reads, set by ``TrainerActor``.
    rank: int
    device: torch.device
    model_path: str
    model_cfg: ModelConfig
    algo: AlgorithmConfig
    temperature: float
    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    uses_lora: bool
    critic: Critic | None
    pipelined: PipelinedPolicy | None
    trained: checkpoint.Parts
    _sync: TrainerSync | None
    _saver: checkpoint.Saver

    # ---------------------------------------------------------------- weights out
    def offload(self) -> float:
        """Colocated GPUs: training state to host memory while the engines generate; bytes moved (CPU: 0)."""
        return self._move(torch.device("cpu")) if self.device.type == "cuda" else 0.0

    def onload(self) -> float:
        """Training state back onto this rank's GPU before a train step; bytes moved (CPU: 0)."""
        return self._move(self.device) if self.device.type == "cuda" else 0.0

    def _move(self, device: torch.device) -> float:
        from relayrl.trainer.offload import move_training_state

        modules = [m for m, _ in self.trained.values()] + ([self.ref_model] if self.ref_model is not None else [])
        optimizers = [opt for _, opt in self.trained.values()]
        return float(move_training_state(modules, optimizers, device))

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full, unsharded CPU state dict with HF names on rank 0 (None elsewhere). Collective.

        FSDP2 replaces parameters in place (DTensors) without renaming modules, so the keys are exactly
        ``AutoModelForCausalLM.state_dict()``'s: what ``load_state_dict`` and vLLM's ``load_weights`` take.
        With LoRA, the merged weights under those names (``hf_state_dict``). Under pipeline stages, gathered from
        the ranks holding them (``pp_step.PipelinedPolicy.full_state_dict``).
        """
        if self.pipelined is not None:
            state = self.pipelined.full_state_dict(keep=self.rank == 0)
            return state if self.rank == 0 else None
        state = hf_state_dict(self.model)
        return state if self.rank == 0 else None

    def critic_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The critic's full CPU state dict (HF ``*ForTokenClassification`` names) on rank 0. Collective."""
        if self.critic is None:
            raise RuntimeError(f"algorithm.name={self.algo.name!r} trains no critic; use algorithm.name=gae (PPO)")
        state = self.critic.state_dict()
        return state if self.rank == 0 else None

    def connect_rollouts(self, ws_cfg: WeightSyncConfig, rollouts: list) -> None:
        """Get ready to sync weights to ``rollouts`` (RolloutActor handles); each engine says itself how many
        vLLM workers it runs (``info()["workers"]``: the group ranks a sync needs).

        The source is vLLM's ``ModuleSource`` over the FSDP model: it all-gathers one parameter at a
        time (``full_tensor``), in ``named_parameters`` order on every rank, so tied weights appear
        once and the trainer never holds more than one bucket of gathered weights. With LoRA the source is
        ``MergedLoraSource``: the same gathers, each adapted weight sent merged under its base name.
        """
        import ray
        from vllm.distributed.weight_transfer.base import ModuleSource

        from relayrl.weightsync.lora import MergedLoraSource
        from relayrl.weightsync.stages import StageSource
        from relayrl.weightsync.sync import TrainerSync

        if self._sync is not None:
            self._sync.close()
        source: WeightSource = MergedLoraSource(self.model) if self.uses_lora else ModuleSource(self.model)
        if self.pipelined is not None:  # each rank holds its own stages: gathered from them, one at a time
            source = StageSource(self.model, self.pipelined.owner, self.pipelined.pipeline_group())
        workers = [int(info["workers"]) for info in ray.get([r.info.remote() for r in rollouts])]
        self._sync = TrainerSync(ws_cfg, source, self.rank, rollouts, workers, wire_dtype=self.model_cfg.dtype)

    def sync_weights(self, version: int) -> dict[str, float] | None:
        """Send the current weights to every engine as ``version`` (collective). Rank 0 returns metrics."""
        if self._sync is None:
            raise RuntimeError("sync_weights before connect_rollouts; call TrainerGroup.connect_rollouts first")
        stats = self._sync.sync(version)
        return stats if self.rank == 0 else None

    def held_parameters(self) -> dict[str, int]:
        """The policy weights this rank holds, by name: the elements it keeps of each (``pp_weights.held``)."""
        return held(self.model)

    def param_counts(self) -> tuple[int, int]:
        """(trainable, total) parameters of the policy; with LoRA, trainable counts the adapters only."""
        if self.pipelined is not None:  # each rank holds its stages (the rest frozen on meta): all train
            total = lora.param_counts(self.model)[1]
            return total, total
        return lora.param_counts(self.model)

    def save_hf(self, out_dir: str) -> str | None:
        """Write an HF model directory (safetensors, config, tokenizer) from rank 0. Collective."""
        state = self.state_dict()  # None off rank 0
        return export(state, self.model_path, out_dir) if state is not None else None

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int], temperature: float | None = None) -> list[float]:
        """Logprob of each token after the first under the current weights (default: the sampling
        temperature). Collective."""
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        temperature = self.temperature if temperature is None else temperature
        if self.pipelined is not None:  # through the stages: no rank holds the whole policy
            return self.pipelined.sequence_logprobs(ids, temperature)[0].tolist()
        logits = self.model(input_ids=ids, use_cache=False).logits
        return token_logprobs(logits, ids, temperature)[0].tolist()

    def probe(self, group_refs: list, samples: int) -> tuple[list[list[int]], list[int], list[list[float]]]:
        """The trainer's half of the post-sync mismatch probe, on groups this rank fetches itself: the first
        ``samples`` trajectories' token ids, where their completions start (in the next-token axis) and
        their logprobs at temperature 1. One call, collective."""
        trajs = [t for g in fetch_groups(group_refs) for t in g.trajectories][:samples]
        seqs = [t.prompt_token_ids + t.completion_token_ids for t in trajs]
        return seqs, [len(t.prompt_token_ids) - 1 for t in trajs], [self.sequence_logprobs(s, 1.0) for s in seqs]

    # ---------------------------------------------------------------- checkpoints
    def save_checkpoint(self, path: str, asynchronous: bool = False) -> float:
        """Collective: this rank's shards of the policy (and critic) with their optimizers, and its RNG;
        ``asynchronous`` returns once they are staged (``checkpoint_written`` says when they are on disk).
        Returns the seconds training was held up."""
        return self._saver.save(Path(path), self.trained, self.rank, asynchronous)

    def checkpoint_written(self, wait: bool = False) -> bool:
        """Whether the last ``save_checkpoint`` is on disk (``wait``: block until it is)."""
        if wait:
            self._saver.wait()
        return self._saver.done()

    def load_checkpoint(self, path: str) -> None:
        """Collective: restore ``save_checkpoint``'s state into the live sharded modules."""
        self._saver.wait()
        checkpoint.load(Path(path), self.trained, self.rank)
