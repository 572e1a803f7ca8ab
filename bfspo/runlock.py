"""One writer per output directory: `bfspo train` and `bfspo evaluate` hold an exclusive lock on it.

The lock is `fcntl.flock` on DIR/.bfspo.lock, held for the command's whole life. A second process
on the same directory fails at once with a BfspoError naming the holder (command, host, pid and
Slurm job id), which the holder wrote into the lock file. The kernel releases the lock when its
holder dies, however it dies, so a killed run never blocks its rerun; the file itself stays.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bfspo.errors import BfspoError

LOCK_NAME = ".bfspo.lock"


def holder_description(command: str) -> str:
    """Who holds a lock: `bfspo train (host h, pid 12, Slurm job 345)`."""
    job = os.environ.get("SLURM_JOB_ID")
    return f"bfspo {command} (host {socket.gethostname()}, pid {os.getpid()}" + (f", Slurm job {job})" if job else ")")


@contextmanager
def hold(directory: str | os.PathLike, command: str) -> Iterator[Path]:
    """Create `directory` if needed and hold its lock for the `with` block; BfspoError if another
    process holds it or `directory` is not a directory (a file, a link that loops or leads nowhere)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise BfspoError(f"{directory}: exists and is not a directory")
    if directory.is_symlink() and not directory.exists():
        raise BfspoError(f"{directory}: a symbolic link (to {os.readlink(directory)}) that leads to no directory: "
                         "it loops, or its target is missing; remove it or point it at a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise BfspoError(f"{directory}: cannot create the output directory or its lock file ({e.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            raise BfspoError(f"{directory} is in use by {holder}; one process at a time may write it "
                             "(wait for that one, or stop it first)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder_description(command) + "\n").encode(), 0)
        yield directory
    finally:
        os.close(fd)
