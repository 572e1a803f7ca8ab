"""The paired table's statistics (bfspo/reporting/paired.py) on hand-worked examples."""

import math

import pandas as pd
import pytest

from bfspo.errors import BfspoError
from bfspo.reporting.paired import (BEATS, LOSES, MATCHES, check_pairing, min_detectable_difference, paired_summary,
                                    paired_table, ratio_summary, verdict)

Z = 1.959964 + 0.841621  # z_0.975 + z_0.8


def test_mdd_is_z_sum_times_the_standard_error_of_the_differences():
    # d = [1, 3]: sd (n - 1) = sqrt(2), n = 2, so sd / sqrt(n) = 1
    assert min_detectable_difference([1, 3]) == pytest.approx(Z, abs=1e-5)
    # d = [0, 0, 6, 6]: sd = sqrt(12), sqrt(n) = 2
    assert min_detectable_difference([0, 0, 6, 6]) == pytest.approx(Z * math.sqrt(12) / 2, abs=1e-5)
    # alpha 0.05 with power 0.5 is z_0.975 alone
    assert min_detectable_difference([1, 3], power=0.5) == pytest.approx(1.959964, abs=1e-5)
    assert min_detectable_difference([5, 5, 5]) == 0 and math.isnan(min_detectable_difference([5]))
    with pytest.raises(BfspoError, match="alpha and power"):
        min_detectable_difference([1, 2], alpha=0)


def test_paired_bootstrap_interval_by_hand():
    # d = [0, 2]: a resample's mean is 0, 1 or 2 with probabilities 1/4, 1/2, 1/4, so its 2.5% and
    # 97.5% quantiles are 0 and 2
    s = paired_summary([0, 2], higher_is_better=True)
    assert (s["diff"], s["ci_low"], s["ci_high"], s["n"], s["verdict"]) == (1, 0, 2, 2, MATCHES)
    # identical differences: every resample has their mean
    s = paired_summary([3, 3, 3], higher_is_better=False)
    assert (s["ci_low"], s["ci_high"], s["mdd"], s["verdict"]) == (3, 3, 0, LOSES)
    assert paired_summary([float("nan"), 2, 2], True)["n"] == 2


@pytest.mark.parametrize("low, high, higher, expected", [
    (1, 2, True, BEATS), (1, 2, False, LOSES), (-2, -1, False, BEATS), (-2, -1, True, LOSES),
    (-1, 1, True, MATCHES), (0, 1, True, MATCHES),
])
def test_verdict_reads_the_interval_on_the_better_side(low, high, higher, expected):
    assert verdict(low, high, higher) == expected


def test_ratios_are_summarised_on_the_log_scale():
    s = ratio_summary([1, 4])  # log ratios 0 and log 4: geometric mean 2
    assert s["diff"] == pytest.approx(2) and (s["ci_low"], s["ci_high"]) == pytest.approx((1, 4))
    assert s["mdd"] == pytest.approx(math.exp(Z * math.log(4) / 2), rel=1e-5)
    assert ratio_summary([1.5, 1.5])["verdict"] == BEATS and ratio_summary([0.5, 0.5])["verdict"] == LOSES
    with pytest.raises(BfspoError, match="positive"):
        ratio_summary([1, 0])


def test_pairing_needs_one_model_one_data_one_seed_and_one_question_order():
    cfg = dict(model="m", train_data="d.jsonl", seed=3)
    check_pairing({"dapo": cfg, "bfspo": dict(cfg, k=3)}, {"dapo": ["a", "b", "c", "d"], "bfspo": ["a", "b"]}, 3)
    with pytest.raises(BfspoError, match="seed 3: the runs are not paired, their model differs"):
        check_pairing({"dapo": cfg, "bfspo": dict(cfg, model="other")}, {"dapo": [], "bfspo": []}, 3)
    with pytest.raises(BfspoError, match="dapo draws question x where another method draws b .draw 1."):
        check_pairing({"dapo": cfg, "bfspo": cfg}, {"dapo": ["a", "x", "c"], "bfspo": ["a", "b"]}, 3)


def test_paired_table_rows_by_hand():
    spec = dict(methods=[dict(key="dapo", label="DAPO"), dict(key="bfspo", label="BFS-PO")],
                columns=[dict(benchmark="toy", label="Toy", domain="in")])
    timing = dict(rollout_s=2.0, old_logprobs_s=1.0, update_s=1.0, step_s=4.0)
    seeds = pd.DataFrame([
        dict(method="dapo", seed=0, acc_toy=90, avg_len_toy=100, aes_toy=0.1, **timing),
        dict(method="dapo", seed=1, acc_toy=80, avg_len_toy=110, aes_toy=0.2, **timing),
        dict(method="bfspo", seed=0, acc_toy=92, avg_len_toy=90, aes_toy=0.1,
             **{k: v / 2 for k, v in timing.items()}),
        dict(method="bfspo", seed=1, acc_toy=84, avg_len_toy=104, aes_toy=0.2,
             **{k: v / 2 for k, v in timing.items()}),
    ])
    rows = paired_table(spec, seeds).set_index("metric")
    acc = rows.loc["Acc."]  # differences 2 and 4
    assert (acc.baseline, acc.value, acc["diff"], acc.ci_low, acc.ci_high) == (85, 88, 3, 2, 4)
    assert acc.mdd == pytest.approx(Z, abs=1e-5) and acc.verdict == BEATS
    length = rows.loc["Avg. Len."]  # differences -10 and -6: shorter is better
    assert (length["diff"], length.verdict) == (-8, BEATS)
    assert rows.loc["AES"].verdict == MATCHES and rows.loc["AES"].mdd == 0
    step = rows.loc["step ratio"]  # DAPO's step takes twice as long on both seeds
    assert (step["diff"], step.ci_low, step.baseline, step.value, step.verdict) == (2, 2, 4, 2, BEATS)
    assert list(rows.index) == ["Acc.", "Avg. Len.", "AES", "rollout ratio", "old_logprobs ratio", "update ratio",
                                "step ratio"]
