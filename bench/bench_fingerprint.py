"""What the input fingerprints cost at the start of `bfspo train` and `bfspo evaluate` (bfspo/fingerprint.py).

Builds the toy model at each size of bfspo/toy/sft.py (random weights: hashing does not depend on
their values), times `model_inputs` on each, and times `file_sha256` on a weights file of
`--gib` GiB of random bytes (read from the page cache, as a model folder just copied or loaded is),
from which the cost of a local 8B model in bf16 (16 GB) follows. The same file as a blob of a
Hugging Face cache is timed at its first use (hashed, to check it against its name) and at a later
one (its name trusted, the bytes not read).

    python -m bench.bench_fingerprint [--gib 1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.common import print_table
from bfspo import fingerprint
from bfspo.toy.model import new_model, save_model_dir, train_tokenizer
from bfspo.toy.sft import SIZES

CORPUS = ["Tom has 3 apples and buys 4 more. 3 + 4 = 7. The answer is \\boxed{7}."] * 200
MODEL_8B_BYTES = 16e9


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def hub_link(weights: Path, cache: Path) -> Path:
    """`weights` moved into a Hugging Face cache layout as a blob named by its SHA-256; the snapshot's link."""
    snapshot = cache / "models--org--bench" / "snapshots" / ("0" * 40)
    blobs = cache / "models--org--bench" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    blob = blobs / fingerprint.file_sha256(weights)
    os.replace(weights, blob)
    (snapshot / "model.safetensors").symlink_to(f"../../blobs/{blob.name}")
    return snapshot / "model.safetensors"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the synthetic weights file")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size, cfg in SIZES.items():
            tok = train_tokenizer(CORPUS, vocab_size=cfg.vocab_size)
            model = new_model(tok, hidden_size=cfg.hidden_size, layers=cfg.layers, heads=cfg.heads,
                              kv_heads=cfg.kv_heads, intermediate_size=cfg.intermediate_size, seed=0)
            folder = save_model_dir(model, tok, Path(tmp) / size)
            mib = sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 2**20
            rows.append([f"toy {size}", f"{mib:.1f} MiB", f"{timed(lambda: fingerprint.model_inputs(str(folder))) * 1e3:.0f} ms"])
        weights = Path(tmp) / "model.safetensors"
        with weights.open("wb") as f:
            for _ in range(int(args.gib * 1024)):
                f.write(os.urandom(1 << 20))
        seconds = timed(lambda: fingerprint.file_sha256(weights))
        rows.append([f"one weights file ({args.gib:g} GiB)", f"{args.gib * 1024:.0f} MiB", f"{seconds:.2f} s"])
        rate = args.gib * 2**30 / seconds
        rows.append(["local 8B model, bf16 (extrapolated)", "16 GB", f"{MODEL_8B_BYTES / rate:.0f} s"])
        os.environ[fingerprint.CACHE_ENV] = str(Path(tmp) / "bfspo-cache")
        link = hub_link(weights, Path(tmp) / "hub")
        for use in ("first use", "later use"):
            seconds = timed(lambda: fingerprint.file_sha256(link))
            rows.append([f"the same file as a hub blob, {use}", f"{args.gib * 1024:.0f} MiB", f"{seconds * 1e3:.1f} ms"])
    print_table("Input fingerprints (bfspo/fingerprint.py), one core", ["input", "size", "fingerprint"], rows)


if __name__ == "__main__":
    main()
