"""Earlier results set aside, never deleted: `DIR/previous/<n>/`, one folder per earlier run or evaluation.

When a training run's inputs change, or an evaluation is rerun with other settings, the earlier
result in the same folder is moved aside (`set_aside`), with its W&B run (wandb/ and wandb_id.txt),
so that the new one starts clean and gets a W&B run of its own. The move is made crash-safe in two
steps of renames, each atomic:

1. each entry goes into the staging folder `DIR/previous/.incoming/` (created first);
2. the staging folder is renamed to `DIR/previous/<n>/`, n one more than the highest there.

A kill at any point leaves every byte of the earlier result under DIR: in place, in the staging
folder, or in `previous/<n>/`. A staging folder found at the next start (`finish_set_aside`) means
that a move was interrupted: since nothing new is written before the move ends, what is still in
place belongs to the earlier result too, and the move is completed. Nothing under previous/ is
ever deleted or replaced: every earlier result stays until the user deletes it (the files that an
older bfspo put directly in previous/ stay there too, beside the numbered folders). `bfspo sync`
leaves out every W&B run under previous/ (bfspo/reporting/sync.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

PREVIOUS_NAME = "previous"
STAGING_NAME = ".incoming"


def _move(src: Path, dst: Path) -> None:
    """One step of a move: an atomic rename (the tests make a step fail here, as a kill would)."""
    os.rename(src, dst)


def slot_number(name: str) -> int | None:
    """The n of a set-aside folder previous/<n>: ASCII decimal digits only; None for any other name
    (a folder `²` or `٣` that someone made there is not a slot, and is left alone)."""
    return int(name) if name.isascii() and name.isdigit() else None


def _next_slot(previous: Path) -> Path:
    """previous/<n> with n one more than the highest number there (1 for none)."""
    numbers = [n for n in map(slot_number, (p.name for p in previous.iterdir())) if n is not None]
    return previous / str(max(numbers, default=0) + 1)


def holdings(folder: Path) -> tuple[int, int]:
    """(earlier results, bytes) that `folder`/previous/ holds: its numbered folders, and the size of
    every file under it (links not followed)."""
    previous = folder / PREVIOUS_NAME
    if not previous.is_dir():
        return 0, 0
    slots = sum(p.is_dir() and slot_number(p.name) is not None for p in previous.iterdir())
    size = sum(p.lstat().st_size for p in previous.rglob("*") if p.is_file() and not p.is_symlink())
    return slots, size


def holdings_line(folder: Path, what: str) -> str:
    """One line saying how many earlier `what`s (run, evaluation) and bytes `folder`/previous/ holds."""
    slots, size = holdings(folder)
    return (f"{folder / PREVIOUS_NAME} now holds {slots} earlier {what}{'' if slots == 1 else 's'}, "
            f"{size:,} bytes ({size / 2**20:.1f} MiB); nothing there is deleted but by you")


def _complete(folder: Path, names: Iterable[str]) -> Path | None:
    """Move `names` (those present) of `folder` into the staging folder, then rename it to a new
    previous/<n>; that folder, or None when the staging folder ends up empty (then it is removed)."""
    staging = folder / PREVIOUS_NAME / STAGING_NAME
    for name in names:
        if (folder / name).exists() or (folder / name).is_symlink():
            _move(folder / name, staging / name)
    if not any(staging.iterdir()):
        staging.rmdir()
        return None
    slot = _next_slot(staging.parent)
    _move(staging, slot)
    return slot


def set_aside(folder: Path, names: Iterable[str]) -> Path | None:
    """Move the entries `names` of `folder` (those present) to a new `folder/previous/<n>/` (module
    doc); that folder, or None if none of them is there."""
    names = [n for n in names if (folder / n).exists() or (folder / n).is_symlink()]
    if not names:
        return None
    (folder / PREVIOUS_NAME / STAGING_NAME).mkdir(parents=True, exist_ok=True)
    return _complete(folder, names)


def finish_set_aside(folder: Path, names: Callable[[], Iterable[str]]) -> Path | None:
    """Complete a move that a kill interrupted (a staging folder is there): the entries `names()`
    still in `folder` join those already moved; the new previous/<n>, or None if there was no move
    to complete."""
    if not (folder / PREVIOUS_NAME / STAGING_NAME).is_dir():
        return None
    return _complete(folder, names())
