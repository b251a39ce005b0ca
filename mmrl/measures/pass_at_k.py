"""pass@k: the chance that at least one of k samples solves an example.

The unbiased estimator of "Evaluating Large Language Models Trained on Code" (Chen et al., 2021):
with n samples of an example of which c are correct, pass@k = 1 - C(n-c, k) / C(n, k), averaged
over examples. With n = k it is the share of examples with any correct sample; pass@1 is c / n.
RL that sharpens a policy raises pass@1 toward pass@k (what the model can do becomes what it does).
"""

from __future__ import annotations

from math import comb
from typing import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The estimator for one example: ``n`` samples, ``c`` of them correct, ``k <= n``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(successes: Sequence[Sequence[bool]], k: int) -> float:
    """Mean pass@k over examples, each given as the success of each of its samples."""
    if not successes:
        return float("nan")
    return sum(pass_at_k(len(s), sum(bool(x) for x in s), k) for s in successes) / len(successes)
