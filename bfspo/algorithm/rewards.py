"""DAPO's sequence reward: the soft overlong punishment (Eq. 3) and the leaf reward (Eq. 4)."""

from __future__ import annotations


def overlong_penalty(length: float, budget: int) -> float:
    """Eq. 3, soft overlong punishment R_l(o), with L_cache = budget/5 and L_max = budget - L_cache:
    0 up to L_max - L_cache, then linear down to -1 at L_max, and -1 beyond."""
    l_cache = budget / 5
    l_max = budget - l_cache
    if length <= l_max - l_cache:
        return 0.0
    if length <= l_max:
        return ((l_max - l_cache) - length) / l_cache
    return -1.0


def sequence_reward(correct: bool, length: float, budget: int, overlong: bool = True) -> float:
    """Eq. 4, R_i = +-1 + R_l(o_i) (+1 when v(o_i, a*) = 1); `overlong=False` drops R_l (ablation)."""
    return (1.0 if correct else -1.0) + (overlong_penalty(length, budget) if overlong else 0.0)
