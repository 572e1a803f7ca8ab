"""Weights & Biases logging, offline by default (no account needed; `wandb sync` uploads later).

The WANDB_MODE environment variable wins over the config (tests set it to "disabled"). A run's id
is kept in its directory, so a resumed training run continues the same W&B run.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def start(run_dir: Path, config: dict, *, project: str, group: str | None, job_type: str, name: str,
          mode: str = "offline", enabled: bool = True):
    """A wandb run writing under run_dir/wandb, or None when disabled (or on a non-zero rank)."""
    mode = os.environ.get("WANDB_MODE", mode)
    if not enabled or mode == "disabled":
        return None
    import wandb

    run_dir.mkdir(parents=True, exist_ok=True)
    id_file = run_dir / "wandb_id.txt"
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id + "\n")
    return wandb.init(project=project, group=group, job_type=job_type, name=name, config=config,
                      dir=str(run_dir), mode=mode, id=run_id, resume="allow", reinit="finish_previous")


def log(run, row: dict, step: int | None = None) -> None:
    if run is not None:
        run.log(row, step=step)


def finish(run) -> None:
    if run is not None:
        run.finish()
