"""Evaluation metrics: the Accuracy Efficiency Score (App. E), bootstrap intervals, and a check of
the paper's printed AES values against its own formula."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from bfspo.errors import BfspoError

if TYPE_CHECKING:  # imported where used: `bfspo evaluate` runs without pandas (bench/gpu/gpu_check.py)
    import pandas as pd

# The precision the paper prints: accuracy to 0.1 point, length to 1 token, AES to 0.01.
ACC_HALF_STEP, LEN_HALF_STEP, AES_HALF_STEP = 0.05, 0.5, 0.005


def aes(acc: float, length: float, base_acc: float, base_len: float,
        alpha: float = 1.0, beta: float = 3.0, gamma: float = 5.0) -> float:
    """Accuracy Efficiency Score (App. E, from O1-Pruner) of a model against its baseline:

    dLength = (base_len - length) / base_len,  dAcc = (acc - base_acc) / base_acc,
    AES = alpha * dLength + beta * |dAcc|   if dAcc >= 0,
          alpha * dLength - gamma * |dAcc|  if dAcc < 0.
    """
    if base_acc <= 0 or base_len <= 0:
        raise BfspoError(f"AES needs a positive baseline accuracy and length, got {base_acc} and {base_len}")
    d_length = (base_len - length) / base_len
    d_acc = (acc - base_acc) / base_acc
    return alpha * d_length + (beta * abs(d_acc) if d_acc >= 0 else -gamma * abs(d_acc))


def bootstrap_ci(values: Sequence[float], level: float = 0.95, n_resamples: int = 1000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (seeded, so it is reproducible)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise BfspoError("bootstrap_ci needs at least one value")
    if not 0 < level < 1:
        raise BfspoError(f"confidence level must lie in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _baseline(zero_shot: pd.DataFrame, row) -> tuple[pd.Series | None, str | None]:
    """The zero-shot row that `row` is scored against: the same table, model and benchmark; for a
    table without zero-shot rows (the TokenSkip ratio table), the zero-shot row of the same model,
    training set and benchmark in another table (the main table of that training set first), if
    all such rows print the same numbers."""
    same_table = zero_shot[(zero_shot.table == row.table) & (zero_shot.model == row.model)
                           & (zero_shot.benchmark == row.benchmark)]
    if len(same_table):
        return same_table.iloc[0], row.table
    other = zero_shot[(zero_shot.model == row.model) & (zero_shot.train_set == row.train_set)
                      & (zero_shot.benchmark == row.benchmark)]
    if len(other) and len(other[["acc", "avg_len"]].drop_duplicates()) == 1:
        first = other.sort_values("table", key=lambda t: t != row.train_set, kind="stable").iloc[0]
        return first, first.table
    return None, None


def aes_consistency(reported: pd.DataFrame) -> pd.DataFrame:
    """Recompute the AES of every non-zero-shot row of `reported` (columns of
    data/reported_results.csv) that has a zero-shot baseline, and say whether the printed AES
    can come from the printed accuracies and lengths.

    The inputs are printed rounded (accuracy to 0.1, length to 1 token), so each row gets the
    range [aes_min, aes_max] that AES takes over every unrounded input consistent with the print
    (AES grows with accuracy and shrinks with length, so the corners give the range). The row is
    consistent when the printed AES, itself rounded to 0.01, lies within 0.005 of that range.
    """
    import pandas as pd

    zero_shot = reported[reported.method == "zero-shot"]
    out = []
    for row in reported[reported.method != "zero-shot"].itertuples():
        base, base_table = _baseline(zero_shot, row)
        if base is None:
            continue
        lo = aes(row.acc - ACC_HALF_STEP, row.avg_len + LEN_HALF_STEP,
                 base.acc + ACC_HALF_STEP, base.avg_len - LEN_HALF_STEP)
        hi = aes(row.acc + ACC_HALF_STEP, row.avg_len - LEN_HALF_STEP,
                 base.acc - ACC_HALF_STEP, base.avg_len + LEN_HALF_STEP)
        record = row._asdict()
        record.pop("Index")
        record.update(
            base_acc=base.acc, base_len=base.avg_len, baseline_table=base_table,
            aes_recomputed=round(aes(row.acc, row.avg_len, base.acc, base.avg_len), 4),
            aes_min=round(lo, 4), aes_max=round(hi, 4),
            consistent=bool(lo - AES_HALF_STEP <= row.aes <= hi + AES_HALF_STEP),
        )
        out.append(record)
    return pd.DataFrame(out)
