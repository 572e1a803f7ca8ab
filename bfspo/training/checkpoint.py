"""Checkpoints that are never half-written, and resuming from the last one.

A checkpoint is a folder `checkpoint/` in the run directory holding the LoRA adapter (peft's
format) and `state.pt` (optimizer state, step, data cursor, RNG states). It is written as
`checkpoint.tmp/`, then swapped in by renames; a crash at any point leaves either the previous
checkpoint or the new one in place, never a partial one that looks complete.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch

NAME = "checkpoint"


def save(run_dir: Path, model, optimizer, state: dict) -> None:
    """Write checkpoint.tmp/, then rename it to checkpoint/ (the old one goes to checkpoint.old/ first)."""
    tmp, final, old = run_dir / f"{NAME}.tmp", run_dir / NAME, run_dir / f"{NAME}.old"
    if not final.exists() and (old / "COMPLETE").is_file():  # an earlier save died mid-swap: restore it first
        old.rename(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "adapter")
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save({"optimizer": optimizer.state_dict(), "rng": rng, **state}, tmp / "state.pt")
    (tmp / "COMPLETE").write_text("ok\n")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder (checkpoint/, or checkpoint.old/ after a crash mid-swap)."""
    for name in (NAME, f"{NAME}.old"):
        path = run_dir / name
        if (path / "COMPLETE").is_file():
            return path
    return None


def load(path: Path, model, optimizer) -> dict:
    """Restore adapter weights, optimizer and RNG states in place; return the saved training state."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    set_peft_model_state_dict(model, load_peft_weights(str(path / "adapter"), device="cpu"))
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state.pop("optimizer"))
    rng = state.pop("rng")
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return state
