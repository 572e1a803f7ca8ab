"""`bfspo rehearsal-check`: what a finished rehearsal must show, checked, and said plainly.

    bfspo rehearsal-check --tables DIR/NAME.csv [...] --runs RUN_DIR [...] --out check.json

Every table (its CSV, one row per cell and metric) has rows of ours, and each of them holds a
number in its accuracy and its length cell; the table's Markdown title says that the numbers mean
nothing; every training run made at least one optimizer step. The share of generated groups that
mixed right and wrong answers (kept by dynamic sampling) is reported. Any failure is listed in full
and exits non-zero; nothing is written then.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from bfspo.errors import BfspoError
from bfspo.io import read_jsonl, write_json
from bfspo.rehearsal.config import NOTE

CELL_METRICS = ("acc", "avg_len")


def table_problems(csv: Path) -> tuple[int, list[str]]:
    """(cells of ours, problems) of one table: every row of ours needs a number for each of CELL_METRICS."""
    if not csv.is_file():
        return 0, [f"{csv}: missing"]
    table = pd.read_csv(csv)
    ours = table[table["Source"] == "ours"]
    if ours.empty:
        return 0, [f"{csv}: no rows of ours"]
    keys = [c for c in table.columns if c not in ("metric", "mean", "std", "ci_low", "ci_high", "n_seeds")]
    problems = []
    for key, cells in ours.groupby(keys, dropna=False, sort=False):
        values = dict(zip(cells["metric"], cells["mean"]))
        for metric in CELL_METRICS:
            value = values.get(metric)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                problems.append(f"{csv}: row {', '.join(map(str, key))}: {metric} is {value!r}, not a number")
    md = csv.with_suffix(".md")
    if not md.is_file() or NOTE not in md.read_text(encoding="utf-8").split("\n", 1)[0]:
        problems.append(f"{md}: its title does not say {NOTE!r}")
    return int(ours["metric"].isin(CELL_METRICS).sum()), problems


def run_stats(run_dir: Path) -> dict:
    """Optimizer steps and generated groups (kept: right and wrong mixed; filtered: uniform) of one run."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise BfspoError(f"{path}: missing")
    rows = [r for _, r in read_jsonl(path)]
    return {key: int(sum(r.get(f"{section}/{key}", 0) for r in rows))
            for section, key in (("train", "optimizer_steps"), ("rollout", "groups_kept"), ("rollout", "groups_filtered"))}


def check(tables: list[Path], runs: list[Path]) -> dict:
    """The rehearsal's summary; a BfspoError lists every problem."""
    problems, cells = [], {}
    for csv in tables:
        cells[csv.stem], found = table_problems(csv)
        problems += found
    stats = {run.name: run_stats(run) for run in runs}
    problems += [f"{run}: no optimizer step" for run in runs if stats[run.name]["optimizer_steps"] < 1]
    if problems:
        raise BfspoError("the rehearsal is not complete:\n  " + "\n  ".join(problems))
    kept = sum(s["groups_kept"] for s in stats.values())
    generated = kept + sum(s["groups_filtered"] for s in stats.values())
    return {"note": NOTE, "cells_of_ours": cells, "runs": stats,
            "optimizer_steps_min": min(s["optimizer_steps"] for s in stats.values()),
            "groups_generated": generated, "groups_mixed": kept, "mixed_fraction": kept / generated if generated else 0.0}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables", type=Path, nargs="+", required=True, help="the tables' CSV files")
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="the training run directories")
    parser.add_argument("--out", type=Path, required=True)


def run(args) -> int:
    result = check(args.tables, args.runs)
    write_json(args.out, result)
    print(f"rehearsal check: {len(result['cells_of_ours'])} tables, {sum(result['cells_of_ours'].values())} "
          f"accuracy and length cells of ours, each a number; {len(result['runs'])} training runs, each with "
          f"{result['optimizer_steps_min']} or more optimizer steps; {result['groups_mixed']} of {result['groups_generated']} "
          f"generated groups mixed right and wrong answers.\n{NOTE}.")
    return 0
