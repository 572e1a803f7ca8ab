"""`bfspo report`: log a table's CSVs (as wandb.Table) and its figures (as images) to a report run
named after the table, in the table's W&B group and tagged `table:<table>` (and --wandb-tags) like
the table's training and evaluation runs. The tables keep the CSVs' types: numbers stay numbers (a
missing one is empty), so W&B can sort, filter and plot them.

    bfspo report --project P --group G [--mode offline] --tables T.csv ... --figures DIR ...
                 --wandb-dir results/wandb [--wandb-tags TAG ...] --out results/report/G.json

Offline by default (no account; `bfspo sync <wandb-dir>` uploads later); WANDB_MODE wins, as
for every bfspo run. --out records what was logged, and is written last. Each report is a new W&B
run with its own id (recorded in --out): a rebuilt table is a new run beside the old one, never a
fragment appended to the old one's id, so a sync never mixes two versions of a table in one run.
The earlier report run of the table (its wandb/ and wandb_id.txt) is set aside first, under
previous/<n>/ as a stale training run is (bfspo/history.py), so `bfspo sync` lists and uploads only
the report of the table as it is now.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from bfspo import history, tracking
from bfspo.errors import BfspoError
from bfspo.io import check_set, write_json
from bfspo.reporting.tables import incomplete_marker

REPORT_ENTRIES = ("wandb", "wandb_id.txt")  # a report run's files in its folder, set aside together


def collect(tables: list[Path], figure_dirs: list[Path]) -> tuple[list[Path], list[Path]]:
    """The table files and the PNG figures to log; a missing one is an error, and so is a table whose
    files were left half-written (`bfspo.reporting.tables.incomplete_marker`)."""
    missing = [str(p) for p in tables if not p.is_file()] + [str(d) for d in figure_dirs if not d.is_dir()]
    if missing:
        raise BfspoError(f"nothing to report at {', '.join(missing)}")
    for p in tables:
        check_set(incomplete_marker(p.parent, p.stem), p)
    return tables, sorted(p for d in figure_dirs for p in d.glob("*.png"))


def read_table(path: Path) -> pd.DataFrame:
    """A table CSV with its numeric columns as numbers (missing: NaN) and the others as text
    (missing: the empty string, not NaN)."""
    df = pd.read_csv(path)
    text = df.select_dtypes(exclude="number").columns
    df[text] = df[text].fillna("").astype(str)
    return df


def log_report(run, tables: list[Path], figures: list[Path]) -> None:
    import wandb

    row = {f"table/{p.stem}": wandb.Table(dataframe=read_table(p)) for p in tables}
    row |= {f"figure/{p.stem}": wandb.Image(str(p)) for p in figures}
    run.log(row)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project", required=True, help="W&B project")
    parser.add_argument("--group", required=True, help="W&B group: the table's name")
    parser.add_argument("--mode", default="offline", choices=["offline", "online", "disabled"])
    parser.add_argument("--name", help="W&B run name (default: the group, i.e. the table's name)")
    parser.add_argument("--tables", nargs="+", default=[], type=Path, help="table CSV files")
    parser.add_argument("--figures", nargs="+", default=[], type=Path, help="folders of PNG figures")
    parser.add_argument("--wandb-dir", default="results/wandb", type=Path, help="where the offline run is written")
    parser.add_argument("--wandb-tags", nargs="*", default=[], metavar="TAG", help="tags added to table:<group>")
    parser.add_argument("--out", required=True, type=Path, help="JSON record of the report run (written last)")


def run(args) -> int:
    tables, figures = collect(args.tables, args.figures)
    run_dir = args.wandb_dir / f"report-{args.group}"
    history.finish_set_aside(run_dir, lambda: REPORT_ENTRIES)
    history.set_aside(run_dir, REPORT_ENTRIES)
    wb = tracking.start(run_dir, {"tables": [str(p) for p in tables]}, project=args.project, group=args.group,
                        job_type="report", name=args.name or args.group, mode=args.mode,
                        tags=tracking.run_tags({"tables": [args.group], "wandb_tags": args.wandb_tags}), resume=False)
    if wb is not None:
        log_report(wb, tables, figures)
    record = {
        "project": args.project,
        "group": args.group,
        "mode": "disabled" if wb is None else wb.settings.mode,
        "run_id": None if wb is None else wb.id,
        "run_dir": str(run_dir),
        "tables": [str(p) for p in tables],
        "figures": [str(p) for p in figures],
    }
    tracking.finish(wb)
    write_json(args.out, record)
    print(f"report: {len(tables)} tables, {len(figures)} figures -> W&B group {args.group} ({record['mode']})")
    return 0
