"""pass@k: the chance that at least one of k samples passes, estimated from n >= k samples per prompt.

The unbiased estimator (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): with c of
n samples passing,

    pass@k = 1 - C(n - c, k) / C(n, k)

i.e. one minus the chance that k samples drawn without replacement from the n all fail. Drawing k of
the n instead of using the first k alone uses every sample, so the estimate has lower variance.
pass@1 is c / n. The dataset figure is the mean over prompts.
"""

from __future__ import annotations

from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k of one prompt with ``c`` passing among ``n`` samples."""
    if not 0 <= c <= n:
        raise ValueError(f"pass count c={c} must be in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, n={n}]; sample at least k completions per prompt (-n)")
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(counts: list[int], n: int, k: int) -> float:
    """Mean pass@k over prompts; ``counts[i]`` = passing samples of prompt i (each of ``n`` samples)."""
    if not counts:
        raise ValueError("no prompts to score; check the dataset and --limit")
    return sum(pass_at_k(n, c, k) for c in counts) / len(counts)
