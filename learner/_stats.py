"""pass@k, pass^k, percentiles and Wilson's interval: the statistics the rubrics' tables report.

* **pass@k** = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, unbiased) and **pass^k** = C(c, k) / C(n, k) (Yao et al.
  2024, all k attempts pass), over the n graded rollouts of a task of which c passed; undefined when n < k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction


def pass_at_k_exact(n: int, c: int, k: int) -> Fraction | None:
    """1 - C(n-c, k) / C(n, k) as an exact fraction; None when n < k."""
    _check_counts(n, c, k)
    return None if n < k else 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def pass_hat_k_exact(n: int, c: int, k: int) -> Fraction | None:
    """C(c, k) / C(n, k) as an exact fraction; None when n < k."""
    _check_counts(n, c, k)
    return None if n < k else Fraction(math.comb(c, k), math.comb(n, k))


def pass_at_k(n: int, c: int, k: int) -> float | None:
    v = pass_at_k_exact(n, c, k)
    return None if v is None else float(v)


def pass_hat_k(n: int, c: int, k: int) -> float | None:
    v = pass_hat_k_exact(n, c, k)
    return None if v is None else float(v)


def _check_counts(n: int, c: int, k: int) -> None:
    if k < 1 or n < 0 or not 0 <= c <= n:
        raise ValueError(f"pass@k with n={n}, c={c}, k={k}: need k >= 1 and 0 <= c <= n")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float] | None:
    """Wilson's score interval (95% by default) for a success rate ``successes / n``; None without a trial.

    Unlike the normal approximation it stays inside [0, 1] and is honest at the small counts a laptop run has:
    0 of 20 gives [0, 0.16], not [0, 0]."""
    if n <= 0:
        return None
    p, denom = successes / n, 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
