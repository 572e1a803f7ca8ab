"""Files that are never half-written: atomic writes (of files and folders), fsynced appends of one line,
and JSON and JSONL reading whose every failure is a BfspoError naming the file (and line).

Every write of a file goes through `_write_all`; a write that fails (a full disk, a quota, a
read-only file system) is a BfspoError naming the file, the cause and the disk space left there,
and leaves the file as it was: an atomic write removes its temporary file, an append cuts its
partial line off again. A kill between the two steps of an atomic write leaves its temporary
file (`.NAME.<random>.tmp`), which `remove_temporaries` clears at the next start.

A document or line is read only if it is UTF-8 text, nested at most `MAX_DEPTH` deep (checked
before parsing: a row of 100,000 brackets would otherwise exhaust Python's recursion) and a JSON
object; anything else is named, never a traceback.

Every YAML file bfspo reads (workflow and training configs, the Slurm profile, the config schema)
goes through `read_yaml`, and every YAML text (a `--set` value) through `parse_yaml`: at most
`MAX_YAML_BYTES`, UTF-8, and at most `MAX_YAML_NODES` values once every alias is expanded
(`check_expansion`). PyYAML builds an alias as a reference, so a kilobyte of aliases of aliases
loads at once as a few shared lists; whatever walks it afterwards (a schema validation, an error
message that prints it) expands it, without bound. The workflow checks its merged `config` with
`check_expansion` as well (workflow/rules/common.smk), before anything walks it.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml

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


TMP_SUFFIX = ".tmp"  # an atomic write's temporary file: `.NAME.<random>.tmp` beside NAME


def remove_temporaries(folder: str | os.PathLike) -> list[str]:
    """Delete the temporary files that killed atomic writes left directly in `folder` (`.NAME.*.tmp`,
    nothing else); their names. Call it only while holding the folder's lock (bfspo.runlock): another
    writer's temporary file is in use."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(TMP_SUFFIX) and p.is_file()]
    for p in found:
        p.unlink(missing_ok=True)
    return sorted(p.name for p in found)


def _temporary(path: Path, text: str) -> str:
    """A fsynced temporary file beside `path` (`.NAME.<random>.tmp`) holding `text`; its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        _write_all(fd, text.encode("utf-8"))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder, then rename it into place."""
    atomic_write_set({path: text})


def atomic_write_set(files: dict, marker: str | os.PathLike | None = None) -> None:
    """Write several files ({path: text}) as one unit: each to a temporary file first, then `marker`
    (naming the files being replaced), then each renamed into place, then the marker removed. A kill
    leaves either the old files (and temporaries, `remove_temporaries`), or the marker beside a mix
    of old and new files: a half-written set is never taken for a finished one (`check_set`). One
    file needs no marker (its rename is atomic)."""
    paths = [Path(p) for p in files]
    tmps: dict[Path, str] = {}
    current = paths[0]
    try:
        for current, text in zip(paths, files.values()):
            tmps[current] = _temporary(current, text)
        if marker is not None:
            current = Path(marker)
            atomic_write_text(current, "being replaced: " + ", ".join(p.name for p in paths) + "\n")
        for current in paths:
            os.replace(tmps[current], current)
            del tmps[current]
        if marker is not None:
            current = Path(marker)
            current.unlink()
    except BaseException as e:
        for tmp in tmps.values():
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise write_error(current, e) from None
        raise


def check_set(marker: str | os.PathLike, path: str | os.PathLike) -> None:
    """BfspoError naming `path` when the set of files it belongs to was left half-written
    (`atomic_write_set`'s `marker` is still there)."""
    if Path(marker).exists():
        raise BfspoError(f"{path}: half-written ({Path(marker).name} is there: a write of its set of files "
                         "was interrupted); write the set again")


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


MAX_DEPTH = 100  # brackets nested in one JSON document or row; bfspo's own nest at most 5 deep
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')
_PAIR = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def too_deep(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text `raw` nests brackets more than `limit` deep, found without parsing it:
    strings dropped, the brackets kept, then one level of empty pairs removed per pass (brackets
    never closed count as levels too). Other malformed text is left to the parser, which names it."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for level in range(limit + 1):
        brackets, removed = _PAIR.subn(b"", brackets)
        if not removed:
            return level + len(brackets) - len(brackets.lstrip(b"[{")) > limit
    return True


def parse_object(raw: bytes) -> tuple[dict | None, str | None]:
    """(the JSON object `raw` holds, None), or (None, what is wrong with it): not UTF-8, nested more
    than MAX_DEPTH deep, not JSON, or JSON of another type."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 text (byte {e.start + 1})"
    if too_deep(raw):
        return None, f"JSON nested more than {MAX_DEPTH} levels deep"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}" if "\n" in text.strip() else f"column {e.colno}"
        return None, f"not valid JSON ({e.msg} at {where})"
    except RecursionError:  # a backstop (too_deep passes at most MAX_DEPTH levels): never a traceback
        return None, "JSON nested too deeply to parse"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    return obj, None


def read_jsonl(path: str | os.PathLike, skipped: list | None = None,
               data: bytes | None = None) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for each non-empty line of `path`, or of `data` (the file's bytes,
    read already: what a run hashed is what it parses, bfspo.fingerprint.read_data).

    A line that is not a JSON object (`parse_object`) is an error naming file:line, or, when a
    `skipped` list is given, is recorded there as {"line", "problem"} and skipped (never silently).
    """
    path = Path(path)
    if data is None:
        check_file(path)
    with (io.BytesIO(data) if data is not None else path.open("rb")) as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            obj, problem = parse_object(raw)
            if problem is None:
                yield lineno, obj
            elif skipped is None:
                raise BfspoError(f"{path}:{lineno}: {problem}")
            else:
                skipped.append({"line": lineno, "problem": problem})


def read_json(path: str | os.PathLike) -> dict:
    """Read one JSON document holding an object; a missing file, or one that is not a readable JSON
    object (`parse_object`), is a BfspoError naming the file."""
    path = Path(path)
    check_file(path)
    obj, problem = parse_object(path.read_bytes())
    if problem is not None:
        raise BfspoError(f"{path}: {problem}")
    return obj


MAX_YAML_BYTES = 1 << 20  # a YAML file bfspo reads; config/paper.yaml is 9 KB
MAX_YAML_NODES = 100_000  # values of a YAML document with its aliases expanded; paper.yaml has about 1,000


def check_expansion(data: Any, source: str, limit: int = MAX_YAML_NODES) -> None:
    """BfspoError naming `source` unless `data` (mappings, lists and scalars, as YAML loads them)
    holds at most `limit` values when every shared part is counted as often as it is referred to,
    and contains no part of itself. Counted once per distinct part: linear in what was loaded."""
    sizes: dict[int, int] = {}
    open_ids: set[int] = set()

    def size(x, depth: int) -> int:
        if not isinstance(x, (dict, list)):
            return 1
        key = id(x)
        if key in sizes:
            return sizes[key]
        if key in open_ids:
            raise BfspoError(f"{source}: a YAML alias refers to a value that contains it")
        if depth > MAX_DEPTH:
            raise BfspoError(f"{source}: YAML nested more than {MAX_DEPTH} levels deep")
        open_ids.add(key)
        total = 1
        for item in (x.items() if isinstance(x, dict) else x):
            total += sum(size(y, depth + 1) for y in item) if isinstance(x, dict) else size(item, depth + 1)
            if total > limit:
                raise BfspoError(f"{source}: more than {limit:,} values once its YAML aliases are expanded "
                                 "(aliases of aliases?); refused")
        open_ids.discard(key)
        sizes[key] = total
        return total

    size(data, 0)


def parse_yaml(text: str | bytes, source: str) -> Any:
    """The YAML document `text` (`source` names it in errors): UTF-8, valid YAML, and within
    `check_expansion`; anything else is a BfspoError naming `source`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BfspoError(f"{source}: not UTF-8 text (byte {e.start + 1})") from None
    try:
        data = yaml.load(text, Loader=yaml.SafeLoader)  # libyaml's CSafeLoader crashes on deep nesting
    except yaml.YAMLError as e:
        raise BfspoError(f"{source}: not valid YAML ({' '.join(str(e).split())})") from None
    except RecursionError:
        raise BfspoError(f"{source}: YAML nested too deeply to parse") from None
    check_expansion(data, source)
    return data


def read_yaml(path: str | os.PathLike) -> Any:
    """The YAML file at `path` (a regular file of at most MAX_YAML_BYTES), through `parse_yaml`."""
    path = Path(path)
    check_file(path)
    with path.open("rb") as f:
        raw = f.read(MAX_YAML_BYTES + 1)
    if len(raw) > MAX_YAML_BYTES:
        raise BfspoError(f"{path}: larger than {MAX_YAML_BYTES >> 20} MiB, too large for a YAML config")
    return parse_yaml(raw, str(path))
