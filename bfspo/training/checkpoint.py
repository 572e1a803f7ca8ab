"""Checkpoints that are never half-written, and resuming from the last one.

A checkpoint is a folder `checkpoint/` in the run directory holding the LoRA adapter (peft's
format) and `state.pt` (optimizer state, step, data cursor, dynamic sampling's keep rate, RNG
states). It is written as `checkpoint.tmp/`, then swapped in by renames; a crash at any point leaves either the previous
checkpoint or the new one in place, never a partial one that looks complete. Its marker file
`COMPLETE` is a manifest of the SHA-256 of every other file, checked before resuming: a damaged or
hand-edited checkpoint is named, never loaded silently; so is a marker that is not a manifest (torn,
or from a bfspo before manifests). A checkpoint is never written with NaN or inf in the adapter or
the optimizer state: every resume would load the poison.

Nothing in a checkpoint runs code: `state.pt` holds tensors and plain values only (the RNG states as
lists and tensors, not numpy objects) and is read with `torch.load(weights_only=True)`, which
refuses anything else (a pickled object whose `__reduce__` would run a command) without running it.
The manifest does not guard against that, since whoever can write `state.pt` can rewrite it.
"""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from bfspo.errors import BfspoError
from bfspo.fingerprint import file_sha256
from bfspo.io import write_error
from bfspo.model_io import save_adapter
from bfspo.training.nonfinite import nonfinite_tensors
from bfspo.training.run_dir import CHECKPOINT as NAME

MARKER = "COMPLETE"


def save(run_dir: Path, model, optimizer, state: dict) -> None:
    """Write checkpoint.tmp/, then rename it to checkpoint/ (the old one goes to checkpoint.old/ first).
    Non-finite trainable weights or optimizer state are a BfspoError, and nothing is written."""
    tmp, final, old = run_dir / f"{NAME}.tmp", run_dir / NAME, run_dir / f"{NAME}.old"
    bad = nonfinite_tensors(model, optimizer)
    if bad:
        raise BfspoError(f"{final}: not written, since {len(bad)} tensor(s) hold NaN or inf ({', '.join(bad[:3])}"
                         f"{', ...' if len(bad) > 3 else ''}); the previous checkpoint is kept")
    if not final.exists() and (old / MARKER).is_file():  # an earlier save died mid-swap: restore it first
        old.rename(final)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        save_adapter(model, tmp / "adapter")
        torch.save({"optimizer": optimizer.state_dict(), "rng": rng_state(), **state}, tmp / "state.pt")
        (tmp / MARKER).write_text(json.dumps({"sha256": checksums(tmp)}, indent=1) + "\n")
    except (OSError, RuntimeError) as e:  # a full disk reaches torch.save as "unexpected pos ..."
        shutil.rmtree(tmp, ignore_errors=True)
        raise BfspoError(f"{write_error(tmp, e, 'writing the checkpoint failed')} (the previous checkpoint is kept)"
                         ) from None
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def rng_state() -> dict:
    """The Python, numpy, torch (and CUDA) RNG states as tensors and plain values, which
    `torch.load(weights_only=True)` reads back (a numpy array it refuses)."""
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"]["key"] = torch.from_numpy(numpy_state["state"]["key"].astype(np.int64))
    rng = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def set_rng_state(rng: dict) -> None:
    """Restore the RNG states that `rng_state` returned."""
    numpy_state = rng["numpy"]
    numpy_state["state"]["key"] = numpy_state["state"]["key"].numpy().astype(np.uint32)
    random.setstate(rng["python"])
    np.random.set_state(numpy_state)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def checksums(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under `folder` but the marker, by path relative to it."""
    return {path.relative_to(folder).as_posix(): file_sha256(path)
            for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER)}


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder (checkpoint/, or checkpoint.old/ after a crash mid-swap).

    checkpoint/ only ever appears by a rename of a complete folder, so one without its marker was
    damaged by hand: an error, rather than a silent restart from step 0."""
    if (run_dir / NAME).is_dir() and not (run_dir / NAME / MARKER).is_file():
        raise BfspoError(f"{run_dir / NAME}: a checkpoint without its {MARKER} marker; delete that folder to "
                         "restart the run from step 0")
    for name in (NAME, f"{NAME}.old"):
        path = run_dir / name
        if (path / MARKER).is_file():
            return path
    return None


def verify(path: Path) -> None:
    """Check the checkpoint's files against its manifest. A marker that is not a manifest (torn, edited,
    or written by a bfspo before manifests, whose state.pt could not be read safely anyway) is a
    damaged checkpoint, never a reason to skip the check."""
    try:
        manifest = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        manifest = None
    expected = manifest.get("sha256") if isinstance(manifest, dict) else None
    if not isinstance(expected, dict) or not expected:
        raise BfspoError(f"{path / MARKER}: not a checksum manifest, so the checkpoint cannot be verified (a torn or "
                         "edited marker, or a checkpoint from a bfspo before manifests); delete "
                         f"{path} to restart the run from step 0")
    found = checksums(path)
    bad = sorted(name for name in expected if found.get(name) != expected[name])
    if bad:
        raise BfspoError(f"{path}: {', '.join(bad)} missing or changed since the checkpoint was written (checksum "
                         f"mismatch); delete {path} to restart the run from step 0")


def load(path: Path, model, optimizer) -> dict:
    """Restore adapter weights, optimizer and RNG states in place; return the saved training state."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    verify(path)
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise BfspoError(f"{path / 'state.pt'}: holds objects other than tensors and plain values, which could run "
                         "code when loaded, so it is not loaded (a checkpoint written before bfspo kept its RNG "
                         f"states as tensors, or one tampered with); delete {path} to restart the run from step 0"
                         ) from None
    except Exception as e:
        raise BfspoError(f"{path / 'state.pt'}: unreadable ({str(e).splitlines()[0]}); delete {path} to restart "
                         "the run from step 0") from None
    try:
        weights = load_peft_weights(str(path / "adapter"), device="cpu")
    except Exception as e:
        raise BfspoError(f"{path / 'adapter'}: unreadable ({str(e).splitlines()[0]}); delete {path} to restart "
                         "the run from step 0") from None
    set_peft_model_state_dict(model, weights)
    optimizer.load_state_dict(state.pop("optimizer"))
    set_rng_state(state.pop("rng"))
    return state
