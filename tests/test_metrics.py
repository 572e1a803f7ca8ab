"""AES (App. E), bootstrap intervals, and the paper's printed AES checked against its own formula."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bfspo.errors import BfspoError
from bfspo.evaluation.metrics import aes, aes_consistency, bootstrap_ci

REPORTED = Path(__file__).resolve().parents[1] / "data" / "reported_results.csv"

# Rows of data/reported_results.csv whose printed AES no rounding of the printed accuracy and
# length can produce: (table, model, benchmark, method, ratio), printed AES, AES recomputed from
# the printed inputs. Found by aes_consistency; kept here so that any change shows up.
DISAGREEING = {
    ("math", "Llama-3.1-8B-Instruct", "math500", "bfspo", None): (0.39, 0.3322),
    ("math", "Llama-3.1-8B-Instruct", "mmlu_stem", "dapo", None): (0.44, 0.3379),
    ("math", "Llama-3.1-8B-Instruct", "mmlu_stem", "bfspo", None): (0.67, 0.5012),
    ("math", "Qwen2.5-7B-Instruct", "math500", "dapo", None): (0.15, 0.1389),
    ("math", "Qwen2.5-7B-Instruct", "math500", "bfspo", None): (0.30, 0.2497),
    ("math", "Qwen2.5-7B-Instruct", "minerva_math", "bfspo", None): (0.49, 0.4631),
    ("tokenskip-ratios", "Llama-3.1-8B-Instruct", "mmlu_stem", "tokenskip", 0.9): (0.16, 0.1276),
    ("tokenskip-ratios", "Llama-3.1-8B-Instruct", "mmlu_stem", "tokenskip", 0.8): (0.27, 0.2377),
    ("tokenskip-ratios", "Llama-3.1-8B-Instruct", "mmlu_stem", "tokenskip", 0.6): (0.43, 0.4039),
}


def _key(row) -> tuple:
    return (row.table, row.model, row.benchmark, row.method, None if pd.isna(row.ratio) else row.ratio)


# ------------------------------------------------------------------ AES


def test_aes_accuracy_gain_branch():
    # Qwen2.5-3B on GSM8K: 86.2% at 269 tokens against zero-shot 83.7% at 315 tokens.
    assert aes(86.2, 269, 83.7, 315) == pytest.approx(46 / 315 + 3 * 2.5 / 83.7, rel=1e-12)


def test_aes_accuracy_loss_branch():
    # Llama-3.1-8B TokenSkip on GSM8K: 81.1% at 129 tokens against 86.2% at 213 tokens.
    assert aes(81.1, 129, 86.2, 213) == pytest.approx(84 / 213 - 5 * 5.1 / 86.2, rel=1e-12)


def test_aes_weights_and_baseline():
    assert aes(50.0, 100, 50.0, 100) == 0.0
    assert aes(55.0, 100, 50.0, 100, beta=2.0) == pytest.approx(0.2)
    assert aes(45.0, 100, 50.0, 100, gamma=1.0) == pytest.approx(-0.1)
    assert aes(50.0, 50, 50.0, 100, alpha=2.0) == pytest.approx(1.0)
    assert aes(50.0, 150, 50.0, 100) == pytest.approx(-0.5)  # longer than the baseline


@pytest.mark.parametrize("base_acc, base_len", [(0.0, 100), (50.0, 0), (-1.0, 100)])
def test_aes_needs_a_positive_baseline(base_acc, base_len):
    with pytest.raises(BfspoError, match="positive baseline"):
        aes(50.0, 100, base_acc, base_len)


# ------------------------------------------------------------------ bootstrap


def test_bootstrap_ci_matches_the_normal_approximation():
    values = np.r_[np.ones(500), np.zeros(500)]
    lo, hi = bootstrap_ci(values, n_resamples=4000)
    half_width = 1.96 * np.sqrt(0.25 / 1000)
    assert lo == pytest.approx(0.5 - half_width, abs=0.006)
    assert hi == pytest.approx(0.5 + half_width, abs=0.006)


def test_bootstrap_ci_is_seeded_and_ordered():
    values = np.random.default_rng(1).normal(300, 50, size=200)
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    assert bootstrap_ci(values, seed=3) != bootstrap_ci(values, seed=4)
    lo90, hi90 = bootstrap_ci(values, level=0.90)
    lo99, hi99 = bootstrap_ci(values, level=0.99)
    assert lo99 < lo90 < values.mean() < hi90 < hi99


def test_bootstrap_ci_of_a_constant_is_that_constant():
    assert bootstrap_ci([7.0] * 10) == (7.0, 7.0)


@pytest.mark.parametrize("values, level", [([], 0.95), ([1.0], 1.0), ([1.0], 0.0)])
def test_bootstrap_ci_rejects_bad_input(values, level):
    with pytest.raises(BfspoError):
        bootstrap_ci(values, level=level)


# ------------------------------------------------------------------ the paper's printed AES


@pytest.fixture(scope="module")
def consistency():
    return aes_consistency(pd.read_csv(REPORTED))


def test_every_non_zero_shot_row_is_checked(consistency):
    reported = pd.read_csv(REPORTED)
    assert len(consistency) == (reported.method != "zero-shot").sum()
    assert "zero-shot" not in set(consistency.method)
    # The TokenSkip-ratio table has no zero-shot rows; it is scored against the main tables'.
    ratios = consistency[consistency.table == "tokenskip-ratios"]
    assert len(ratios) == 36 and set(ratios.baseline_table) == {"gsm8k", "math"}
    assert set(consistency[consistency.table != "tokenskip-ratios"].baseline_table) == {"ablation", "gsm8k", "math"}


def test_exactly_the_known_rows_disagree_with_the_formula(consistency):
    bad = consistency[~consistency.consistent]
    assert {_key(r) for r in bad.itertuples()} == set(DISAGREEING)
    for r in bad.itertuples():
        printed, recomputed = DISAGREEING[_key(r)]
        assert r.aes == printed
        assert r.aes_recomputed == pytest.approx(recomputed, abs=1e-4)
        assert not r.aes_min - 0.005 <= printed <= r.aes_max + 0.005


def test_consistent_rows_match_to_printed_precision(consistency):
    good = consistency[consistency.consistent]
    assert len(good) == len(consistency) - len(DISAGREEING)
    # The allowance for rounded inputs is small: the recomputed value is within 0.02 of the print.
    assert (good.aes - good.aes_recomputed).abs().max() < 0.02
    assert (good.aes_min <= good.aes_recomputed).all() and (good.aes_recomputed <= good.aes_max).all()


def test_a_row_that_contradicts_its_baseline_is_flagged():
    rows = pd.DataFrame([
        dict(table="t", model="m", train_set="s", benchmark="b", method="zero-shot", K=None, ratio=None,
             acc=50.0, avg_len=100, aes=0.0),
        dict(table="t", model="m", train_set="s", benchmark="b", method="ok", K=None, ratio=None,
             acc=50.0, avg_len=90, aes=0.1),
        dict(table="t", model="m", train_set="s", benchmark="b", method="off", K=None, ratio=None,
             acc=50.0, avg_len=90, aes=0.14),
        dict(table="t", model="m", train_set="s", benchmark="other", method="orphan", K=None, ratio=None,
             acc=50.0, avg_len=90, aes=0.1),
    ])
    result = aes_consistency(rows).set_index("method")
    assert list(result.index) == ["ok", "off"]  # the orphan row has no baseline to check against
    assert bool(result.loc["ok", "consistent"]) and not bool(result.loc["off", "consistent"])
