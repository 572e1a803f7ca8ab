"""Weights & Biases logging, offline by default (no account needed; `wandb sync` uploads later).

The WANDB_MODE environment variable wins over the config (tests set it to "disabled"). A run's id
is kept in its directory, so a resumed training run continues the same W&B run.

Every run is tagged with the workflow's names (`run_tags`): `table:<name>` for each table it appears
in, `method:<key>`, `model:<label>` and `seed:<n>`, so a filter on a table's tag shows that table's
runs whatever W&B group they sit in.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def run_tags(names: dict) -> list[str]:
    """W&B tags from the workflow's names: tables (a list), method_key, model_label and seed, where set."""
    tags = [f"table:{t}" for t in names.get("tables") or []]
    tags += [f"{tag}:{names[key]}" for key, tag in (("method_key", "method"), ("model_label", "model"), ("seed", "seed"))
             if names.get(key) is not None]
    return tags


def start(run_dir: Path, config: dict, *, project: str, group: str | None, job_type: str, name: str,
          mode: str = "offline", enabled: bool = True, tags: list[str] | None = None):
    """A wandb run writing under run_dir/wandb, or None when disabled (or on a non-zero rank).

    Its tags are `tags`, or else `run_tags(config)` (a training config carries the workflow's names).
    """
    mode = os.environ.get("WANDB_MODE", mode)
    if not enabled or mode == "disabled":
        return None
    import wandb

    run_dir.mkdir(parents=True, exist_ok=True)
    id_file = run_dir / "wandb_id.txt"
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id + "\n")
    return wandb.init(project=project, group=group, job_type=job_type, name=name, config=config,
                      dir=str(run_dir), mode=mode, id=run_id, resume="allow", reinit="finish_previous",
                      tags=run_tags(config) if tags is None else tags)


def log(run, row: dict, step: int | None = None) -> None:
    if run is not None:
        run.log(row, step=step)


def table(df):
    """A pandas DataFrame as a wandb.Table, to log like a metric."""
    import wandb

    return wandb.Table(dataframe=df)


def finish(run) -> None:
    if run is not None:
        run.finish()
