"""`bfspo sync RESULTS_DIR`: upload every offline W&B run of a results folder with `wandb sync`.

Training runs (runs/<run>/wandb), evaluation runs (eval/<run>/<benchmark>/wandb) and report runs
(wandb/report-<table>/wandb) all write `offline-run-<time>-<id>` folders; this finds them at any
depth. A resumed run has one folder per attempt (its fragments): they go to one `wandb sync` call,
oldest first, which uploads them into one run (bfspo/tracking.py: each step is in one fragment).

Rehearsal runs never reach the paper's project. A run is a rehearsal run when its tags hold
`rehearsal` or its project ends in `-rehearsal` (bfspo/rehearsal/config.py gives it both), or when
it lies under a rehearsal's results folder (one whose config.yaml has `stand_ins`: runs made before
the rehearsal had a project of its own). Without --rehearsal they are left out, and
said so; with it, only they are uploaded, each into its rehearsal project (`<project>-rehearsal`
where the run's own project is not one).

    bfspo sync results                         # upload (needs `wandb login` or WANDB_API_KEY)
    bfspo sync results --list                  # only list the runs: name, project, group, fragments, tags
    bfspo sync results/rehearsal --rehearsal   # the rehearsal's runs, into their own project
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bfspo import tracking
from bfspo.errors import BfspoError
from bfspo.io import read_yaml
from bfspo.tracking import REHEARSAL_SUFFIX, REHEARSAL_TAG


@dataclass
class Run:
    """One W&B run of a results folder: its fragments (offline folders), oldest first, and its name,
    group and tags (as its first fragment records them)."""

    run_id: str
    project: str
    rehearsal: bool
    name: str = ""
    group: str = ""
    tags: list[str] = field(default_factory=list)
    fragments: list[Path] = field(default_factory=list)

    @property
    def target_project(self) -> str:
        """The project it is uploaded to: its own, except a rehearsal run recorded in another project."""
        if self.rehearsal and not self.project.endswith(REHEARSAL_SUFFIX):
            return self.project + REHEARSAL_SUFFIX
        return self.project


def offline_runs(results: Path) -> list[Path]:
    """Every offline run folder (one holding its run-<id>.wandb file) under results, oldest first
    (folders started in the same second: by path). A run under a `previous/` folder is left out: it
    was set aside, with the training run or evaluation it logged, when the inputs or settings changed
    (bfspo/history.py), and its steps would show beside those of the run that replaced it. A folder
    whose run file is not a regular file (a FIFO, whose reading would never end) is left out, with a
    warning naming it."""
    if not results.is_dir():
        raise BfspoError(f"{results}: no such results folder")
    runs = []
    for p in results.rglob("offline-run-*"):
        run_files = list(p.glob("run-*.wandb")) if p.is_dir() else []
        if not run_files or "previous" in p.relative_to(results).parts:
            continue
        odd = [f for f in run_files if not f.is_file()]
        if odd:
            print(f"warning: {odd[0]}: not a regular file; its run is left out", file=sys.stderr)
            continue
        runs.append(p)
    return sorted(runs, key=lambda p: (tracking.folder_start(p)[0], str(p)))


def rehearsal_roots(results: Path) -> list[Path]:
    """The rehearsal results folders at or below `results`: their config.yaml (`bfspo rehearsal-config`)
    has stand-in models (`stand_ins`)."""
    roots = []
    for config in [results / "config.yaml", *results.rglob("*/config.yaml")]:
        try:
            loaded = read_yaml(config) if config.is_file() else None
        except (OSError, BfspoError):
            continue
        if isinstance(loaded, dict) and "stand_ins" in loaded:
            roots.append(config.parent)
    return roots


def find_runs(results: Path) -> list[Run]:
    """The runs of a results folder, each with its fragments, in the order of their first fragment."""
    roots = [r.resolve() for r in rehearsal_roots(results)]
    runs: dict[tuple[str, str], Run] = {}
    for folder in offline_runs(results):
        record = tracking.read_run(folder)["run"]
        project, run_id = record.get("project", ""), record["run_id"]
        rehearsal = (REHEARSAL_TAG in record.get("tags", []) or project.endswith(REHEARSAL_SUFFIX)
                     or any(root in folder.resolve().parents for root in roots))
        runs.setdefault((project, run_id), Run(run_id, project, rehearsal, record.get("display_name", ""),
                                               record.get("run_group", ""), list(record.get("tags", []))),
                        ).fragments.append(folder)
    return list(runs.values())


LIST_COLUMNS = ("name", "project", "group", "fragments", "tags", "folder")


def list_line(run: Run) -> str:
    """A run as `--list` shows it: one tab-separated line of LIST_COLUMNS (folder: its wandb/ folder)."""
    return "\t".join([run.name or run.run_id, run.target_project, run.group or "-", str(len(run.fragments)),
                      ",".join(run.tags) or "-", str(run.fragments[0].parent)])


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, help="results folder (e.g. results)")
    parser.add_argument("--list", "--dry-run", dest="list", action="store_true",
                        help="list the runs that would be uploaded, one line each (name, project, group, "
                             "number of fragments, tags, folder), and upload nothing")
    parser.add_argument("--rehearsal", action="store_true",
                        help="upload the rehearsal's runs (only those), into their own W&B project")


def run(args) -> int:
    found = find_runs(args.results)
    if not found:
        raise BfspoError(f"{args.results}: no offline W&B runs (offline-run-*/run-*.wandb) under it")
    chosen = [r for r in found if r.rehearsal == args.rehearsal]
    left = len(found) - len(chosen)
    if left:
        print(f"left out {left} {'paper' if args.rehearsal else 'rehearsal'} run(s); "
              + ("run without --rehearsal to upload them" if args.rehearsal else
                 "`bfspo sync DIR --rehearsal` uploads them into their own project"))
    if not chosen:
        raise BfspoError(f"{args.results}: no {'rehearsal' if args.rehearsal else 'paper'} runs to upload")
    if args.list:
        print("\n".join(["\t".join(LIST_COLUMNS), *map(list_line, chosen)]))
        return 0
    wandb_cli = shutil.which("wandb")
    if wandb_cli is None:
        raise BfspoError("the `wandb` command is not on PATH (it comes with the wandb package)")
    failed = [r for r in chosen
              if subprocess.run([wandb_cli, "sync", "--project", r.target_project, *map(str, r.fragments)]).returncode]
    if failed:
        raise BfspoError(f"wandb sync failed for {len(failed)} of {len(chosen)} runs: "
                         + ", ".join(str(r.fragments[0]) for r in failed))
    print(f"synced {len(chosen)} runs ({sum(len(r.fragments) for r in chosen)} offline folders) from {args.results}")
    return 0
