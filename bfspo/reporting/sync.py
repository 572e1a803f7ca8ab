"""`bfspo sync RESULTS_DIR`: upload every offline W&B run under a results folder with `wandb sync`.

Training runs (runs/<run>/wandb), evaluation runs (eval/<run>/<benchmark>/wandb) and report runs
(wandb/report-<table>/wandb) all write `offline-run-<time>-<id>` folders; this finds them at any
depth, in time order (a resumed run's fragments share its id and are synced oldest first).

    bfspo sync results            # upload (needs `wandb login` or WANDB_API_KEY)
    bfspo sync results --list     # only list the offline runs, one folder a line
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

from bfspo.errors import BfspoError


def offline_runs(results: Path) -> list[Path]:
    """Every offline run folder (one holding its run-<id>.wandb file) under results, oldest first."""
    if not results.is_dir():
        raise BfspoError(f"{results}: no such results folder")
    runs = [p for p in results.rglob("offline-run-*") if p.is_dir() and any(p.glob("run-*.wandb"))]
    return sorted(runs, key=lambda p: (p.name.split("-")[2], str(p)))


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, help="results folder (e.g. results)")
    parser.add_argument("--list", "--dry-run", dest="list", action="store_true",
                        help="list the offline runs that would be uploaded, and upload nothing")


def run(args) -> int:
    runs = offline_runs(args.results)
    if not runs:
        raise BfspoError(f"{args.results}: no offline W&B runs (offline-run-*/run-*.wandb) under it")
    if args.list:
        print("\n".join(str(p) for p in runs))
        return 0
    wandb_cli = shutil.which("wandb")
    if wandb_cli is None:
        raise BfspoError("the `wandb` command is not on PATH (it comes with the wandb package)")
    failed = [p for p in runs if subprocess.run([wandb_cli, "sync", str(p)]).returncode]
    if failed:
        raise BfspoError(f"wandb sync failed for {len(failed)} of {len(runs)} offline runs: "
                         + ", ".join(map(str, failed)))
    print(f"synced {len(runs)} offline runs from {args.results}")
    return 0
