"""A training run's directory: what identifies the run there, and its lifecycle. No torch here.

The directory holds config.json, inputs.json (the fingerprints of the training data, base model and
tokenizer: bfspo.fingerprint), metrics.jsonl, trees/, checkpoint/, the final adapter/ and, written
last, done.json (which also records the code the run was made with: bfspo.code_identity). A start
(`prepare_run_dir`) decides, from the config and the fingerprints of the inputs, whether the run
there is finished, resumes, or is one on other inputs; the last is moved to a new previous/<n>/
(`set_aside`, bfspo.history), but only once the new inputs have loaded (bfspo.training.trainer.train),
so that a start that fails on a bad new data file or model leaves the finished run in place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bfspo import console, fingerprint, history, runlock
from bfspo.errors import BfspoError
from bfspo.io import atomic_write_text, read_json, read_jsonl, remove_temporaries
from bfspo.training.config import TrainConfig, identity_ignores

CHECKPOINT = "checkpoint"  # the checkpoint folder (bfspo.training.checkpoint)
# what an earlier run leaves that a start must check: its record, a checkpoint to resume, done.json
RUN_RECORDS = ("config.json", fingerprint.RUN_INPUTS, "done.json", CHECKPOINT, f"{CHECKPOINT}.old")
# what stays when a run is moved aside: the log every attempt appends to (the workflow's shell holds it
# open), the lock this process holds, and the folder the run moves to
KEPT = ("train.log", runlock.LOCK_NAME, history.PREVIOUS_NAME)


@dataclass(frozen=True)
class Start:
    """What a start found in the run directory: a `finished` run of this config and these inputs, or
    a run to train, after moving aside the earlier run made on the inputs `changed` (none: a fresh
    directory, or a run to resume)."""
    finished: bool = False
    changed: list[str] = field(default_factory=list)


def run_inputs(cfg: TrainConfig, data: dict[str, str], stamps: dict[str, list[int]]) -> dict[str, dict[str, str]]:
    """The fingerprints that, with the config, make a run what it is: the training data's bytes
    (`data`, of the bytes the run trains on: bfspo.fingerprint.read_data), the base model's config
    and weights, and its tokenizer, each file's stamp put in `stamps` (checked once the model has
    loaded: bfspo.training.trainer.check_loaded). val_data is left out, as it is from the config's
    comparison (`identity_ignores`): it is observed, not trained on. The code is not part of a
    run's identity: a run made with other code is named, never retrained silently (done.json's
    `code`, bfspo.code_identity)."""
    return {"train_data": data, **fingerprint.model_inputs(cfg.model, stamps)}


def prepare_run_dir(cfg: TrainConfig, run_dir: Path, inputs: dict[str, dict[str, str]]) -> Start:
    """Check the run directory against the config and the fingerprints of the inputs (`run_inputs`).
    First, a move to previous/ that a kill interrupted is completed, and the temporary files of
    killed writes are removed. A finished run is checked as an unfinished one is:

    - another config (fields other than those `identity_ignores`: W&B group, checkpoint period,
      memory-only settings, ...) is an error naming the fields, since the directory holds another
      run than the command asks for; with only those changed, an unfinished run resumes and records
      the new values;
    - the same config on inputs whose content changed (the data or the model rebuilt at the same
      path, as a Snakemake rerun after an input change does), or whose fingerprints the run did not
      record, is the command's run on new inputs: Start.changed names them, and the caller moves the
      old run to a new previous/<n>/ (`set_aside`) once the new inputs have loaded, then trains from
      step 0. Its checkpoint is never resumed, nor its adapter published again.

    Nothing of the run is moved or written here. config.json and inputs.json are written by
    `train` only once the model and data have loaded, so a start that fails on them leaves no config
    to refuse the corrected command.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    moved = history.finish_set_aside(run_dir, lambda: run_entries(run_dir))
    if moved is not None:
        console.line(f"{run_dir}: finished moving an earlier run to {moved}, which a kill had interrupted")
    for folder in (run_dir, run_dir / "trees"):
        remove_temporaries(folder)
    saved, new = run_dir / "config.json", cfg.to_dict()
    if saved.exists():
        old = read_json(saved)
        ignored = identity_ignores(new)
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in ignored)
        if diff:
            raise BfspoError(f"{run_dir} holds a run with a different config ({', '.join(diff)}); "
                             "use another --output-dir or delete it")
    if not any((run_dir / name).exists() for name in RUN_RECORDS):
        return Start()
    recorded = read_json(run_dir / fingerprint.RUN_INPUTS) if (run_dir / fingerprint.RUN_INPUTS).exists() else {}
    differ = fingerprint.changed(recorded, inputs)
    if differ:
        return Start(changed=differ)
    return Start(finished=(run_dir / "done.json").exists())


def run_entries(run_dir: Path) -> list[str]:
    """The entries of the run in run_dir: all but `KEPT`."""
    return sorted(p.name for p in run_dir.iterdir() if p.name not in KEPT)


def set_aside(run_dir: Path, differ: list[str]) -> None:
    """Move the earlier run in run_dir (all but `KEPT`: its checkpoints, adapter, done.json, metrics,
    trees, config, inputs and W&B run) to a new run_dir/previous/<n>/, crash-safe and keeping every
    earlier one (bfspo.history), and say what was moved (a finished run or an unfinished one) and,
    on a line of its own, how many earlier runs and bytes previous/ now holds. `bfspo sync` never
    uploads a W&B run under previous/; the new run gets a W&B run of its own."""
    what = "a finished run (done.json, adapter/)" if (run_dir / "done.json").exists() else "an unfinished run"
    wandb_id = run_dir / "wandb_id.txt"
    if wandb_id.is_file():
        what += f" and its W&B run {wandb_id.read_text(errors='replace').strip()}"
    moved = history.set_aside(run_dir, run_entries(run_dir))
    console.line(f"{run_dir}: its inputs changed since the run there was made ({'; '.join(differ)}): moved that "
                 f"run, {what}, to {moved}, where it stays until you delete it; training from step 0")
    console.line(history.holdings_line(run_dir, "run"))


def write_trees(run_dir: Path, step: int, trees: list[dict]) -> None:
    """A step's logged search trees (SearchTree.to_dict rows, token texts included) to
    run_dir/trees/step_NNNNN.jsonl, atomically: what `bfspo tree show` and `bfspo tree stats` read.
    Both `bfspo train` and the TRL trainer (bfspo.integrations.trl) write them here."""
    atomic_write_text(run_dir / "trees" / f"step_{step:05d}.jsonl", "".join(json.dumps(t) + "\n" for t in trees))


def read_metrics(path: Path) -> list[tuple[int, dict]]:
    """(line, row) of each readable row of a run's metrics.jsonl.

    A kill while a row is appended leaves a torn last line: it is dropped, and said so. A bad line
    anywhere else was not written by an interrupted trainer (an edit, another writer, a damaged
    disk): a BfspoError names the file and line.
    """
    skipped: list[dict] = []
    rows = list(read_jsonl(path, skipped=skipped))
    last_row = rows[-1][0] if rows else 0
    torn = skipped[-1] if skipped and skipped[-1]["line"] > last_row else None
    middle = [s for s in skipped if s is not torn]
    if middle:
        bad = middle[0]
        raise BfspoError(f"{path}:{bad['line']}: {bad['problem']}, in the middle of the file ({len(middle)} such "
                         "line(s)); only the last line can be torn by a kill, so the file was changed by another "
                         "writer or by hand. Repair or delete that line (rows after the last checkpoint are "
                         "dropped on resume anyway), or start the run over in a new directory")
    if torn is not None:
        console.line(f"{path}:{torn['line']}: dropped a torn last line ({torn['problem']}), "
                     "left by an interrupted run")
    return rows


def trim_metrics(path: Path, step: int) -> None:
    """On a resume from the checkpoint of `step` (0: none): drop the rows of metrics.jsonl logged
    after it (and a torn last line: `read_metrics`), and say which of steps 1..`step` have no row
    (a file truncated or deleted): the checkpoint's step stands, and those rows are lost."""
    rows = [r for _, r in read_metrics(path)] if path.exists() else []
    kept = [r for r in rows if r["step"] <= step]
    if path.exists():
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
    lost = sorted(set(range(1, step + 1)) - {r["step"] for r in kept})
    if lost:
        console.line(f"{path}: the rows of {len(lost)} of the {step} steps that the checkpoint holds are lost "
                     f"(steps {spans(lost)}); the checkpoint's step {step} stands, and the run resumes from it")


def spans(numbers: list[int]) -> str:
    """Sorted integers as runs: [1, 2, 3, 5] -> "1-3, 5"."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
