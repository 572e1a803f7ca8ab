"""Weights & Biases logging, offline by default (no account needed; `bfspo sync` uploads later).

The WANDB_MODE environment variable wins over the config (tests set it to "disabled"). A run's id
is kept in its directory, so a resumed training run continues the same W&B run: each attempt
writes one more fragment, `wandb/offline-run-<time>-<id>`, and `wandb sync` uploads a run's
fragments in the order they started, into one run.

A training run sends each step's row as the step ends, stamped with its own time. A step is sent
once: an attempt resumed from its last checkpoint redoes the steps after it, and sends only those
beyond the last step that the earlier fragments hold (`last_logged_step`, read back from their
files with wandb's own reader). W&B's history is append-only, and a live resumed run drops a step
it already holds anyway; so W&B keeps the first attempt's rows of the redone steps, and
metrics.jsonl the redone ones (on CPU they are equal; on GPU they differ as two runs of one seed
do). A killed attempt loses the tail of its file that wandb had not yet written (it writes in
blocks of 32 KiB): those steps are missing from its fragment, so the next attempt sends them.

Every run is tagged with the workflow's names (`run_tags`): `table:<name>` for each table it appears
in, `method:<key>`, `model:<label>` and `seed:<n>`, plus the config's own `wandb.tags` (the
rehearsal's `rehearsal`), so a filter on a table's tag shows that table's runs whatever W&B group
they sit in.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

from bfspo.errors import BfspoError

# the tag of every rehearsal run, and what its project adds to the paper's (bfspo/rehearsal/config.py)
REHEARSAL_TAG, REHEARSAL_SUFFIX = "rehearsal", "-rehearsal"


def run_tags(names: dict) -> list[str]:
    """W&B tags from the workflow's names: tables (a list), method_key, model_label and seed, where
    set, then the config's own `wandb_tags`."""
    tags = [f"table:{t}" for t in names.get("tables") or []]
    tags += [f"{tag}:{names[key]}" for key, tag in (("method_key", "method"), ("model_label", "model"), ("seed", "seed"))
             if names.get(key) is not None]
    return tags + list(names.get("wandb_tags") or [])


def start(run_dir: Path, config: dict, *, project: str, group: str | None, job_type: str, name: str,
          mode: str = "offline", enabled: bool = True, tags: list[str] | None = None, footer: bool = True,
          resume: bool = True):
    """A wandb run writing under run_dir/wandb, or None when disabled (or on a non-zero rank).

    Its tags are `tags`, or else `run_tags(config)` (a training config carries the workflow's names).
    `footer=False` leaves out wandb's closing panel (the first ten keys in alphabetical order),
    for runs that print their own summary (`finish(run, summary)`). An offline run is quiet (wandb's
    `quiet`: neither that panel nor wandb's advice to `wandb sync` it); `finish` names `bfspo sync`
    instead, which uploads a resumed run's fragments into one run. `resume=False` starts a new W&B
    run even where run_dir holds one (a job that starts over, such as an SFT, is not a resumption).
    """
    mode = os.environ.get("WANDB_MODE", mode)
    if not enabled or mode == "disabled":
        return None
    import wandb

    run_dir.mkdir(parents=True, exist_ok=True)
    id_file = run_dir / "wandb_id.txt"
    run_id = id_file.read_text().strip() if id_file.exists() and resume else uuid.uuid4().hex[:12]
    id_file.write_text(run_id + "\n")
    settings = {} if footer else {"max_end_of_run_history_metrics": 0, "max_end_of_run_summary_metrics": 0}
    if mode == "offline":
        settings["quiet"] = True
    return wandb.init(project=project, group=group, job_type=job_type, name=name, config=config,
                      dir=str(run_dir), mode=mode, id=run_id, resume="allow", reinit="finish_previous",
                      tags=run_tags(config) if tags is None else tags, settings=wandb.Settings(**settings))


def add_arguments(parser, job: str) -> None:
    """The W&B options of a command whose run is logged only when --wandb-project is given."""
    parser.add_argument("--wandb-project", help=f"log the {job} to this W&B project (default: no W&B run)")
    parser.add_argument("--wandb-group", help="W&B group")
    parser.add_argument("--wandb-mode", default="offline", choices=["offline", "online", "disabled"],
                        help="W&B mode (the WANDB_MODE environment variable wins)")
    parser.add_argument("--wandb-dir", type=Path, help="where the W&B run is written (default: beside --out-dir)")
    parser.add_argument("--wandb-tags", nargs="*", default=[], metavar="TAG", help="W&B tags")
    parser.add_argument("--run-name", help="W&B run name (default: the --out-dir folder's name)")


def start_from_arguments(args, config: dict, job_type: str):
    """The W&B run of `add_arguments`' options (a new run each time), or None without --wandb-project."""
    if not args.wandb_project:
        return None
    out = Path(args.out_dir)
    return start(args.wandb_dir or out.with_name(out.name + ".wandb"), config, project=args.wandb_project,
                 group=args.wandb_group, job_type=job_type, name=args.run_name or out.name, mode=args.wandb_mode,
                 tags=args.wandb_tags, footer=False, resume=False)


def log(run, row: dict, step: int | None = None) -> None:
    if run is not None:
        run.log(row, step=step)


def table(df):
    """A pandas DataFrame as a wandb.Table, to log like a metric."""
    import wandb

    return wandb.Table(dataframe=df)


def finish(run, summary: dict | None = None) -> None:
    """Close the run; first put `summary` (the keys that matter, with their last values) in its W&B
    summary and print it, one key a line. An offline run's last line says how to upload it."""
    if run is None:
        return
    if summary:
        run.summary.update(summary)
        width = max(map(len, summary))
        print("W&B run summary:\n" + "\n".join(f"  {k:<{width}}  {_short(v)}" for k, v in summary.items()), flush=True)
    offline, folder = run.settings.mode == "offline", Path(run.settings.sync_dir)
    run.finish()
    if offline:
        print(sync_hint(folder), flush=True)


def sync_hint(folder: Path) -> str:
    """The line that ends an offline run's log: where the run is, and the command that uploads it."""
    return (f"W&B: offline run {folder.name} in {folder.parent}; upload it with `bfspo sync {folder.parent.parent}`, "
            "or every run of the results folder with `bfspo sync results`")


def _short(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.5g}"
    return str(value)


# ---- reading runs back --------------------------------------------------------------------------


def run_folders(wandb_dir: Path) -> list[Path]:
    """The run folders (offline-run-* or run-*, one per attempt) directly under a wandb/ folder
    that hold a transaction log (run-<id>.wandb), oldest first."""
    if not wandb_dir.is_dir():
        return []
    found = [p for p in wandb_dir.iterdir()
             if p.is_dir() and p.name.startswith(("offline-run-", "run-")) and any(p.glob("run-*.wandb"))]
    return sorted(found, key=folder_start)


def folder_start(folder: Path) -> tuple[str, str]:
    """Sort key, oldest first, of a run folder: its start second (in its name, run-<date_time>-<id>),
    then its name (a later folder of the same run in the same second has a suffix after the id)."""
    return folder.name.removeprefix("offline-").split("-")[1], folder.name


def folder_run_id(folder: Path) -> str:
    """The run id of a run folder, from its run-<id>.wandb file (a folder made in the same second
    as another of the run gets a suffix after the id)."""
    return next(folder.glob("run-*.wandb")).stem.removeprefix("run-")


def read_run(folder: Path) -> dict:
    """One run folder read back with wandb's own reader (what `wandb leet inspect --json` runs, called
    without starting a Python): {"run": the run record, "history": [history items], "summary": the
    merged summary updates}. The reader keeps what a killed attempt wrote before its unwritten tail."""
    from wandb.util import get_core_path

    (wandb_file,) = folder.glob("run-*.wandb")
    if not wandb_file.is_file():  # a FIFO would hold wandb's reader, and this call, forever
        raise BfspoError(f"{wandb_file}: not a regular file")
    command = [get_core_path(), "leet", "inspect", "--no-observability", "--json", "--run-file",
               str(wandb_file.resolve()), str(folder.resolve().parent)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        raise BfspoError(f"{wandb_file}: wandb cannot read it back ({(e.stderr or '').strip() or e})") from None
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    summary: dict = {}
    for r in records:
        if r["type"] == "summary":
            summary |= r["summary"].get("update", {})
    run = next((r["run"] for r in records if r["type"] == "run"), None)
    if run is None:
        raise BfspoError(f"{wandb_file}: no run record (not a W&B run file)")
    return {"run": run, "history": [r["history"]["item"] for r in records if r["type"] == "history"],
            "summary": summary}


def last_logged_step(run) -> int:
    """The last history step held by the earlier fragments of `run` (its other folders under the same
    wandb/ folder with its id); 0 for none, or for no run. A fragment wandb cannot read back is
    skipped, with a warning: training goes on, and W&B may get those steps twice."""
    if run is None:
        return 0
    own, last = Path(run.settings.sync_dir).resolve(), 0
    for folder in run_folders(own.parent):
        if folder.resolve() == own or folder_run_id(folder) != run.id:
            continue
        try:
            history = read_run(folder)["history"]
        except BfspoError as e:
            print(f"warning: {e}; its steps may be sent to W&B again", file=sys.stderr, flush=True)
            continue
        last = max([last, *(int(item["_step"]) for item in history)])
    return last
