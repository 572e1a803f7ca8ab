"""`bfspo tables`: the paper's tables, built from evaluation summaries, beside the paper's own rows.

    bfspo tables build --spec JSON --summaries S.json ... [--reported CSV] [--runs-dir DIR] --out-dir DIR [--owner CONFIG]
    bfspo tables consistency --reported CSV --out-dir DIR

`build` writes DIR/<name>.md and .tex (booktabs), formatted in the paper's column order plus a
Source column, and DIR/<name>.csv with the same cells as numbers, one row per cell and metric
(the descriptors, source, train_set, benchmark, metric, mean, std, ci_low, ci_high, n_seeds):
  ours      our runs, mean ± std over seeds (the 95% interval of the seed mean, bootstrapped over
            seeds, in the CSV); a single seed shows its summary.json interval, "82.0 [79.1, 84.8]";
            AES (App. E) against OUR zero-shot run of the same model and benchmark, per seed;
  paper     the paper's printed number for the row above it (reported_results.csv);
  reported  rows the paper took from other work (SFT, TokenSkip, Tree of Thoughts), never run here.
The three files are written as one unit (`incomplete_marker`): a kill between their renames leaves
DIR/<name>.incomplete beside the mix, `bfspo report` refuses the table, and the next build completes it.
With --runs-dir, every evaluation of a trained run must have scored the adapter its run published
on the base model the run was trained on, by content (`summaries.check_trained_on`), and the
Markdown notes name every training run of the table whose batches came out short (`rollout/batch_full` 0 or false in its metrics.jsonl: dynamic sampling ran out of rounds), with how many
steps and the fewest chains. The spec (JSON text or a file; the workflow writes it, see workflow/rules/common.smk `table_spec`)
names the table's layout, models, methods and columns (train set -> benchmark). Summaries are
matched to cells by the meta that the workflow passes to `bfspo evaluate`: model, method
("zero-shot" for the base model), train_set and seed.

The `paired` layout (bfspo/reporting/paired.py) writes instead each method minus the first, seed
by seed, with paired-bootstrap intervals, the minimal detectable difference, step-time ratios and
tree statistics, plus DIR/<name>_seeds.csv (one row per method and seed); it needs --runs-dir.

`consistency` recomputes the AES of every paper row from its own printed accuracy and length
(`bfspo.evaluation.metrics.aes_consistency`) and lists the rows whose printed AES disagrees.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from bfspo.algorithm.advantages import advantage_kind
from bfspo.code_identity import stale, stale_line
from bfspo.errors import BfspoError
from bfspo.evaluation.metrics import aes_consistency
from bfspo.io import atomic_write_set, atomic_write_text, read_jsonl
from bfspo.reporting.latex import NO, YES, latex_escape
from bfspo.reporting.owner import write_owner
from bfspo.reporting.summaries import (
    METRICS,
    ZERO_SHOT,
    Stat,
    aggregate,
    check_trained_on,
    load_reported,
    load_spec,
    load_summaries,
    score,
)

OURS, PAPER, REPORTED = "ours", "paper", "reported"
DESCRIPTORS = {
    "ablation": ["Method", "K", "Branch Adv.", "Len. Penalty"],
    "models": ["Model", "Method"],
    "ratios": ["Model", "Method", "Ratio"],
}
# What a cell of ours shows, by its form (`fmt`); the legend names the forms the table uses
CELL_FORMS = {"std": "a ± s: mean ± std over seeds",
              "interval": "a [l, h]: one seed, its 95% interval over the questions"}
NONE = "-"
# the CSV's columns after the descriptors: the source, the method's key, the cell, its numbers, its runs
NUMERIC_COLUMNS = ["Source", "method_key", "train_set", "benchmark", "metric", "mean", "std", "ci_low", "ci_high",
                   "n_seeds", "runs"]


class Row(NamedTuple):
    """One row of a table: its descriptors, one cell per column ({metric: Stat, "runs": [...]} or None),
    its source, and the method it shows: our method key (zero-shot for the base model), or the
    paper's name of a method that only the paper ran."""

    descriptors: list[str]
    values: list
    source: str
    method_key: str


def _number(value: float, digits: int) -> str:
    """`value` to `digits` decimals, never "-0.0" (a value that rounds to zero is unsigned)."""
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def fmt(stat: Stat | None, digits: int = 1) -> str:
    """`85.6 ± 0.4` over several seeds, `85.6 [83.1, 88.0]` for one seed with an interval, `85.6`
    without one; `-` when missing."""
    if stat is None or math.isnan(stat.mean):
        return NONE
    text, form = _number(stat.mean, digits), cell_form(stat)
    if form == "std":
        return f"{text} ± {_number(stat.std, digits)}"
    if form == "interval":
        return f"{text} [{_number(stat.ci_low, digits)}, {_number(stat.ci_high, digits)}]"
    return text


def cell_form(stat: Stat | None) -> str | None:
    """The key of CELL_FORMS that `fmt` writes `stat` in (None: a bare number or a missing cell)."""
    if stat is None or math.isnan(stat.mean):
        return None
    if stat.n > 1 and not math.isnan(stat.std):
        return "std"
    return None if math.isnan(stat.ci_low) or math.isnan(stat.ci_high) else "interval"


def legend(rows: list[Row]) -> str:
    """The table's footnote: the sources, and what the cells of ours show in the forms they use."""
    used = {cell_form(v[m]) for r in rows if r.source.startswith(OURS) for v in r.values if v for m, _, _ in METRICS}
    forms = "; ".join(text for form, text in CELL_FORMS.items() if form in used)
    return ("Source: ours = this repository's runs (" + (f"{forms}; " if forms else "")
            + "AES against our own zero-shot run); paper = the paper's printed number for the row above; "
            "reported = taken by the paper from other work, not run here.")


# ---- the table ---------------------------------------------------------------------------------


def _paper_cell(reported: pd.DataFrame, tables: list[str], model_label: str, method: str, col: dict,
                k: int | None = None, ratio: float | None = None) -> dict | None:
    """The paper's number for one cell, from the first of `tables` that has it. A row with a K
    matches only that K (a row without one matches any); a ratio, when given, must match."""
    for table in tables:
        rows = reported[
            (reported.table == table) & (reported.model == model_label) & (reported.method == method)
            & (reported.train_set == col["train_set"]) & (reported.benchmark == col["benchmark"])
        ]
        if k is not None:
            rows = rows[rows.K.isna() | (rows.K == k)]
        if ratio is not None:
            rows = rows[rows.ratio == ratio]
        if len(rows):
            r = rows.iloc[0]
            return {m: Stat(float(r[m])) for m, _, _ in METRICS}
    return None


def _cells(values: list[dict | None]) -> list[str]:
    return [fmt(v[m] if v else None, digits=d) for v in values for m, _, d in METRICS]


def _descriptors(layout: str, model: dict, label: str, method: dict | None, ratio=None) -> list[str]:
    """The row's descriptor cells. In the ablation, Branch Adv. is ✓ for an advantage variant whose
    kind (bfspo.algorithm.advantages.ADVANTAGES) puts one advantage on each segment, as Eq. 9's branch
    advantage does, whatever its name; ✗ for one per chain; - without a tree (K = 0)."""
    if layout == "ablation":
        if method is None:
            return [label, NONE, NONE, NONE]
        branch = NONE if method["k"] == 0 else (NO if advantage_kind(method["advantage"]).per_chain else YES)
        return [label, str(method["k"]), branch, YES if method["overlong"] else NO]
    if layout == "ratios":
        return [model["label"], label, NONE if ratio is None or pd.isna(ratio) else f"{ratio:.1f}"]
    return [model["label"], label]


def build_rows(spec: dict, summaries: pd.DataFrame, reported: pd.DataFrame) -> list[Row]:
    """The table's rows: per model, zero-shot, the reported-only methods, then each of our methods;
    each of our rows is followed by the paper's row for it, where the paper has one."""
    layout, columns, paper_tables = spec["layout"], spec["columns"], spec.get("paper_tables", [])
    ours = aggregate(score(summaries))
    rows = []

    def add_ours(model, label, key, method=None):
        values = [ours.get((model["key"], key, "" if key == ZERO_SHOT else c["train_set"], c["benchmark"])) for c in columns]
        seeds = max((v["acc"].n for v in values if v), default=0)
        source = OURS if seeds <= 1 else f"{OURS} ({seeds} seeds)"
        rows.append(Row(_descriptors(layout, model, label, method), values, source, key))
        paper_name = ZERO_SHOT if method is None else method.get("paper")
        if paper_name:
            k = None if method is None else method["k"]
            pvalues = [_paper_cell(reported, paper_tables, model["label"], paper_name, c, k=k) for c in columns]
            if any(pvalues):
                rows.append(Row(_descriptors(layout, model, label, method), pvalues, PAPER, key))

    rep = spec.get("reported") or {}
    for model in spec["models"]:
        add_ours(model, "Zero-shot", ZERO_SHOT)
        for name, label in rep.get("methods", {}).items():
            mine = reported[(reported.table == rep["table"]) & (reported.model == model["label"]) & (reported.method == name)]
            for ratio in mine.ratio.drop_duplicates():
                r = None if pd.isna(ratio) else float(ratio)
                pvalues = [_paper_cell(reported, [rep["table"]], model["label"], name, c, ratio=r) for c in columns]
                if any(pvalues):
                    rows.append(Row(_descriptors(layout, model, label, None, r), pvalues, REPORTED, name))
        for method in spec["methods"]:
            add_ours(model, method["label"], method["key"], method)
    return rows


def column_labels(spec: dict) -> list[tuple[str, str]]:
    """(group, metric) per column; the group is empty for the descriptors and for one-column tables."""
    cols = [("", d) for d in DESCRIPTORS[spec["layout"]]]
    for c in spec["columns"]:
        domain = {"in": " (in-domain)", "out": " (out-of-domain)"}.get(c.get("domain"), "")
        group = c["label"] + domain if len(spec["columns"]) > 1 else ""
        cols += [(group, name) for _, name, _ in METRICS]
    return cols + [("", "Source")]


def build_table(spec: dict, rows: list[Row]) -> pd.DataFrame:
    """The formatted table (strings), as the MD and TeX files show it."""
    return pd.DataFrame([r.descriptors + _cells(r.values) + [r.source] for r in rows],
                        columns=pd.MultiIndex.from_tuples(column_labels(spec)))


def numeric_table(spec: dict, rows: list[Row]) -> pd.DataFrame:
    """The same cells as numbers: one row per (table row, column, metric), for pandas to compute with,
    with the method's key and the runs of our cells (`;`-separated W&B run names of the training
    runs, whose evaluation runs are <run>_eval_<benchmark>) to find them in W&B."""
    records = []
    for r in rows:
        for col, cell in zip(spec["columns"], r.values):
            for metric, _, _ in METRICS:
                stat = cell[metric] if cell else Stat(math.nan)
                records.append(r.descriptors + [r.source.split(" ")[0], r.method_key, col["train_set"], col["benchmark"],
                                                metric, stat.mean, stat.std, stat.ci_low, stat.ci_high, stat.n,
                                                ";".join(cell.get("runs", [])) if cell else ""])
    return pd.DataFrame(records, columns=DESCRIPTORS[spec["layout"]] + NUMERIC_COLUMNS)


def _flat(df: pd.DataFrame) -> pd.DataFrame:
    flat = df.copy()
    flat.columns = [f"{g} {m}".strip() for g, m in df.columns]
    return flat


def to_latex(df: pd.DataFrame, spec: dict) -> str:
    """booktabs tabular in the paper's column order (descriptors, then Acc./Avg. Len./AES per column)."""
    body = df.map(latex_escape)
    body.columns = pd.MultiIndex.from_tuples([(latex_escape(g), latex_escape(m)) for g, m in df.columns])
    if len(spec["columns"]) == 1:
        body.columns = body.columns.droplevel(0)
    n_desc = len(DESCRIPTORS[spec["layout"]])
    fmt_cols = "l" * n_desc + "c" * (len(df.columns) - n_desc - 1) + "l"
    return body.style.hide(axis="index").to_latex(
        hrules=True,
        column_format=fmt_cols,
        multicol_align="c",
        caption=latex_escape(spec["title"]),
        label=f"tab:{spec['name']}",
        position_float="centering",
    )


def incomplete_marker(out_dir: str | Path, name: str) -> Path:
    """The file that says table `name`'s files in `out_dir` are being replaced: its CSV, Markdown and
    LaTeX files are written as one unit (bfspo.io.atomic_write_set), so a kill between their renames
    leaves this marker beside the mix of old and new files, and `bfspo report` refuses the table."""
    return Path(out_dir) / f"{name}.incomplete"


def write_table(spec: dict, rows: list[Row], out_dir: str | Path,
                notes: list[str] = (), code_note: str | None = None) -> list[Path]:
    out = Path(out_dir)
    paths = [out / f"{spec['name']}.{ext}" for ext in ("csv", "md", "tex")]
    df = build_table(spec, rows)
    flat = _flat(df)
    short = "".join(f"\nShort batches: {note}\n" for note in notes) + (f"\n{code_note}\n" if code_note else "")
    atomic_write_set({
        paths[0]: numeric_table(spec, rows).to_csv(index=False),
        paths[1]: f"## {spec['title']}\n\n{flat.to_markdown(index=False, disable_numparse=True)}\n\n{legend(rows)}\n{short}",
        paths[2]: to_latex(df, spec),
    }, incomplete_marker(out, spec["name"]))
    return paths


# ---- training notes ----------------------------------------------------------------------------


CHAINS, TARGET = "rollout/chains", "rollout/chains_target"


def _count(value) -> float | None:
    """A logged count of chains as a float, or None unless it is a finite number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def chain_rows(path: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl that log its chains, each with finite `rollout/chains` and a
    positive `rollout/chains_target`. Anything else is a BfspoError naming the file and what is wrong:
    not a regular file (a FIFO is never opened), a line that is no JSON object (torn, not UTF-8), a
    count that is not a finite number, or no row logging the chains at all (an empty file)."""
    if not path.is_file():
        raise BfspoError(f"{path}: not a regular file")
    rows = []
    for lineno, r in read_jsonl(path):
        if CHAINS not in r:
            continue
        chains, target = _count(r[CHAINS]), _count(r.get(TARGET))
        if chains is None or target is None or target <= 0:
            raise BfspoError(f"{path}:{lineno}: {CHAINS} {r[CHAINS]!r} and {TARGET} {r.get(TARGET)!r} must be "
                             "finite numbers, the target above 0")
        rows.append(dict(r, **{CHAINS: chains, TARGET: target}))
    if not rows:
        raise BfspoError(f"{path}: no step logs {CHAINS}")
    return rows


def short_batch_notes(runs_dir: str | Path, runs: list[str], share: float = 1.0) -> list[str]:
    """One note per training run whose metrics.jsonl logs a batch of fewer than `share` of its target
    chains (`rollout/chains` against `rollout/chains_target`; with share 1, `rollout/batch_full` 0).
    A run without a metrics.jsonl is left out; one whose rows cannot be read is an error (`chain_rows`)."""
    notes = []
    for run in runs:
        path = Path(runs_dir) / run / "metrics.jsonl"
        if not (path.exists() or path.is_symlink()):
            continue
        rows = chain_rows(path)
        short = [r for r in rows if r[CHAINS] < share * r[TARGET]]
        if short:
            worst = min(short, key=lambda r: r[CHAINS])
            notes.append(f"{run}: {len(short)} of {len(rows)} steps trained on a short batch (fewest: "
                         f"{worst[CHAINS]:.0f} of {worst[TARGET]:.0f} chains, step {worst.get('step', '?')}).")
    return notes


def share_of_target(text: str) -> float:
    """--share: a number in (0, 1] (NaN, 0, negatives and more than 1 would pass every run or none)."""
    try:
        share = float(text)
    except ValueError:
        share = math.nan
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share in (0, 1]")
    return share


def check_chains(runs_dir: str | Path, share: float) -> str:
    """Issue 36's check of a finished DAG: every run under `runs_dir` trained at least `share` of its
    target chains at every step. Returns what it checked; a BfspoError names every run that did not,
    and every run whose metrics.jsonl cannot be read (`chain_rows`)."""
    if not 0 < share <= 1:
        raise BfspoError(f"share {share!r} is not in (0, 1]")
    runs = sorted(p.parent.name for p in Path(runs_dir).glob("*/metrics.jsonl"))
    if not runs:
        raise BfspoError(f"{runs_dir}: no training run with a metrics.jsonl")
    notes = []
    for run in runs:
        try:
            notes += short_batch_notes(runs_dir, [run], share)
        except BfspoError as e:
            notes.append(f"{run}: cannot check ({e})")
    if notes:
        raise BfspoError(f"runs whose batch fell below {share:.0%} of its target chains, or that cannot be "
                         "checked:\n  " + "\n  ".join(notes))
    return f"{len(runs)} runs under {runs_dir}: every step trained at least {share:.0%} of its target chains."


def code_note(summaries: list[str], runs_dir: str | Path | None, runs: list[str]) -> str | None:
    """The line under a table naming its evaluations (summary.json) and training runs (done.json under
    `runs_dir`) made with other code than the checkout's (bfspo.code_identity), or None."""
    evaluations = {f"{Path(p).parent.parent.name}/{Path(p).parent.name}": p for p in summaries}
    found = [stale_line(stale(evaluations, "evaluate"), "evaluation"),
             stale_line(stale({r: Path(runs_dir) / r / "done.json" for r in runs}, "train"), "training run")
             if runs_dir else None]
    found = [line for line in found if line]
    return f"Other code: {' '.join(found)}" if found else None


# ---- the consistency report -------------------------------------------------------------------


def write_consistency(reported: pd.DataFrame, out_dir: str | Path) -> pd.DataFrame:
    """aes_consistency.csv (every checked row) and .md (the rows whose printed AES disagrees)."""
    checked = aes_consistency(reported)
    bad = checked[~checked.consistent]
    out = Path(out_dir)
    atomic_write_text(out / "aes_consistency.csv", checked.to_csv(index=False))
    cols = ["table", "model", "train_set", "benchmark", "method", "K", "ratio", "acc", "avg_len", "aes",
            "base_acc", "base_len", "aes_recomputed", "aes_min", "aes_max"]
    shown = bad[[c for c in cols if c in bad.columns]]
    body = shown.astype(object).where(shown.notna(), "").to_markdown(index=False, disable_numparse=True) if len(bad) else "(none)"
    atomic_write_text(
        out / "aes_consistency.md",
        "## Paper rows whose printed AES disagrees with its own formula\n\n"
        f"{len(bad)} of {len(checked)} rows with a zero-shot baseline disagree: the printed AES lies "
        "outside the range that AES (App. E; alpha=1, beta=3, gamma=5) takes over every unrounded "
        "accuracy and length consistent with the printed ones.\n\n"
        f"{body}\n",
    )
    return bad


# ---- command line -------------------------------------------------------------------------------


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    b = sub.add_parser("build", help="one table as CSV, Markdown and LaTeX")
    b.add_argument("--spec", required=True, help="the table spec: JSON text or a JSON file")
    b.add_argument("--summaries", nargs="+", default=[], help="evaluation summary.json files")
    b.add_argument("--reported", help="the paper's numbers (data/reported_results.csv)")
    b.add_argument("--runs-dir", help="training run directories: notes name the runs whose batches came out short, "
                   "and each evaluation must have scored its run's adapter on the run's base model")
    b.add_argument("--out-dir", required=True)
    b.add_argument("--owner", help="the workflow config that owns the table, recorded in OUT_DIR/<name>.owner "
                                   "(bfspo/reporting/owner.py)")
    c = sub.add_parser("consistency", help="paper rows whose printed AES disagrees with its formula")
    c.add_argument("--reported", required=True)
    c.add_argument("--out-dir", required=True)
    k = sub.add_parser("chains", help="check that every run trained its target chains at every step (exit 1 if not)")
    k.add_argument("--runs-dir", required=True, help="training run directories (results/runs)")
    k.add_argument("--share", type=share_of_target, default=0.95,
                   help="the least share of the target chains, in (0, 1] (default 0.95)")


def run(args) -> int:
    if args.action == "chains":
        try:
            print(check_chains(args.runs_dir, args.share))
        except BfspoError as e:
            print(f"bfspo tables chains: {e}")
            return 1
        return 0
    reported = load_reported(args.reported)
    if args.action == "consistency":
        bad = write_consistency(reported, args.out_dir)
        print(f"{len(bad)} paper rows with an inconsistent AES -> {Path(args.out_dir) / 'aes_consistency.md'}")
        return 0
    spec = load_spec(args.spec)
    if args.owner:
        write_owner(args.out_dir, spec["name"], args.owner)
    summaries = load_summaries(args.summaries)
    if args.runs_dir:
        check_trained_on(summaries, args.runs_dir)
    if spec["layout"] == "paired":
        from bfspo.reporting.paired import write_paired

        if not args.runs_dir:
            raise BfspoError(f"table {spec['name']}: the paired layout reads the training runs; give --runs-dir")
        for path in write_paired(spec, score(summaries), args.runs_dir, args.out_dir):
            print(path)
        return 0
    rows = build_rows(spec, summaries, reported)
    runs = sorted(set(summaries.loc[summaries.method != ZERO_SHOT, "run"]) - {""})
    notes = short_batch_notes(args.runs_dir, runs) if args.runs_dir else []
    for path in write_table(spec, rows, args.out_dir, notes, code_note(args.summaries, args.runs_dir, runs)):
        print(path)
    return 0
