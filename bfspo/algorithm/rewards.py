"""DAPO's sequence reward: the soft overlong punishment (Eq. 3) and the leaf reward (Eq. 4).

Eq. 3 is the same function under both windows; they differ in L_max (L_cache = budget/5 in both):
* "paper" (default): App. D's L_max = L_budget - L_cache, so the penalty ramps from 0 at 0.6*budget
  to -1 at 0.8*budget, and is -1 from there to the budget;
* "dapo": DAPO's and verl's L_max = L_budget, so the penalty ramps over (0.8*budget, budget].
"""

from __future__ import annotations

from bfspo.errors import BfspoError

WINDOWS = ("paper", "dapo")


def overlong_window(budget: int, window: str = "paper") -> tuple[float, float]:
    """(L_max, L_cache) of Eq. 3 for a generation budget: L_cache = budget/5; L_max = budget - L_cache
    ("paper", App. D) or budget ("dapo", DAPO's recipe)."""
    if window not in WINDOWS:
        raise BfspoError(f"overlong window must be one of {WINDOWS}, got {window!r}")
    l_cache = budget / 5
    return (budget - l_cache if window == "paper" else float(budget)), l_cache


def overlong_penalty(length: float, budget: int, window: str = "paper") -> float:
    """Eq. 3, soft overlong punishment R_l(o): 0 up to L_max - L_cache, then linear down to -1 at
    L_max, and -1 beyond; (L_max, L_cache) from `overlong_window`."""
    l_max, l_cache = overlong_window(budget, window)
    if length <= l_max - l_cache:
        return 0.0
    if length <= l_max:
        return ((l_max - l_cache) - length) / l_cache
    return -1.0


def sequence_reward(correct: bool, length: float, budget: int, overlong: bool = True, window: str = "paper") -> float:
    """Eq. 4, R_i = +-1 + R_l(o_i) (+1 when v(o_i, a*) = 1); `overlong=False` drops R_l (ablation);
    `window` picks Eq. 3's L_max (`overlong_window`)."""
    return (1.0 if correct else -1.0) + (overlong_penalty(length, budget, window) if overlong else 0.0)
