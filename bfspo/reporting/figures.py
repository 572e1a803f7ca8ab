"""`bfspo figures`: the figures of one table (matplotlib, Agg; each as PNG and PDF).

    bfspo figures --spec JSON --summaries S.json ... [--runs-dir results/runs] [--reported CSV] --out-dir DIR

  pareto_<train set>_<benchmark>   accuracy against average length, one panel per model: every
                                   method of ours (the mean over seeds, with the table's 95%
                                   interval: over seeds, or over questions for a single seed), the
                                   paper's and the reported numbers as hollow markers, and the
                                   Pareto front of ours (no other point is both shorter and at
                                   least as accurate);
  curves_<model>_<train set>       reward, accuracy (%) and mean length against step, one line per
                                   method: the EMA-smoothed mean over seeds (bfspo.reporting.style)
                                   over a faint raw line, with a ± std band over seeds, from each
                                   run's metrics.jsonl;
  backtracking_<model>_<train set> where the search backtracked, one row of panels per method: the
                                   share of backtracking tokens per bin of depth, in tokens and
                                   relative to its path's length (so methods with more trees
                                   compare), from the runs' trees/*.jsonl ("backtracking" records
                                   of SearchTree.to_dict);
  paired                           (the `paired` layout only) each contrast (by default each method
                                   minus the first), seed by seed, with the paired table's mean and
                                   95% interval, per column and metric, and the step-time ratio
                                   (bfspo/reporting/paired.py);
  seed_bands_<model>_<train set>   (the `paired` layout only) first-sample accuracy (%) and length
                                   against step, one line per method: each seed's EMA, then the
                                   mean over seeds with its 95% t-interval as a band.

Every method has one colour in every figure of its table, distinct from the others' (bfspo.reporting.style).
Accuracy is in percent everywhere, as in the tables.

The spec and the summaries are those of `bfspo tables build`; training runs are found as
<runs-dir>/<meta.run>.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from bfspo.errors import BfspoError
from bfspo.io import read_jsonl
from bfspo.reporting.style import BAND_ALPHA, EMA_ALPHA, distinct_colours, ema, method_colours
from bfspo.reporting.summaries import (
    ZERO_SHOT,
    aggregate,
    check_trained_on,
    load_reported,
    load_spec,
    load_summaries,
    score,
)

# The learning curves: metrics.jsonl key, axis label, and the factor to it (accuracy in percent, as in
# the tables and the Pareto figures)
CURVES = [("rollout/reward_mean", "reward", 1.0), ("rollout/accuracy", "accuracy of the first samples (%)", 100.0),
          ("rollout/len_mean", "mean length (tokens)", 1.0)]
# The paired layout's learning curves with seed bands: every generated tree's G first samples; the
# band is drawn within the metric's range
BAND_CURVES = [("rollout/accuracy", "accuracy of the first samples (%)", 100.0, (0.0, 100.0)),
               ("rollout/len_mean", "mean length of the first samples (tokens)", 1.0, (0.0, None))]


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (length, accuracy) points that no other point dominates (shorter or equal
    and at least as accurate, strictly better in one), ordered by length."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.{ext}" for ext in ("png", "pdf")]
    for path in paths:
        tmp = path.with_name(f".{path.name}.tmp")
        fig.savefig(tmp, format=path.suffix[1:], dpi=150, bbox_inches="tight")
        tmp.replace(path)
    _pyplot().close(fig)
    return paths


def _method_labels(spec: dict) -> dict[str, str]:
    """method key -> a label that tells methods of equal name apart (BFS-PO K=1, K=2, ...)."""
    labels = {ZERO_SHOT: "Zero-shot"}
    names = [m["label"] for m in spec["methods"]]
    for m in spec["methods"]:
        labels[m["key"]] = f"{m['label']} K={m['k']}" if names.count(m["label"]) > 1 else m["label"]
    return labels


def _colours(spec: dict) -> dict[str, str]:
    """method key -> its colour (zero-shot included), the same in every figure of the table."""
    return method_colours([{"key": ZERO_SHOT}, *spec["methods"]])


def _labels_of(spec: dict) -> tuple[dict[str, str], dict[str, str]]:
    """(model key -> label, train set -> label) from the spec."""
    models = {m["key"]: m["label"] for m in spec["models"]}
    train_sets = {c["train_set"]: c.get("train_label", c["train_set"]) for c in spec["columns"]}
    return models, train_sets


def pareto_figures(spec: dict, summaries: pd.DataFrame, reported: pd.DataFrame, out_dir: Path) -> list[Path]:
    plt = _pyplot()
    ours = aggregate(score(summaries))
    labels, colours = _method_labels(spec), _colours(spec)
    tables = spec.get("paper_tables", []) + ([spec["reported"]["table"]] if spec.get("reported") else [])
    paths = []
    for col in spec["columns"]:
        fig, axes = plt.subplots(1, len(spec["models"]), figsize=(5 * len(spec["models"]), 4), squeeze=False)
        for ax, model in zip(axes[0], spec["models"]):
            points, names = [], []
            for key in [ZERO_SHOT] + [m["key"] for m in spec["methods"]]:
                cell = ours.get((model["key"], key, "" if key == ZERO_SHOT else col["train_set"], col["benchmark"]))
                if cell is None:
                    continue
                acc, length = cell["acc"], cell["avg_len"]
                ax.errorbar(length.mean, acc.mean, xerr=interval_err(length), yerr=interval_err(acc), fmt="o",
                            capsize=3, color=colours[key], label=labels[key])
                points.append((length.mean, acc.mean))
                names.append(key)
            if points:
                front = [points[i] for i in pareto_front(points)]
                ax.scatter([p[0] for p in front], [p[1] for p in front], s=160, facecolors="none", edgecolors="black",
                           label="Pareto front (ours)")
                ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="black", lw=1, ls="--")
            paper = reported[reported.table.isin(tables) & (reported.model == model["label"])
                             & (reported.benchmark == col["benchmark"]) & (reported.train_set == col["train_set"])]
            paper = paper.drop_duplicates(["method", "ratio", "K"])
            for r in paper.itertuples():
                tag = r.method + (f" r={r.ratio:.1f}" if not pd.isna(r.ratio) else "") + (f" K={int(r.K)}" if not pd.isna(r.K) else "")
                ax.scatter(r.avg_len, r.acc, facecolors="none", edgecolors="grey", s=30)
                ax.annotate(tag, (r.avg_len, r.acc), fontsize=6, color="grey", xytext=(3, 3), textcoords="offset points")
            ax.set_title(f"{model['label']}: {col['label']} (trained on {col.get('train_label', col['train_set'])})\n"
                         "bars: 95% interval (over seeds; one seed: over questions)", fontsize=9)
            ax.set_xlabel("average length (tokens)")
            ax.set_ylabel("accuracy (%)")
            ax.grid(alpha=0.3)
            if points:
                ax.legend(fontsize=7)
        paths += _save(fig, out_dir, f"pareto_{col['train_set']}_{col['benchmark']}")
    return paths


def interval_err(stat) -> list[list[float]] | None:
    """An error bar from a cell's 95% interval: [[below], [above]] the mean, or None without one."""
    if math.isnan(stat.ci_low) or math.isnan(stat.ci_high):
        return None
    return [[max(stat.mean - stat.ci_low, 0.0)], [max(stat.ci_high - stat.mean, 0.0)]]


def _trained_runs(spec: dict, summaries: pd.DataFrame, runs_dir: Path) -> pd.DataFrame:
    """One row per training run of the table: model, train_set, method, seed, dir."""
    runs = summaries[
        summaries.method.isin([m["key"] for m in spec["methods"]])
        & summaries.model.isin([m["key"] for m in spec["models"]])
        & summaries.train_set.isin([c["train_set"] for c in spec["columns"]])
    ].drop_duplicates("run")
    return runs.assign(dir=[runs_dir / r for r in runs.run])[["model", "train_set", "method", "seed", "dir"]]


def load_metrics(run_dir: Path) -> pd.DataFrame:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return pd.DataFrame()
    return pd.DataFrame([row for _, row in read_jsonl(path)])


def _seed_curves(frames: list[pd.DataFrame], key: str, scale: float = 1.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(raw, EMA-smoothed) values of `key` times `scale`: one column per seed, indexed by step."""
    raw = pd.concat([f.set_index("step")[key].rename(i) * scale for i, f in enumerate(frames) if key in f.columns],
                    axis=1)
    return raw, raw.apply(lambda col: ema(col.dropna()))


def curve_figures(spec: dict, runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    labels, colours = _method_labels(spec), _colours(spec)
    model_labels, train_labels = _labels_of(spec)
    paths = []
    for (model, train_set), group in runs.groupby(["model", "train_set"], sort=False):
        fig, axes = plt.subplots(1, len(CURVES), figsize=(5 * len(CURVES), 3.6))
        drawn = False
        for method in [m["key"] for m in spec["methods"]]:
            frames = [load_metrics(d) for d in group[group.method == method].dir]
            frames = [f for f in frames if len(f) and "step" in f.columns]
            for ax, (key, _, scale) in zip(axes, CURVES):
                if not any(key in f.columns for f in frames):
                    continue
                raw, smooth = _seed_curves(frames, key, scale)
                colour, mean = colours[method], smooth.mean(axis=1)
                ax.plot(raw.index, raw.mean(axis=1), color=colour, alpha=0.25, lw=0.8)
                ax.plot(mean.index, mean, color=colour, lw=1.8, label=f"{labels[method]} ({raw.shape[1]} seed{'s' if raw.shape[1] > 1 else ''})")
                if raw.shape[1] > 1:  # a light band with its edges drawn: overlapping bands keep both hues
                    sd = smooth.std(axis=1)
                    ax.fill_between(mean.index, mean - sd, mean + sd, color=colour, alpha=BAND_ALPHA, lw=0)
                    for edge in (mean - sd, mean + sd):
                        ax.plot(mean.index, edge, color=colour, lw=0.6, alpha=0.6, ls=":")
                drawn = True
        for ax, (_, name, _) in zip(axes, CURVES):
            ax.set_xlabel("step")
            ax.set_ylabel(name)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        if not drawn:
            plt.close(fig)
            print(f"no metrics.jsonl for {model} / {train_set}: no training curves", file=sys.stderr)
            continue
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{model_labels.get(model, model)}, trained on {train_labels.get(train_set, train_set)}: "
                     f"EMA (alpha {EMA_ALPHA}) of the mean over seeds, ± std band; faint: raw mean", fontsize=10)
        fig.tight_layout()
        paths += _save(fig, out_dir, f"curves_{model}_{train_set}")
    return paths


def seed_band_figures(spec: dict, runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """BAND_CURVES against step, one line per method: each seed's curve smoothed by the EMA
    (bfspo.reporting.style), then the mean over seeds and its 95% t-interval
    (bfspo.reporting.paired.seed_band), drawn within the metric's range with its edges dotted; a
    faint line is the raw mean over seeds."""
    from matplotlib.ticker import MaxNLocator

    from bfspo.reporting.paired import seed_band

    plt = _pyplot()
    labels, colours = _method_labels(spec), _colours(spec)
    model_labels, train_labels = _labels_of(spec)
    paths = []
    for (model, train_set), group in runs.groupby(["model", "train_set"], sort=False):
        fig, axes = plt.subplots(1, len(BAND_CURVES), figsize=(6 * len(BAND_CURVES), 4), squeeze=False)
        drawn = False
        for method in [m["key"] for m in spec["methods"]]:
            frames = [f for f in (load_metrics(d) for d in group[group.method == method].dir) if len(f) and "step" in f]
            for ax, (key, _, scale, (low, high)) in zip(axes[0], BAND_CURVES):
                if not any(key in f.columns for f in frames):
                    continue
                raw, smooth = _seed_curves(frames, key, scale)
                band, colour = seed_band(smooth), colours[method]
                ax.plot(raw.index, raw.mean(axis=1), color=colour, alpha=0.25, lw=0.8)
                ax.plot(band.index, band["mean"], color=colour, lw=1.8, label=f"{labels[method]} ({raw.shape[1]} seeds)")
                edges = (band.low.clip(low, high), band.high.clip(low, high))
                ax.fill_between(band.index, *edges, color=colour, alpha=BAND_ALPHA, lw=0)
                for edge in edges:
                    ax.plot(band.index, edge, color=colour, lw=0.6, alpha=0.6, ls=":")
                drawn = True
        if not drawn:
            plt.close(fig)
            print(f"no metrics.jsonl for {model} / {train_set}: no seed-band curves", file=sys.stderr)
            continue
        for ax, (_, name, _, _) in zip(axes[0], BAND_CURVES):
            ax.set_xlabel("training step")
            ax.set_ylabel(name)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        handles, names = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(3, len(names)), fontsize=8,
                   frameon=False)
        fig.suptitle(f"{model_labels.get(model, model)}, trained on {train_labels.get(train_set, train_set)}: "
                     f"mean over seeds of each seed's EMA (alpha {EMA_ALPHA}), band: 95% t-interval over seeds; "
                     "faint: raw mean", fontsize=9)
        fig.tight_layout()
        paths += _save(fig, out_dir, f"seed_bands_{model}_{train_set}")
    return paths


def paired_figures(spec: dict, summaries: pd.DataFrame, runs_dir: Path, out_dir: Path) -> list[Path]:
    """The `paired` layout's figure: per panel (column x metric, and the step-time ratio), each
    seed's difference for each contrast (dots) and the paired table's mean with its 95% interval
    (bar), in the colour of the contrast's method, or a colour of its own when an earlier contrast
    has that method (bfspo.reporting.style.distinct_colours; bfspo/reporting/paired.py); with the
    table's own `contrasts`, each is also named under its bar (a method may be in several). Each panel's axis
    names its unit; the legend sits below the panels, where it hides no point."""
    from matplotlib.lines import Line2D

    from bfspo.reporting.paired import METRICS, contrasts, paired_table, per_seed

    seeds, _ = per_seed(spec, score(summaries), runs_dir)
    table = paired_table(spec, seeds)
    methods, labels = _colours(spec), {m["key"]: m["label"] for m in spec["methods"]}
    pairs, named = contrasts(spec), bool(spec.get("contrasts"))
    colours = distinct_colours([methods[p["method"]] for p in pairs])  # one per contrast
    panels = [(c, m) for c in spec["columns"] for m in METRICS] + [(None, None)]
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 3.4))
    for ax, (col, metric) in zip(axes, panels):
        for i, pair in enumerate(pairs):
            b = seeds[seeds.method == pair["baseline"]].set_index("seed")
            o = seeds[seeds.method == pair["method"]].set_index("seed")
            mine = (table.method == labels[pair["method"]]) & (table.vs == labels[pair["baseline"]])
            if col is None:
                values, row = b.step_s / o.step_s, table[mine & (table.metric == "step ratio")]
                ax.axhline(1, color="grey", lw=0.8)
            else:
                key = f"{metric[0]}_{col['benchmark']}"
                values = o[key] - b[key]
                row = table[mine & (table.metric == metric[1]) & (table.what == f"{col['label']} ({col.get('domain', '')})")]
                ax.axhline(0, color="grey", lw=0.8)
            values = values.dropna()
            ax.scatter([i + 0.15] * len(values), values, s=10, color=colours[i], alpha=0.6)
            if len(row):
                r = row.iloc[0]
                ax.errorbar([i], [r["diff"]], yerr=[[r["diff"] - r.ci_low], [r.ci_high - r["diff"]]], fmt="o",
                            color=colours[i], capsize=3)
        if named:
            ax.set_xticks(range(len(pairs)), [p["label"].split(":")[0] for p in pairs], fontsize=7, rotation=90)
        else:
            ax.set_xticks([])
        ax.set_xlim(-0.5, len(pairs) - 0.5)
        ax.set_title("step time" if col is None else f"{col['label']}\n{metric[1]}", fontsize=8)
        ax.set_ylabel(PAIRED_UNITS["step" if col is None else metric[0]], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colours[i], marker="o", lw=1.5,
                      label=p["label"] if named else f"{labels[p['method']]}: mean, 95% interval")
               for i, p in enumerate(pairs)]
    handles.append(Line2D([], [], color="grey", marker="o", ls="", ms=3, alpha=0.6, label="one seed's difference"))
    if named:  # long labels, one per line, below the figure (the saved figure's box takes them in)
        fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=1, fontsize=7, frameon=False)
        fig.suptitle(f"{spec['title']}: each contrast, seed by seed (paired)", fontsize=9)
        fig.tight_layout()
    else:
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
        fig.suptitle(f"{spec['title']}: each method minus {spec['methods'][0]['label']}, seed by seed (paired)",
                     fontsize=9)
        fig.tight_layout(rect=(0, 0.08, 1, 1))
    return _save(fig, out_dir, "paired")


# the y axis of each panel of the paired figure
PAIRED_UNITS = {"acc": "difference (percentage points)", "avg_len": "difference (tokens)", "aes": "difference (AES)",
                "step": "baseline's median step time / the arm's\n(above 1: the arm is faster)"}


def backtracking_depths(run_dir: Path) -> tuple[list[float], list[float]]:
    """(depth, depth / path length) of every backtracking record in run_dir/trees/*.jsonl."""
    depths, relative = [], []
    for path in sorted((run_dir / "trees").glob("*.jsonl")):
        for lineno, tree in read_jsonl(path):
            for b in tree.get("backtracking", []):
                if "depth" not in b:
                    raise BfspoError(f"{path}:{lineno}: a backtracking record without a depth")
                depths.append(b["depth"])
                if b.get("path_length"):
                    relative.append(b["depth"] / b["path_length"])
    return depths, relative


def backtracking_figures(spec: dict, runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Small multiples: one row per searching method, depth in tokens (left) and relative (right)."""
    plt = _pyplot()
    labels, colours = _method_labels(spec), _colours(spec)
    model_labels, train_labels = _labels_of(spec)
    order = [m["key"] for m in spec["methods"] if m["k"] > 0]
    paths = []
    for (model, train_set), group in runs[runs.method.isin(order)].groupby(["model", "train_set"], sort=False):
        series = {}
        for method in order:
            depths, relative = [], []
            for d in group[group.method == method].dir:
                a, r = backtracking_depths(d)
                depths += a
                relative += r
            if depths:
                series[method] = (depths, relative)
        if not series:
            print(f"no logged trees for {model} / {train_set}: no backtracking histogram", file=sys.stderr)
            continue
        fig, axes = plt.subplots(len(series), 2, figsize=(9, 1.7 * len(series) + 0.9), sharex="col", sharey="col", squeeze=False)
        top = max(max(d) for d, _ in series.values())
        for (ax1, ax2), (method, (depths, relative)) in zip(axes, series.items()):
            colour = colours[method]
            ax1.hist(depths, bins=np.linspace(0, top, 31), weights=np.full(len(depths), 1 / len(depths)),
                     color=colour, alpha=0.8)
            ax2.hist(relative, bins=np.linspace(0, 1, 21), weights=np.full(len(relative), 1 / max(len(relative), 1)),
                     color=colour, alpha=0.8)
            ax1.set_ylabel(f"{labels[method]}\nshare (n={len(depths)})", fontsize=8)
            ax2.set_ylabel("share", fontsize=8)
            for ax in (ax1, ax2):
                ax.grid(alpha=0.3)
                ax.tick_params(labelsize=7)
        axes[-1][0].set_xlabel("backtracking depth (tokens from the prompt)")
        axes[-1][1].set_xlabel("backtracking depth / length of its path")
        axes[0][0].set_title("share of the method's backtracking tokens per bin", fontsize=8)
        axes[0][1].set_title("share per bin of relative depth", fontsize=8)
        fig.suptitle(f"Backtracking positions: {model_labels.get(model, model)}, "
                     f"trained on {train_labels.get(train_set, train_set)}", fontsize=10)
        fig.tight_layout()
        paths += _save(fig, out_dir, f"backtracking_{model}_{train_set}")
    return paths


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", required=True, help="the table spec: JSON text or a JSON file")
    parser.add_argument("--summaries", nargs="+", default=[], help="evaluation summary.json files")
    parser.add_argument("--runs-dir", default="results/runs", type=Path, help="where the training run directories are")
    parser.add_argument("--reported", help="the paper's numbers (data/reported_results.csv), drawn hollow")
    parser.add_argument("--out-dir", required=True, type=Path)


def run(args) -> int:
    spec = load_spec(args.spec)
    summaries = load_summaries(args.summaries)
    check_trained_on(summaries, args.runs_dir)
    reported = load_reported(args.reported)
    runs = _trained_runs(spec, summaries, args.runs_dir)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    paths = pareto_figures(spec, summaries, reported, args.out_dir)
    paths += curve_figures(spec, runs, args.out_dir)
    paths += backtracking_figures(spec, runs, args.out_dir)
    if spec["layout"] == "paired":
        paths += paired_figures(spec, summaries, args.runs_dir, args.out_dir)
        paths += seed_band_figures(spec, runs, args.out_dir)
    for path in paths:
        print(path)
    return 0
