"""The `paired` table layout (issue 17): every method of a table against the first, seed by seed,
or the table's `contrasts` (issue 25: each a method against a baseline of the same table).

Seed s of every method starts from the same model, reads the training questions in the same
seeded order (`Trainer.next_questions`: the permutation depends on the seed and the epoch only)
and initialises LoRA from the same torch seed; the methods differ in how many questions a batch
takes. So seed s of two methods share their starting point and their data, and the per-seed
difference cancels what the seeds share. `check_pairing` verifies it from the runs themselves:
the same model and training data (by content: inputs.json, `run_pairing`) and seed, and question
orders of which the shorter is a prefix of the longer (the question ids of the logged trees, in the
order they were drawn).

For each contrast (by default: each method after the first against the first, the baseline),
each column and each metric (accuracy, average length, AES), with d_s = method - baseline on seed s
(n seeds):
- the mean of d_s, and its 95% interval: the percentile bootstrap over seeds of the mean of d_s
  (resampling seeds keeps each pair together: the paired bootstrap);
- the minimal detectable difference, MDD = (z_{1-alpha/2} + z_{power}) * sd(d) / sqrt(n): the
  smallest true mean difference that a two-sided test at level alpha finds with probability
  `power`, for differences as spread as the observed ones (normal approximation; alpha 0.05 and
  power 0.8 give 2.80 * sd / sqrt(n));
- the verdict: `beats` or `loses` when the interval excludes 0 (on the better or the worse side:
  higher accuracy and AES, shorter answers), `matches` when it contains 0.
Training time per step (Sec. 4.2, 1.37x in BFS-PO's favour): per seed, the ratio of the baseline's
median step time to the method's (> 1: the method is faster), for the rollout, the old log-probs,
the update and their sum (`timing/` of metrics.jsonl); its geometric mean over seeds, with the
interval and MDD computed on the log ratios and mapped back (an MDD of 1.10 means a ratio off 1 by
10%). The methods train on the same number of chains per batch (config `train_batch`).
Beside the verdict, the tree statistics of `bfspo tree stats` over all seeds of each method.
Learning curves (`seed_band`): per step, the mean over seeds of a metric of metrics.jsonl and its
95% t-interval, mean +- t_{0.975, n-1} * sd / sqrt(n) (`t_quantile`). The same curves, paired
(`window_table`): each run's first-sample accuracy and length (metrics.jsonl, before dynamic
sampling) averaged over N_WINDOWS consecutive windows of its steps, and per contrast and window the
paired difference with the same interval, MDD and verdict as the evaluation's metrics: whether a
gap opens early and closes, or grows, with training.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd

from bfspo.errors import BfspoError
from bfspo.evaluation.metrics import bootstrap_ci
from bfspo.io import atomic_write_set, read_json, read_jsonl
from bfspo.reporting.latex import latex_escape
from bfspo.reporting.tables import incomplete_marker
from bfspo.reporting.tree_stats import read_trees, tree_files, tree_stats

METRICS = [("acc", "Acc.", 1, True), ("avg_len", "Avg. Len.", 1, False), ("aes", "AES", 2, True)]
TIMINGS = [("rollout", "timing/rollout_s"), ("old_logprobs", "timing/old_logprobs_s"), ("update", "timing/update_s")]
BEATS, LOSES, MATCHES = "beats", "loses", "matches"
TREE_COLUMNS = ["trees", "trees_mixed", "trees_all_correct", "trees_all_wrong", "initial_accuracy",
                "expansion_accuracy", "equal_children", "shortening",
                *[f"{stat}_{kind}" for kind in ("mixed", "all_correct", "all_wrong", "all")
                  for stat in ("best_branch_advantage", "best_branch_dapo_advantage", "best_branch_negative")],
                "other_correct_advantage_mixed"]
N_RESAMPLES = 10000
# (name, metrics.jsonl key, scale, digits, higher is better, label): the curves `window_table` pairs
WINDOW_CURVES = [("first_acc", "rollout/accuracy", 100.0, 1, True, "first-sample acc. (%)"),
                 ("first_len", "rollout/len_mean", 1.0, 1, False, "first-sample length")]
N_WINDOWS = 3
DIGITS = {name: d for _, name, d, _ in METRICS} | {label: d for *_, d, _, label in WINDOW_CURVES}


# ---- the statistics -------------------------------------------------------------------------------


def min_detectable_difference(diffs, alpha: float = 0.05, power: float = 0.8) -> float:
    """(z_{1-alpha/2} + z_{power}) * sd(diffs) / sqrt(n), sd with n - 1: the smallest true mean
    difference a two-sided paired test at level `alpha` detects with probability `power` (normal
    approximation). NaN for fewer than two differences."""
    d = np.asarray(diffs, dtype=float)
    if not (0 < alpha < 1 and 0 < power < 1):
        raise BfspoError(f"alpha and power must lie in (0, 1), got {alpha} and {power}")
    if d.size < 2:
        return math.nan
    z = NormalDist().inv_cdf
    return float((z(1 - alpha / 2) + z(power)) * d.std(ddof=1) / math.sqrt(d.size))


def verdict(ci_low: float, ci_high: float, higher_is_better: bool) -> str:
    """`beats` when the interval of (method - baseline) lies wholly on the better side of 0,
    `loses` when wholly on the worse side, `matches` when it contains 0."""
    if ci_low > 0 or ci_high < 0:
        return BEATS if (ci_low > 0) == higher_is_better else LOSES
    return MATCHES


def paired_summary(diffs, higher_is_better: bool, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """Mean of the per-seed differences, its paired-bootstrap 95% interval, the MDD and the verdict."""
    d = np.asarray(diffs, dtype=float)
    d = d[~np.isnan(d)]
    if d.size == 0:
        return dict(diff=math.nan, ci_low=math.nan, ci_high=math.nan, mdd=math.nan, n=0, verdict="-")
    lo, hi = bootstrap_ci(d, n_resamples=n_resamples, seed=seed)
    return dict(diff=float(d.mean()), ci_low=lo, ci_high=hi, mdd=min_detectable_difference(d), n=int(d.size),
                verdict=verdict(lo, hi, higher_is_better))


def ratio_summary(ratios, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """`paired_summary` of per-seed ratios (> 1 is better; NaN: missing) on the log scale, mapped
    back: the geometric mean, its interval, and the MDD as a factor (exp of the log-scale MDD)."""
    r = np.asarray(ratios, dtype=float)
    r = r[~np.isnan(r)]
    if np.any(r <= 0):
        raise BfspoError(f"step-time ratios must be positive, got {r.tolist()}")
    s = paired_summary(np.log(r), higher_is_better=True, n_resamples=n_resamples, seed=seed)
    return s | {k: math.exp(s[k]) for k in ("diff", "ci_low", "ci_high", "mdd") if not math.isnan(s[k])}


def t_quantile(p: float, df: int) -> float:
    """The p-quantile (p in (0.5, 1)) of Student's t with `df` >= 1 degrees of freedom: bisection on
    P(|T| <= t) = 2p - 1, in the closed forms for integer df (Abramowitz & Stegun 26.7.3-4)."""
    if not (0.5 < p < 1 and df >= 1):
        raise BfspoError(f"t_quantile needs p in (0.5, 1) and df >= 1, got {p} and {df}")

    def central(t: float) -> float:  # P(|T| <= t)
        theta = math.atan(t / math.sqrt(df))
        c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
        for j in range(2 if df % 2 == 0 else 3, df - 1, 2):  # 1 + (1/2) c^2 + (1.3)/(2.4) c^4 + ...
            term *= c2 * (j - 1) / j
            total += term
        if df % 2 == 0:
            return math.sin(theta) * total
        return 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0))

    lo, hi = 0.0, 1.0
    while central(hi) < 2 * p - 1:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if central(mid) < 2 * p - 1 else (lo, mid)
    return (lo + hi) / 2


def seed_band(curves: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per row (a step) of `curves` (one column per seed; NaN where a seed has no value): the mean
    over seeds, the number of seeds, and the t-interval mean +- t_{(1+level)/2, n-1} * sd / sqrt(n)
    (NaN with fewer than two seeds)."""
    n = curves.notna().sum(axis=1)
    mean, sd = curves.mean(axis=1), curves.std(axis=1, ddof=1)
    half = pd.Series([t_quantile((1 + level) / 2, int(k) - 1) if k > 1 else math.nan for k in n], index=curves.index)
    half = half * sd / np.sqrt(n)
    return pd.DataFrame({"mean": mean, "low": mean - half, "high": mean + half, "n": n})


# ---- the runs ---------------------------------------------------------------------------------------


def median_timings(run_dir: Path) -> dict[str, float]:
    """Median seconds per training step of each TIMINGS component and of their sum ("step")."""
    rows = [r for _, r in read_jsonl(run_dir / "metrics.jsonl", skipped=[])]
    if not rows:
        raise BfspoError(f"{run_dir}: metrics.jsonl has no steps")
    frame = pd.DataFrame([{name: r.get(key, math.nan) for name, key in TIMINGS} for r in rows]).fillna(0.0)
    return {**{name: float(frame[name].median()) for name, _ in TIMINGS}, "step": float(frame.sum(axis=1).median())}


def window_means(run_dir: Path, key: str, n_windows: int = N_WINDOWS) -> list[tuple[int, int, float]]:
    """The run's `key` of metrics.jsonl averaged over `n_windows` consecutive windows of its steps, as
    equal as they can be (np.array_split: the first windows take the remainder; one window per step
    when the run has fewer steps): (first step, last step, mean) per window; steps without the key
    are left out of the mean."""
    rows = [r for _, r in read_jsonl(run_dir / "metrics.jsonl", skipped=[])]
    if not rows:
        raise BfspoError(f"{run_dir}: metrics.jsonl has no steps")
    out = []
    for window in np.array_split(np.arange(len(rows)), min(n_windows, len(rows))):
        values = [rows[i].get(key, math.nan) for i in window]
        values = [v for v in values if v is not None and not math.isnan(v)]
        out.append((rows[window[0]]["step"], rows[window[-1]]["step"], float(np.mean(values)) if values else math.nan))
    return out


def logged_trees(run_dirs: list[Path], orders: dict[Path, list[str]]):
    """The logged trees of the runs, one run after another, as `read_trees` yields them; the
    question id of each is appended to orders[run_dir] (the run's question order)."""
    for run_dir in run_dirs:
        order = orders.setdefault(run_dir, [])
        for d, tree in read_trees(tree_files([run_dir])):
            order.append(d["meta"]["question_id"])
            yield d, tree


def run_pairing(run_dir: Path) -> dict:
    """What pairs a run with another: its seed (config.json) and its model, tokenizer and training
    data by content, as inputs.json records them (a run is its inputs' content, not their paths:
    docs/workflow.md), or by path for a run that recorded none."""
    from bfspo.fingerprint import RUN_INPUTS

    config = read_json(run_dir / "config.json")
    inputs = read_json(run_dir / RUN_INPUTS) if (run_dir / RUN_INPUTS).is_file() else {}
    model = {k: inputs[k] for k in ("model", "tokenizer") if k in inputs} or config.get("model")
    data = sorted(inputs["train_data"].values()) if isinstance(inputs.get("train_data"), dict) else config.get("train_data")
    return {"model": model, "train_data": data, "seed": config.get("seed")}


def check_pairing(configs: dict[str, dict], orders: dict[str, list[str]], seed) -> None:
    """The runs of one seed (method -> `run_pairing`, method -> question order) share their model,
    training data and seed, and the shorter question order is a prefix of every longer one."""
    for key in ("model", "train_data", "seed"):
        values = {m: c.get(key) for m, c in configs.items()}
        if len(set(map(str, values.values()))) > 1:
            raise BfspoError(f"seed {seed}: the runs are not paired, their {key} differs: {values}")
    shortest = min(orders.values(), key=len)
    for method, order in orders.items():
        if order[: len(shortest)] != shortest:
            first = next(i for i, (a, b) in enumerate(zip(order, shortest)) if a != b)
            raise BfspoError(f"seed {seed}: the runs are not paired, {method} draws question {order[first]} "
                             f"where another method draws {shortest[first]} (draw {first})")


# ---- the tables -------------------------------------------------------------------------------------


def per_seed(spec: dict, scored: pd.DataFrame, runs_dir: Path) -> tuple[pd.DataFrame, dict]:
    """One row per (method, seed): each column's metrics, the run's median step timings and the
    questions it drew; and method -> tree statistics over all its seeds. Checks the pairing."""
    model = spec["models"][0]["key"]
    train_set = spec["columns"][0]["train_set"]
    trained = scored[(scored.model == model) & (scored.train_set == train_set)]
    rows, trees, by_seed = [], {}, {}
    for method in (m["key"] for m in spec["methods"]):
        runs = {seed: g for seed, g in trained[trained.method == method].groupby("seed", sort=True)}
        orders = {}
        trees[method] = tree_stats(logged_trees([runs_dir / g.run.iloc[0] for g in runs.values()], orders))
        for seed, g in runs.items():
            run_dir = runs_dir / g.run.iloc[0]
            by_seed.setdefault(seed, {})[method] = (run_pairing(run_dir), orders[run_dir])
            row = dict(method=method, seed=seed, run=g.run.iloc[0], questions_drawn=len(orders[run_dir]))
            for col in spec["columns"]:
                cell = g[g.benchmark == col["benchmark"]]
                for metric, *_ in METRICS:
                    row[f"{metric}_{col['benchmark']}"] = float(cell[metric].iloc[0]) if len(cell) else math.nan
            row |= {f"{k}_s": v for k, v in median_timings(run_dir).items()}
            for name, key, scale, *_ in WINDOW_CURVES:
                for i, (first, last, mean) in enumerate(window_means(run_dir, key), start=1):
                    row |= {f"{name}_w{i}": mean * scale, f"w{i}_steps": f"{first}-{last}"}
            rows.append(row)
    for seed, runs in by_seed.items():
        check_pairing({m: c for m, (c, _) in runs.items()}, {m: o for m, (_, o) in runs.items()}, seed)
    return pd.DataFrame(rows), trees


def contrasts(spec: dict) -> list[dict]:
    """The table's contrasts, each {method, baseline, label} (method keys): the spec's `contrasts`, or
    by default each method after the first against the first. A name that is not one of the table's
    methods, or a method against itself, is an error."""
    keys = [m["key"] for m in spec["methods"]]
    given = spec.get("contrasts") or [dict(method=m, baseline=keys[0]) for m in keys[1:]]
    labels = {m["key"]: m["label"] for m in spec["methods"]}
    out = []
    for c in given:
        unknown = [c[k] for k in ("method", "baseline") if c[k] not in keys]
        if unknown or c["method"] == c["baseline"]:
            raise BfspoError(f"table {spec.get('name')}: contrast {c['method']} - {c['baseline']}: "
                             + (f"{', '.join(unknown)} not among the table's methods ({', '.join(keys)})" if unknown
                                else "a method against itself"))
        out.append(dict(method=c["method"], baseline=c["baseline"],
                        label=c.get("label") or f"{labels[c['method']]} - {labels[c['baseline']]}"))
    return out


def contrast_seeds(seeds: pd.DataFrame, contrast: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.Index]:
    """The per-seed rows of a contrast's baseline and method, indexed by seed, and the seeds both ran."""
    base = seeds[seeds.method == contrast["baseline"]].set_index("seed")
    other = seeds[seeds.method == contrast["method"]].set_index("seed")
    return base, other, base.index.intersection(other.index)


def paired_table(spec: dict, seeds: pd.DataFrame) -> pd.DataFrame:
    """One row per (contrast, column or timing, metric): the method, the baseline it is compared with
    (`vs`), the two means, the paired difference (or ratio), its interval, the MDD, the number of
    pairs and the verdict."""
    labels = {m["key"]: m["label"] for m in spec["methods"]}
    rows = []
    for contrast in contrasts(spec):
        method, vs = labels[contrast["method"]], labels[contrast["baseline"]]
        base, other, common = contrast_seeds(seeds, contrast)
        for col in spec["columns"]:
            for metric, name, _, better in METRICS:
                key = f"{metric}_{col['benchmark']}"
                d = other.loc[common, key] - base.loc[common, key]
                rows.append(dict(method=method, vs=vs, what=f"{col['label']} ({col.get('domain', '')})", metric=name,
                                 baseline=base.loc[common, key].mean(), value=other.loc[common, key].mean(),
                                 **paired_summary(d.to_numpy(), better)))
        for part in [name for name, _ in TIMINGS] + ["step"]:
            key = f"{part}_s"
            b, o = base.loc[common, key], other.loc[common, key]
            ratio = (b / o).where((b > 0) & (o > 0))  # a run without updates has no update time
            rows.append(dict(method=method, vs=vs, what="step time", metric=f"{part} ratio",
                             baseline=base.loc[common, key].median(), value=other.loc[common, key].median(),
                             **ratio_summary(ratio.to_numpy())))
    return pd.DataFrame(rows)


def window_table(spec: dict, seeds: pd.DataFrame) -> pd.DataFrame:
    """`paired_table`'s rows for the training curves: per contrast, curve (WINDOW_CURVES) and window
    of steps, the paired difference of the runs' window means (`window_means`), with its interval,
    MDD and verdict. A window is named by the baseline's steps; a window some runs lack (they ran
    fewer steps than N_WINDOWS) is compared over the seeds that have it."""
    labels = {m["key"]: m["label"] for m in spec["methods"]}
    rows = []
    for contrast in contrasts(spec):
        base, other, common = contrast_seeds(seeds, contrast)
        for name, _, _, _, better, label in WINDOW_CURVES:
            for i in range(1, N_WINDOWS + 1):
                key = f"{name}_w{i}"
                if key not in seeds or not base.loc[common, key].notna().any():
                    continue
                d = other.loc[common, key] - base.loc[common, key]
                rows.append(dict(method=labels[contrast["method"]], vs=labels[contrast["baseline"]],
                                 what=f"steps {base.loc[common, f'w{i}_steps'].dropna().iloc[0]}", metric=label,
                                 baseline=base.loc[common, key].mean(), value=other.loc[common, key].mean(),
                                 **paired_summary(d.to_numpy(), better)))
    return pd.DataFrame(rows)


def _fmt(x: float, digits: int) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def format_paired(spec: dict, table: pd.DataFrame) -> pd.DataFrame:
    """The paired table as the Markdown shows it. When the rows share one baseline its mean is headed
    by its label; otherwise each row names its contrast ("method vs baseline")."""
    vs = table.vs.unique() if len(table) else [spec["methods"][0]["label"]]
    base_label = vs[0] if len(vs) == 1 else "Baseline mean"
    out = []
    for r in table.itertuples():
        timing = r.what == "step time"
        d = 2 if timing else DIGITS[r.metric]
        out.append({
            "Method": r.method if len(vs) == 1 else f"{r.method} vs {r.vs}", "Column": r.what, "Metric": r.metric,
            base_label: _fmt(r.baseline, d) + (" s" if timing else ""),
            "Method mean": _fmt(r.value, d) + (" s" if timing else ""),
            "Difference": (f"{_fmt(r.diff, 2)}x" if timing else f"{r.diff:+.{d}f}"),
            "95% interval": (f"[{_fmt(r.ci_low, 2)}x, {_fmt(r.ci_high, 2)}x]" if timing
                             else f"[{r.ci_low:+.{d}f}, {r.ci_high:+.{d}f}]"),
            "MDD (80%)": f"{_fmt(r.mdd, 2)}x" if timing else _fmt(r.mdd, d),
            "Pairs": str(r.n), "Verdict": r.verdict,
        })
    return pd.DataFrame(out)


def format_trees(spec: dict, trees: dict, seeds: pd.DataFrame) -> pd.DataFrame:
    """The tree statistics of each method (a column each), one statistic per row."""
    labels = {m["key"]: m["label"] for m in spec["methods"]}
    columns = {}
    for method, stats in trees.items():
        column = {"questions drawn per run": _fmt(float(seeds[seeds.method == method].questions_drawn.mean()), 0)}
        for key in TREE_COLUMNS:
            value = stats[key]
            column[key] = str(value) if key.startswith("trees") else _fmt(math.nan if value is None else value, 3)
        columns[labels[method]] = column
    return pd.DataFrame(columns).rename_axis("statistic").reset_index()


def against_zero_shot(spec: dict, seeds: pd.DataFrame, zero: pd.DataFrame) -> pd.DataFrame:
    """Each method's accuracy per column against the zero-shot model's (one greedy number, no seeds):
    the mean over seeds, its 95% t-interval, and the verdict of that interval against the number."""
    rows = []
    for col in spec["columns"]:
        z = zero[zero.benchmark == col["benchmark"]]
        if not len(z):
            continue
        z_acc = float(z.acc.iloc[0])
        for m in spec["methods"]:
            band = seed_band(seeds[seeds.method == m["key"]][[f"acc_{col['benchmark']}"]].T).iloc[0]
            rows.append({"Method": m["label"], "Column": f"{col['label']} ({col.get('domain', '')})",
                         "Acc.": _fmt(band["mean"], 1), "95% t-interval": f"[{_fmt(band.low, 1)}, {_fmt(band.high, 1)}]",
                         "Zero-shot": _fmt(z_acc, 1), "Seeds": str(int(band.n)),
                         "Verdict": "-" if math.isnan(band.low) else verdict(band.low - z_acc, band.high - z_acc, True)})
    return pd.DataFrame(rows)


def _contrast_sections(spec: dict, table: pd.DataFrame) -> str:
    """The paired table as Markdown: one table, or one section per contrast when the spec sets them."""
    if not spec.get("contrasts"):
        return format_paired(spec, table).to_markdown(index=False, disable_numparse=True)
    sections = []
    for c in contrasts(spec):
        labels = {m["key"]: m["label"] for m in spec["methods"]}
        rows = table[(table.method == labels[c["method"]]) & (table.vs == labels[c["baseline"]])]
        sections.append(f"### {c['label']}\n\n{labels[c['method']]} minus {labels[c['baseline']]}.\n\n"
                        + format_paired(spec, rows).to_markdown(index=False, disable_numparse=True))
    return "\n\n".join(sections)


def write_paired(spec: dict, scored: pd.DataFrame, runs_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """DIR/<name>.csv (the paired table as numbers), .md, .tex, and <name>_seeds.csv (per-seed rows)."""
    if len(spec["models"]) != 1 or len({c["train_set"] for c in spec["columns"]}) != 1 or len(spec["methods"]) < 2:
        raise BfspoError(f"table {spec['name']}: the paired layout needs one model, one train set and at least "
                         "two methods (the first is the baseline)")
    seeds, trees = per_seed(spec, scored, Path(runs_dir))
    table = paired_table(spec, seeds)
    shown = format_paired(spec, table)
    out = Path(out_dir)
    paths = [out / f"{spec['name']}.{ext}" for ext in ("csv", "md", "tex")] + [out / f"{spec['name']}_seeds.csv"]
    base = "the contrast's baseline" if spec.get("contrasts") else spec["methods"][0]["label"]
    zero = scored[scored.method == "zero-shot"]
    zero_text = "; ".join(f"{c['label']}: {r.acc:.1f}% with {r.avg_len:.0f} tokens" for c in spec["columns"]
                          for r in zero[zero.benchmark == c["benchmark"]].itertuples())
    texts = {paths[3]: seeds.to_csv(index=False), paths[0]: table.to_csv(index=False)}
    texts[paths[1]] = (
        f"## {spec['title']}\n\n{_contrast_sections(spec, table)}\n\n"
        f"Difference: method minus {base}, mean over the seeds both ran (paired); the interval is the "
        f"percentile bootstrap over seeds ({N_RESAMPLES} resamples) of that mean. Step time: {base}'s median "
        "step time over the method's, per seed (> 1: the method is faster), geometric mean over seeds. "
        "MDD (80%): the smallest difference this many seeds detects with 80% power at alpha 0.05, "
        "(z_0.975 + z_0.8) * sd(differences) / sqrt(pairs). Verdict: beats / loses when the interval "
        "excludes 0 (a ratio of 1) on the method's better / worse side, matches when it does not. "
        f"Pairing checked: per seed, the same model, training data and seed, and one question order. "
        f"Zero-shot (greedy, the AES baseline): {zero_text}.\n\n"
        f"### Against the zero-shot model (accuracy, mean over seeds and its 95% t-interval)\n\n"
        f"{against_zero_shot(spec, seeds, zero).to_markdown(index=False, disable_numparse=True)}\n\n"
        f"### First samples during training, per window of steps (paired)\n\n"
        "Each run's first-sample accuracy and length per step (metrics.jsonl, every generated question "
        f"before dynamic sampling), averaged over {N_WINDOWS} windows of its steps; then as above, per "
        "contrast and window.\n\n"
        f"{format_paired(spec, window_table(spec, seeds)).to_markdown(index=False, disable_numparse=True)}\n\n"
        f"### Tree statistics (`bfspo tree stats` over all seeds of each method)\n\n"
        f"{format_trees(spec, trees, seeds).to_markdown(index=False, disable_numparse=True)}\n")
    texts[paths[2]] = shown.map(latex_escape).rename(columns=latex_escape).style.hide(axis="index").to_latex(
        hrules=True, caption=latex_escape(spec["title"]), label=f"tab:{spec['name']}")
    atomic_write_set(texts, incomplete_marker(out, spec["name"]))
    return paths
