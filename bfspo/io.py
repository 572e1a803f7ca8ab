"""Files that are never half-written: atomic writes (of files and folders), and JSONL reading with line-numbered errors."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from bfspo.errors import BfspoError


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
