"""The toy's shipped start model (issue 44): a tracked folder that `make toy` starts from, so that
the embedded default runs no SFT and starts from the same bytes on every CPU.

A shipped folder holds the model files of `bfspo toy build` (safetensors weights, config and
tokenizer files, sft.json) and PROVENANCE, a hash file of record.py's format whose header says what
made the model (the command, the CPU, the date, the commit, the CPU numerics, its size) and whose
lines pin every other file of the folder. Nothing in it runs code: `install` accepts only
safetensors, JSON and Jinja files (no pickles, no Python), each listed in PROVENANCE with its
SHA-256, and refuses the folder otherwise.

`export` makes a shipped folder from a built model directory; `install` checks one and copies it,
PROVENANCE included, to the model directory of the DAG (renamed into place last), where record.py's
toy check reads PROVENANCE to say that the run started from the shipped model.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.io import atomic_write_text
from bfspo.toy.record import PROVENANCE, build_info, format_record, read_record, sha256

SAFE_SUFFIXES = frozenset({".safetensors", ".json", ".jinja"})


def _model_files(folder: Path) -> list[Path]:
    """The files of a model folder but PROVENANCE and hidden ones; an error on anything that could
    run code or hide a file (a sub-folder, a link, a suffix other than SAFE_SUFFIXES)."""
    if not folder.is_dir():
        raise BfspoError(f"toy model: no directory {folder}")
    files = []
    for p in sorted(folder.iterdir()):
        if p.name == PROVENANCE or p.name.startswith("."):
            continue
        if p.is_symlink() or not p.is_file():
            raise BfspoError(f"toy model: {p} is not a plain file (a shipped model holds plain files only)")
        if p.suffix not in SAFE_SUFFIXES:
            raise BfspoError(f"toy model: {p}: only {', '.join(sorted(SAFE_SUFFIXES))} files may be shipped "
                             "(nothing that runs code)")
        files.append(p)
    if not any(p.name == "model.safetensors" for p in files):
        raise BfspoError(f"toy model: {folder} has no model.safetensors")
    return files


def export(model_dir: str | Path, out_dir: str | Path, size: str, command: str) -> str:
    """Copy a built model directory's files to the shipped folder `out_dir` with its PROVENANCE
    (what made it: `command`, `size` and record.build_info; the SHA-256 of every file, by its path
    as `out_dir` names it, so that `sha256sum -c` checks it from where it was given)."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    files = _model_files(model_dir)
    info = {"command": command, "size": size} | build_info(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for p in files:
        shutil.copyfile(p, out_dir / p.name)
    hashes = {(out_dir / p.name).as_posix(): sha256(out_dir / p.name) for p in files}
    atomic_write_text(out_dir / PROVENANCE, format_record(info, hashes))
    return f"bfspo toy export: {len(files)} files and {PROVENANCE} in {out_dir}"


def verify(shipped_dir: str | Path, size: str) -> dict[str, str]:
    """PROVENANCE's header, once every file of the shipped folder is one it lists with that SHA-256
    and it lists no other, and the folder's model is of `size`."""
    shipped_dir = Path(shipped_dir)
    record = shipped_dir / PROVENANCE
    if not record.is_file():
        raise BfspoError(f"toy model: {shipped_dir} has no {PROVENANCE} (not a shipped model folder)")
    info, listed = read_record(record)
    listed = {Path(p).name: digest for p, digest in listed.items()}
    present = {p.name: p for p in _model_files(shipped_dir)}
    if present.keys() != listed.keys():
        extra, missing = sorted(present.keys() - listed.keys()), sorted(listed.keys() - present.keys())
        raise BfspoError(f"toy model: {record} does not list the folder's files"
                         + (f"; not listed: {', '.join(extra)}" if extra else "")
                         + (f"; missing: {', '.join(missing)}" if missing else ""))
    for name, p in present.items():
        if sha256(p) != listed[name]:
            raise BfspoError(f"toy model: {p} does not have the SHA-256 that {record} gives it")
    if info.get("size") != size:
        raise BfspoError(f"toy model: {shipped_dir} holds a toy model of size {info.get('size')!r}, the config asks "
                         f"for {size!r}: set toy.build: true to build it")
    return info


def install(shipped_dir: str | Path, out_dir: str | Path, size: str) -> str:
    """Check the shipped folder (`verify`) and copy it to `out_dir`, renamed into place last."""
    shipped_dir, out_dir = Path(shipped_dir), Path(out_dir)
    info = verify(shipped_dir, size)
    if out_dir.exists():
        raise BfspoError(f"toy model: {out_dir} exists already")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would keep other users from the model
        for p in _model_files(shipped_dir) + [shipped_dir / PROVENANCE]:
            shutil.copyfile(p, tmp / p.name)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return (f"bfspo toy install: the shipped start model {shipped_dir} (built at commit {info.get('commit', '?')} "
            f"on {info.get('cpu', '?')}, {info.get('date', '?')}) copied to {out_dir}; no SFT ran")
