"""Files that are never half-written: atomic writes (of files and folders), fsynced appends of one line,
and JSONL reading with line-numbered errors.

Every write of a file goes through `_write_all`; a write that fails (a full disk, a quota, a
read-only file system) is a BfspoError naming the file, the cause and the disk space left there,
and leaves the file as it was: an atomic write removes its temporary file, an append cuts its
partial line off again."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterable, Iterator

from bfspo.errors import BfspoError


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to the file descriptor (os.write may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_error(path: str | os.PathLike, error: BaseException, what: str = "writing it failed") -> BfspoError:
    """The BfspoError of a write to `path` that failed: the file, the cause and the disk space left there."""
    where = Path(path).parent
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = f"{shutil.disk_usage(where).free / 2**20:.0f} MiB of disk space left there"
    except OSError:
        free = "disk space left there unknown"
    cause = (error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0])
    return BfspoError(f"{path}: {what} ({cause}); {free}")


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder, then rename it into place."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
            _write_all(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise write_error(path, e) from None
        raise


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append `line` and a newline to `path` (created if missing), on disk (fsynced) before this returns.
    A failed write is cut off again, so the file never ends in a partial line of this call."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as e:
        raise write_error(path, e) from None
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        _write_all(fd, (line + "\n").encode("utf-8"))
        os.fsync(fd)
    except OSError as e:
        with suppress(OSError):  # the error below names the file; a reader drops a torn last line
            os.ftruncate(fd, start)
        raise write_error(path, e) from None
    finally:
        os.close(fd)


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder beside `path` to fill, renamed to `path` (replacing it) when the block ends
    without error and removed otherwise: a half-written folder (a model directory) never looks finished."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomically write one JSON document (indented, keys in insertion order)."""
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    """Atomically write rows as JSON Lines; returns the number of rows."""
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def check_file(path: Path) -> None:
    """BfspoError unless `path` is a file, saying what it is instead."""
    if path.is_dir():
        raise BfspoError(f"{path}: a directory, not a file")
    if not path.is_file():
        raise BfspoError(f"{path}: no such file")


def read_jsonl(path: str | os.PathLike, skipped: list | None = None) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for each non-empty line.

    A line that is not a JSON object is an error naming file:line, or, when a `skipped` list is
    given, is recorded there as {"line", "problem"} and skipped (never silently).
    """
    path = Path(path)
    check_file(path)
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
                problem = None if isinstance(obj, dict) else f"expected a JSON object, got {type(obj).__name__}"
            except UnicodeDecodeError as e:
                problem = f"not UTF-8 text (byte {e.start + 1} of the line)"
            except json.JSONDecodeError as e:
                problem = f"not valid JSON ({e.msg})"
            if problem is None:
                yield lineno, obj
            elif skipped is None:
                raise BfspoError(f"{path}:{lineno}: {problem}")
            else:
                skipped.append({"line": lineno, "problem": problem})


def read_json(path: str | os.PathLike) -> Any:
    """Read one JSON document, with a clear error if it is missing or malformed."""
    path = Path(path)
    check_file(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BfspoError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
