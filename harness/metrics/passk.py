"""pass@k and mean@n: what practitioners report for reasoning tasks, from n samples per prompt.

pass@k is the chance that at least one of k completions solves a prompt.  Drawing exactly k
samples and checking "any correct" is unbiased but noisy; with n ≥ k samples of which c are
correct, the unbiased estimator (Chen et al., "Evaluating Large Language Models Trained on
Code", arXiv 2107.03374, eq. 1) is

    pass@k = 1 − C(n − c, k) / C(n, k)

averaged over prompts.  It is computed as the product Π_{i=n−c+1}^{n} (1 − k / i), which never
forms the large binomials (the paper's numerically stable form).  mean@n is the mean reward over
all n samples of all prompts.  "Correct" means a reward at or above ``eval.threshold``.
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with ``c`` correct among ``n`` samples (``1 <= k <= n``)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n; got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n; got c={c}, n={n}")
    if n - c < k:
        return 1.0
    out = 1.0
    for i in range(n - c + 1, n + 1):
        out *= 1.0 - k / i
    return 1.0 - out


def mean_pass_at_k(correct_counts: Sequence[int], n: int, k: int) -> float:
    """pass@k averaged over prompts (one count of correct samples per prompt)."""
    if not correct_counts:
        return float("nan")
    return sum(pass_at_k(n, c, k) for c in correct_counts) / len(correct_counts)


__all__ = ["mean_pass_at_k", "pass_at_k"]
