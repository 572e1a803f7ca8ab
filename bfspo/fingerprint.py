"""Fingerprints: what a run was trained on and what an evaluation scored, by content, not by path.

A fingerprint of an input is a mapping {file name: SHA-256 of its bytes} over the files that make
it; `digest` turns it into one hex string. The inputs of a model folder are split in two:

- the model: config.json, generation_config.json and the weights (`*.safetensors`, `*.bin`,
  `*.pt`, `*.pth` and their `*.index.json`), the files transformers loads the network from;
- its tokenizer: `TOKENIZER_FILES`.

An adapter folder (peft) is its adapter_config.json and weights. Other files (README.md, a
`.cache/` folder) are not part of the identity: editing them changes nothing that is trained.

What is hashed is what is used. A data file is read once (`read_data`): its bytes are hashed and
then parsed, so a file replaced after the hash cannot be trained or scored on. A model folder is
too large to hold in memory twice, and transformers, peft and vLLM load it from its path: so
each file's status (inode, size, modification and change times) is stamped before it is hashed
(`stamps`), and `check_unchanged` refuses the run if any file was replaced or written to between
its stamp and the end of the loads. A write always moves a file's change time, which no user can
set back, so unchanged stamps mean the loaded bytes are the hashed ones.

Cost (`python -m bench.bench_fingerprint`; docs/workflow.md, "What makes a run the same run").
Every byte of a local model's files is hashed at the start of a run or an evaluation, on one core:
the toy model (1.9 MiB) in about 10 ms, a 1 GiB file in 1.1-1.7 s here, so a local 8B model in bf16
(16 GB) in 16-25 s, bytes that the trainer then reads again to load the model (from the page cache).
A hub id is read from the Hugging Face cache, whose weights are links to blobs named by their
SHA-256 (`blobs/<sha256>`, the hub's LFS identity): they are not read at all, so the paper's hub
models cost only their small files. Only the files in `HUB_PATTERNS` are fetched for it: a hub
repository with `*.bin` weights alone is known by its config and tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.io import check_file
from bfspo.model_source import check_model_source, offline

RUN_INPUTS = "inputs.json"  # a training run's fingerprints of its inputs, beside its config.json
MODEL_CONFIGS = ("config.json", "generation_config.json")
ADAPTER_CONFIGS = ("adapter_config.json",)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
                   "chat_template.jinja", "chat_template.json")
# what a hub model's fingerprint fetches (transformers loads safetensors where a repository has them)
HUB_PATTERNS = [*MODEL_CONFIGS, "*.safetensors", "*.safetensors.index.json", *TOKENIZER_FILES]
_SHA256 = re.compile(r"[0-9a-f]{64}")


def stamp(path: Path) -> list[int]:
    """What changes whenever a file is replaced or written to: its inode, size and modification and
    change times (of the file a link leads to)."""
    st = path.stat()
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def check_unchanged(stamps: dict[str, list[int]], used: str) -> None:
    """BfspoError naming the files of `stamps` (path -> `stamp` taken before its hash) that were
    replaced or written to since, or are gone: what was `used` is then not what was fingerprinted."""
    moved = []
    for name, before in stamps.items():
        try:
            if stamp(Path(name)) != before:
                moved.append(name)
        except OSError:
            moved.append(name)
    if moved:
        raise BfspoError(f"{', '.join(moved)}: replaced or written to between its fingerprint and the end of {used}, "
                         "so what was loaded may not be what the run records; run the command again once the files "
                         "are in place")


def file_sha256(path: str | os.PathLike, stamps: dict[str, list[int]] | None = None) -> str:
    """SHA-256 of a file's bytes (BfspoError if it is missing or a directory), its `stamp` first put in
    `stamps` if given. A link into the Hugging Face cache's `blobs/` folder under a 64-hex name is
    named by that hash already: it is not read."""
    path = Path(path)
    check_file(path)
    if stamps is not None:
        stamps[str(path)] = stamp(path)
    target = path.resolve()
    if path.is_symlink() and target.parent.name == "blobs" and _SHA256.fullmatch(target.name):
        return target.name
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def digest(files: dict[str, str]) -> str:
    """One SHA-256 of a fingerprint (file name -> SHA-256): equal exactly when every file is."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def read_data(path: str | os.PathLike) -> tuple[bytes, dict[str, str]]:
    """A data file's bytes, read once, and their fingerprint {its name: SHA-256 of those bytes}: the
    caller parses the bytes it hashed (bfspo.io.read_jsonl's `data`)."""
    path = Path(path)
    check_file(path)
    data = path.read_bytes()
    return data, {path.name: hashlib.sha256(data).hexdigest()}


def _is_weights(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES)


def folder_files(folder: str | os.PathLike, part: str, stamps: dict[str, list[int]] | None = None) -> dict[str, str]:
    """The fingerprint of one part of a model or adapter folder (its top-level files only, as
    transformers and peft load them): `part` is "model", "tokenizer" or "adapter" (module doc);
    each file's `stamp` goes to `stamps` if given."""
    wanted = {"model": lambda n: n in MODEL_CONFIGS or _is_weights(n),
              "adapter": lambda n: n in ADAPTER_CONFIGS or _is_weights(n),
              "tokenizer": lambda n: n in TOKENIZER_FILES}[part]
    folder = Path(folder)
    return {p.name: file_sha256(p, stamps) for p in sorted(folder.iterdir()) if wanted(p.name) and p.is_file()}


def model_folder(name: str) -> Path:
    """The local folder of model `name`: the folder itself, or a hub id's snapshot in the Hugging Face
    cache (fetched there first, only the files a fingerprint reads, unless offline, as transformers would).
    BfspoError as in bfspo.model_source for a missing folder or an uncached hub id offline."""
    from huggingface_hub import snapshot_download

    check_model_source(name)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_PATTERNS, local_files_only=offline()))
    except Exception as e:  # huggingface_hub raises a dozen kinds for a missing, gated or uncached repository
        why = ("HF_HUB_OFFLINE=1 forbids downloading it" if offline() else str(e).splitlines()[0])
        raise BfspoError(f"{name}: not a local model directory and not in the Hugging Face cache ({why})") from None


def model_inputs(name: str, stamps: dict[str, list[int]] | None = None) -> dict[str, dict[str, str]]:
    """{"model": ..., "tokenizer": ...}: the fingerprints of model `name`'s network and its tokenizer
    (each file's `stamp` to `stamps`, if given)."""
    folder = model_folder(name)
    return {part: folder_files(folder, part, stamps) for part in ("model", "tokenizer")}


def changed(recorded: dict[str, dict], current: dict[str, dict]) -> list[str]:
    """The inputs whose fingerprints differ, each with the files that changed:
    `train_data (train.jsonl)`, `model (model.safetensors)`; an input with no record at all is named
    as such. An input of one file on both sides (a data file) is compared by its bytes alone: its
    name says where it is, not what it holds."""
    out = []
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key), current.get(key)
        if old == new or isinstance(old, dict) and isinstance(new, dict) and len(old) == len(new) == 1 \
                and list(old.values()) == list(new.values()):
            continue
        if not isinstance(old, dict) or not isinstance(new, dict):
            out.append(f"{key} (not recorded)" if old is None else key)
            continue
        files = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
        out.append(f"{key} ({', '.join(files)})")
    return out
