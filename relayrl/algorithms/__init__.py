"""The algorithm's math, tensors in and tensors out: no Ray, no vLLM, no process groups.

    advantages   rewards and group ids -> advantages (GRPO, Dr.GRPO, RLOO, REINFORCE++, GAE)
    losses       per-token policy losses, KL estimators, value loss, how losses aggregate
    logprobs     next-token log-probabilities and entropies from logits
    shaping      DAPO's overlong reward penalty
    filtering    which prompt groups a step can learn from (exclusions, DAPO's dynamic sampling)
    objective    ``AlgorithmConfig`` resolved once into the callables the train step uses

Each file is small and tested against hand-worked numbers (``tests/algorithms/``). The trainer
(``relayrl.trainer``) calls these from its ranks; ``filtering`` is also used by the reward scorer,
which never imports torch, so that module imports none.
"""
