"""The paired table's statistics (bfspo/reporting/paired.py) on hand-worked examples."""

import json
import math

import pandas as pd
import pytest

from bfspo.errors import BfspoError
from bfspo.reporting.paired import (
    BEATS,
    LOSES,
    MATCHES,
    _contrast_sections,
    against_zero_shot,
    check_pairing,
    contrasts,
    min_detectable_difference,
    paired_summary,
    paired_table,
    ratio_summary,
    seed_band,
    t_quantile,
    verdict,
    window_means,
    window_table,
)

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


def test_runs_are_paired_by_the_content_of_their_inputs_not_their_paths(tmp_path):
    """Issue 39, finding 9: a run trained before the results folder moved records the old paths; its model
    and data are still those of the runs trained after."""
    import json

    from bfspo.reporting.paired import run_pairing

    inputs = {"train_data": {"rl.jsonl": "d1"}, "model": {"model.safetensors": "w1"}, "tokenizer": {"t.json": "t1"}}
    runs = {}
    for name, paths, data in (("a", ("old/model", "old/rl.jsonl"), "d1"), ("b", ("new/model", "new/train.jsonl"), "d1"),
                              ("c", ("new/model", "new/train.jsonl"), "d2")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model": paths[0], "train_data": paths[1], "seed": 3}))
        (tmp_path / name / "inputs.json").write_text(json.dumps(inputs | {"train_data": {"x.jsonl": data}}))
        runs[name] = run_pairing(tmp_path / name)
    check_pairing({"dapo": runs["a"], "bfspo": runs["b"]}, {"dapo": [], "bfspo": []}, 3)
    with pytest.raises(BfspoError, match="seed 3: the runs are not paired, their train_data differs"):
        check_pairing({"dapo": runs["a"], "bfspo": runs["c"]}, {"dapo": [], "bfspo": []}, 3)


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


def four_arms():
    """Two seeds of four arms; accuracy a: 80, 90; b: 82, 94; c: 85, 93; d: 81, 91 (timings equal)."""
    spec = dict(name="study", methods=[dict(key=k, label=k.upper()) for k in "abcd"],
                columns=[dict(benchmark="toy", label="Toy", domain="in")])
    timing = dict(rollout_s=2.0, old_logprobs_s=1.0, update_s=1.0, step_s=4.0)
    acc = {"a": (80, 90), "b": (82, 94), "c": (85, 93), "d": (81, 91)}
    seeds = pd.DataFrame([dict(method=m, seed=i, acc_toy=acc[m][i], avg_len_toy=100, aes_toy=0.1, **timing)
                          for m in "abcd" for i in (0, 1)])
    return spec, seeds


def test_contrasts_pair_any_two_arms_of_the_table():
    spec, seeds = four_arms()
    spec["contrasts"] = [dict(method="c", baseline="b", label="c - b: the filter"), dict(method="d", baseline="a"),
                         dict(method="b", baseline="d")]
    assert [(c["method"], c["baseline"], c["label"]) for c in contrasts(spec)] == [
        ("c", "b", "c - b: the filter"), ("d", "a", "D - A"), ("b", "d", "B - D")]
    rows = paired_table(spec, seeds)
    acc = rows[rows.metric == "Acc."].set_index(["method", "vs"])
    # c - b: differences +3 and -1; d - a: +1 and +1; b - d: +1 and +3
    assert acc.loc[("C", "B"), ["baseline", "value", "diff"]].tolist() == [88, 89, 1]
    assert acc.loc[("D", "A"), ["diff", "ci_low", "ci_high", "verdict"]].tolist() == [1, 1, 1, BEATS]
    assert acc.loc[("B", "D"), ["diff", "ci_low", "ci_high"]].tolist() == [2, 1, 3]
    assert len(rows) == 3 * (3 + 4)
    text = _contrast_sections(spec, rows)
    assert "### c - b: the filter\n\nC minus B." in text and "### B - D\n\nB minus D." in text
    # without contrasts: each method against the first, as before
    del spec["contrasts"]
    default = paired_table(spec, seeds)
    assert set(zip(default.method, default.vs)) == {("B", "A"), ("C", "A"), ("D", "A")}


@pytest.mark.parametrize("bad, message", [
    (dict(method="e", baseline="a"), "e not among the table's methods"),
    (dict(method="a", baseline="a"), "a method against itself"),
])
def test_a_contrast_must_name_two_arms_of_the_table(bad, message):
    spec, _ = four_arms()
    spec["contrasts"] = [bad]
    with pytest.raises(BfspoError, match=message):
        contrasts(spec)


def test_t_quantiles_are_students():
    # printed tables of t_{0.975, df} and t_{0.95, df}
    for df, q in [(1, 12.7062), (2, 4.3027), (3, 3.1824), (9, 2.2622), (10, 2.2281), (30, 2.0423)]:
        assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-4)
    assert t_quantile(0.95, 5) == pytest.approx(2.0150, abs=1e-4)
    with pytest.raises(BfspoError):
        t_quantile(0.975, 0)


def test_seed_band_is_the_mean_with_its_t_interval():
    curves = pd.DataFrame({0: [0.5, 0.6, 0.7], 1: [0.7, 0.8, float("nan")]}, index=[1, 2, 3])
    band = seed_band(curves)
    # step 1: mean 0.6, sd 0.1 * sqrt 2, n 2: half-width 12.706 * 0.1414 / 1.4142 = 1.2706
    assert band.loc[1, "mean"] == pytest.approx(0.6) and band.loc[1, "n"] == 2
    assert (band.loc[1, "low"], band.loc[1, "high"]) == pytest.approx((0.6 - 1.27062, 0.6 + 1.27062), abs=1e-4)
    assert band.loc[3, "mean"] == pytest.approx(0.7) and band.loc[3, "n"] == 1 and math.isnan(band.loc[3, "low"])


def test_each_arm_against_the_zero_shot_number():
    """a: 80 and 90 (mean 85, sd 7.07, t_0.975,1 = 12.706: 85 +- 63.5); c: 85 and 93 against 84."""
    spec, seeds = four_arms()
    seeds = pd.concat([seeds, seeds.assign(seed=seeds.seed + 2)])  # 4 seeds: each value twice
    rows = against_zero_shot(spec, seeds, pd.DataFrame([dict(benchmark="toy", acc=84.0)])).set_index("Method")
    # c: 85, 93, 85, 93: mean 89, sd 4.619, t_0.975,3 = 3.182: 89 +- 7.35 -> [81.7, 96.3], matches 84
    assert rows.loc["C", "Acc."] == "89.0" and rows.loc["C", "95% t-interval"] == "[81.7, 96.3]"
    assert rows.loc["C", "Verdict"] == MATCHES and rows.loc["C", "Seeds"] == "4"
    # d: 81, 91, 81, 91 -> mean 86; against 70 the whole interval [76.8, 95.2] is above: beats
    rows = against_zero_shot(spec, seeds, pd.DataFrame([dict(benchmark="toy", acc=70.0)])).set_index("Method")
    assert rows.loc["D", "Verdict"] == BEATS and against_zero_shot(spec, seeds, pd.DataFrame(
        [dict(benchmark="other", acc=70.0)])).empty


def test_window_means_split_a_run_into_consecutive_windows(tmp_path):
    """7 steps in 3 windows: steps 1-3, 4-5, 6-7 (the first window takes the remainder); a step
    without the key is left out of its window's mean."""
    rows = [{"step": i, "rollout/accuracy": a} for i, a in enumerate([0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.9], 1)]
    del rows[4]["rollout/accuracy"]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = window_means(tmp_path, "rollout/accuracy", 3)
    assert [(a, b) for a, b, _ in got] == [(1, 3), (4, 5), (6, 7)]
    assert [m for *_, m in got] == pytest.approx([0.2, 0.5, 0.9])
    assert [(a, b) for a, b, _ in window_means(tmp_path, "rollout/accuracy", 10)][:2] == [(1, 1), (2, 2)]
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(BfspoError, match="no steps"):
        window_means(tmp_path, "rollout/accuracy")


def test_window_table_pairs_the_curves_window_by_window():
    """a's first-sample accuracy per window 70, 80, 90 on both seeds; b's 60, 80, 92 and 62, 78, 94:
    b - a is -9 (early), -1 (middle), +3 (late); lengths equal."""
    spec, seeds = four_arms()
    spec["methods"], spec["contrasts"] = spec["methods"][:2], [dict(method="b", baseline="a", label="b - a")]
    seeds = seeds[seeds.method.isin(["a", "b"])].reset_index(drop=True)
    acc = {("a", 0): (70, 80, 90), ("a", 1): (70, 80, 90), ("b", 0): (60, 80, 92), ("b", 1): (62, 78, 94)}
    for i in range(3):
        seeds[f"first_acc_w{i + 1}"] = [acc[(m, s)][i] for m, s in zip(seeds.method, seeds.seed)]
        seeds[f"first_len_w{i + 1}"] = 80.0
        seeds[f"w{i + 1}_steps"] = ["1-10", "11-20", "21-30"][i]
    rows = window_table(spec, seeds)
    first = rows[rows.metric == "first-sample acc. (%)"].set_index("what")
    assert list(first.index) == ["steps 1-10", "steps 11-20", "steps 21-30"]
    assert first["diff"].tolist() == [-9, -1, 3]
    assert first.loc["steps 1-10", ["ci_low", "ci_high", "verdict"]].tolist() == [-10, -8, LOSES]
    assert first.loc["steps 21-30", ["ci_low", "ci_high", "verdict"]].tolist() == [2, 4, BEATS]
    assert first.loc["steps 11-20", "verdict"] == MATCHES
    length = rows[rows.metric == "first-sample length"]
    assert (length["diff"] == 0).all() and (length.verdict == MATCHES).all()
    # a run with fewer windows (a 2-step run) leaves the third out
    rows = window_table(spec, seeds.assign(first_acc_w3=float("nan"), first_len_w3=float("nan")))
    assert set(rows.what) == {"steps 1-10", "steps 11-20"}
