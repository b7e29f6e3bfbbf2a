"""The algorithm's math, tensors in and tensors out: no Ray, no vLLM, no process groups.

    advantages   rewards and group ids -> advantages (GRPO, Dr.GRPO, RLOO, REINFORCE++, GAE)
    losses       per-token policy losses (PPO clip, dual clip, clip-higher, GSPO), entropy bonus
    kl           KL estimators, as a loss term or a reward penalty
    value        the critic's clipped value loss
    aggregation  how per-token losses become the step's loss; masked reductions
    logprobs     next-token log-probabilities and entropies from logits
    shaping      DAPO's overlong reward penalty
    filtering    which prompt groups a step can learn from (exclusions, DAPO's dynamic sampling)
    objective    ``AlgorithmConfig`` resolved once into the callables the train step uses

Each file is small and tested against hand-worked numbers (``tests/algorithms/``). The trainer
(``relayrl.trainer``) calls these from its ranks; ``filtering`` is also used by the reward scorer,
which never imports torch, so that module imports none.
"""
