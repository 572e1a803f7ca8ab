"""Fingerprints: what a run was trained on and what an evaluation scored, by content, not by path.

A fingerprint of an input is a mapping {file name: SHA-256 of its bytes} over the files that make
it; `digest` turns it into one hex string. The inputs of a model folder are split in two:

- the model: config.json, generation_config.json, the weights (`*.safetensors`, `*.bin`, `*.pt`,
  `*.pth` and their `*.index.json`, with every shard an index names, in a subfolder too), and a
  peft adapter stored in the folder (adapter_config.json beside config.json: transformers applies
  it on load), the files transformers loads the network from;
- its tokenizer: `TOKENIZER_FILES` and the chat templates in `additional_chat_templates/`.

An adapter folder (peft) is its adapter_config.json and weights. Other files (README.md, a
`.cache/` folder) are not part of the identity: editing them changes nothing that is trained.

What is hashed is what is used. A data file is read once (`read_data`): its bytes are hashed and
then parsed, so a file replaced after the hash cannot be trained or scored on. A model folder is
too large to hold in memory twice, and transformers, peft and vLLM load it from its path: so
each file's status (device, inode, size, modification and change times) is stamped before it is
hashed (`stamps`), and `check_unchanged` refuses the run if any file was replaced or written to
between its stamp and the end of the loads. A write always moves a file's change time, which no
user can set back, so unchanged stamps mean the loaded bytes are the hashed ones.

Cost (`python -m bench.bench_fingerprint`; docs/workflow.md, "What makes a run the same run").
Every byte of a local model's files is hashed at the start of a run or an evaluation, on one core:
the toy model (1.9 MiB) in about 10 ms, a 1 GiB file in 1.1-1.7 s here, so a local 8B model in bf16
(16 GB) in 16-25 s, bytes that the trainer then reads again to load the model (from the page cache).
A hub id is read from the Hugging Face cache, whose weights are links to blobs named by their
SHA-256 (`models--*/blobs/<sha256>`, the hub's LFS identity). Such a name is trusted only where
the cache's layout proves it (`hub_blob`) and only once the bytes were checked against it: the
first use of a blob hashes it and records its stamp (`verified_blobs`); a later use whose stamp is
unchanged is not read, and one whose stamp moved (a write through the link) is hashed again, and
refused, naming the file, if its bytes are no longer the ones its name says. So the paper's hub
models cost their weights' hash once per machine, then only their small files. A link to a
`blobs/<sha256>` anywhere else is an ordinary file: its bytes are hashed. Only the files in
`HUB_PATTERNS` are fetched for a hub id: a hub repository with `*.bin` weights alone is known by
its config and tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.io import check_file, parse_object, read_json, write_json
from bfspo.model_source import check_model_source, offline

RUN_INPUTS = "inputs.json"  # a training run's fingerprints of its inputs, beside its config.json
MODEL_CONFIGS = ("config.json", "generation_config.json")
ADAPTER_CONFIGS = ("adapter_config.json",)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "tiktoken.model", "spiece.model",
                   "chat_template.jinja", "chat_template.json")
CHAT_TEMPLATE_DIR = "additional_chat_templates"  # more chat templates, `<name>.jinja`, that transformers loads
# what a hub model's fingerprint fetches (transformers loads safetensors where a repository has them)
HUB_PATTERNS = [*MODEL_CONFIGS, *ADAPTER_CONFIGS, "*.safetensors", "*.safetensors.index.json", *TOKENIZER_FILES,
                f"{CHAT_TEMPLATE_DIR}/*.jinja"]
# where the hub blobs checked against their names are recorded (`verified_blobs`); BFSPO_CACHE moves it
CACHE_ENV = "BFSPO_CACHE"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def stamp(path: Path) -> list[int]:
    """What changes whenever a file is replaced or written to: its device, inode, size and modification
    and change times (of the file a link leads to)."""
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


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


def _sha256_of_bytes(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hub_blob(path: Path) -> Path | None:
    """The blob that `path` links to where the Hugging Face cache's layout says its name is its
    SHA-256: `path` is a link inside `models--*/snapshots/<revision>/` (at any depth) to
    `blobs/<64 hex digits>` of that same `models--*` folder. None for any other file."""
    if not path.is_symlink():
        return None
    path = path.absolute()
    target = path.resolve()
    for snapshot in path.parents:
        if snapshot.parent.name == "snapshots" and snapshot.parent.parent.name.startswith("models--"):
            blobs = (snapshot.parent.parent / "blobs").resolve()
            return target if target.parent == blobs and _SHA256.fullmatch(target.name) else None
    return None


def verified_blobs() -> Path:
    """The folder of the records of hub blobs whose bytes were checked against their names: $BFSPO_CACHE,
    else $XDG_CACHE_HOME/bfspo, else ~/.cache/bfspo, then `verified-blobs/`."""
    root = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bfspo"
    return Path(root) / "verified-blobs"


def _blob_sha256(link: Path, blob: Path) -> str:
    """The SHA-256 of hub blob `blob` (reached through `link`): its name, once its bytes were checked
    against the name with the blob's stamp as it is now (a record in `verified_blobs`); otherwise the
    bytes are hashed, a BfspoError naming the link if they are not what the name says, and the
    check recorded (where the record cannot be written, the next use hashes the bytes again)."""
    record = verified_blobs() / f"{hashlib.sha256(str(blob).encode()).hexdigest()}.json"
    now = stamp(blob)
    try:
        seen, _ = parse_object(record.read_bytes())
    except OSError:
        seen = None
    if seen == {"blob": str(blob), "stamp": now}:
        return blob.name
    actual = _sha256_of_bytes(blob)
    if actual != blob.name:
        raise BfspoError(f"{link}: links to the Hugging Face cache blob {blob}, whose bytes are not the ones its name "
                         f"(their SHA-256) says: the file was written to or damaged since it was downloaded. Delete "
                         "it and download the model again")
    if stamp(blob) == now:  # not written to while it was hashed
        try:
            write_json(record, {"blob": str(blob), "stamp": now})
        except BfspoError:
            pass  # an unwritable cache costs a hash at the next use, nothing else
    return blob.name


def file_sha256(path: str | os.PathLike, stamps: dict[str, list[int]] | None = None) -> str:
    """SHA-256 of a file's bytes (BfspoError if it is missing or a directory), its `stamp` first put in
    `stamps` if given. A link to a blob of the Hugging Face cache (`hub_blob`) is named by that blob,
    whose bytes are read only when they were never checked against the name or have changed since."""
    path = Path(path)
    check_file(path)
    if stamps is not None:
        stamps[str(path)] = stamp(path)
    blob = hub_blob(path)
    return _blob_sha256(path, blob) if blob is not None else _sha256_of_bytes(path)


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


def _indexed_shards(folder: Path, names: list[str]) -> list[str]:
    """The shards that the weight indexes among `names` list (`weight_map`'s values, as transformers
    joins them to the folder: `sub/model-00001-of-00002.safetensors` too), each once."""
    shards = []
    for name in names:
        if name.endswith(".index.json"):
            weight_map = read_json(folder / name).get("weight_map")
            if not isinstance(weight_map, dict):
                raise BfspoError(f"{folder / name}: a weights index without a weight_map object")
            shards += [v for v in weight_map.values() if isinstance(v, str)]
    return sorted(set(shards) - set(names))


def part_files(folder: str | os.PathLike, part: str) -> list[str]:
    """The files (relative to `folder`) of one part of a model or adapter folder: `part` is "model",
    "tokenizer" or "adapter" (module doc): the top-level files transformers and peft load, the
    shards their weight indexes name, and the chat templates of `CHAT_TEMPLATE_DIR`."""
    wanted = {"model": lambda n: n in MODEL_CONFIGS or n in ADAPTER_CONFIGS or _is_weights(n),
              "adapter": lambda n: n in ADAPTER_CONFIGS or _is_weights(n),
              "tokenizer": lambda n: n in TOKENIZER_FILES}[part]
    folder = Path(folder)
    names = [p.name for p in sorted(folder.iterdir()) if wanted(p.name) and p.is_file()]
    if part == "tokenizer":
        templates = folder / CHAT_TEMPLATE_DIR
        if templates.is_dir():
            names += [f"{CHAT_TEMPLATE_DIR}/{p.name}" for p in sorted(templates.glob("*.jinja")) if p.is_file()]
        return names
    return names + _indexed_shards(folder, names)


def folder_files(folder: str | os.PathLike, part: str, stamps: dict[str, list[int]] | None = None) -> dict[str, str]:
    """The fingerprint of one part of a model or adapter folder (`part_files`): {name: SHA-256};
    each file's `stamp` goes to `stamps` if given."""
    folder = Path(folder)
    return {name: file_sha256(folder / name, stamps) for name in part_files(folder, part)}


def model_key(name: str) -> str:
    """A cheap key of local model folder `name`: a hash of the size and modification time of every
    file its fingerprint covers (`part_files`), read without reading the files. It changes when a
    file is replaced or written to in the usual ways, which the workflow's rules take as a parameter
    so that Snakemake reruns their jobs (each job then compares content). "" for a hub id or a path
    that holds no model (yet): nothing to key."""
    folder = Path(name).expanduser()
    if not (folder / "config.json").is_file():
        return ""
    sizes = []
    try:
        for part in ("model", "tokenizer"):
            for file in part_files(folder, part):
                try:
                    st = (folder / file).stat()
                    sizes.append([file, st.st_size, st.st_mtime_ns])
                except OSError:
                    sizes.append([file, None, None])
    except (BfspoError, OSError) as e:  # a damaged weights index: the job names it
        sizes.append(str(e))
    return hashlib.sha256(json.dumps(sizes).encode()).hexdigest()[:16]


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
    (each file's `stamp` to `stamps`, if given). A hub repository holding an adapter is refused:
    transformers would load the base model that its adapter_config.json names, from elsewhere."""
    folder = model_folder(name)
    if not Path(name).expanduser().is_dir() and (folder / ADAPTER_CONFIGS[0]).is_file():
        raise BfspoError(f"{name}: a hub repository holding a peft adapter (adapter_config.json), which transformers "
                         "applies to the base model its base_model_name_or_path names, which this fingerprint does not "
                         "cover; pass that base model with --model and a local copy of the adapter with --adapter")
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
