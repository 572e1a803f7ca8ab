"""`bfspo model from-gguf FILE OUT`: an ordinary Hugging Face model folder from a GGUF file.

transformers reads GGUF files (with the `gguf` package) and de-quantizes their weights, but it
refuses to save a model loaded that way: the model keeps a GGUF quantization config whose
quantizer is not serializable. We ask for the de-quantized load outright
(`GgufConfig(dequantize=True)`), for which transformers itself removes the quantization config
once the weights are in place, and check that it did; the result is a plain model that
`save_pretrained` writes as safetensors, beside its config, generation config and tokenizer
(with the chat template the GGUF file carries).

The weights are written in float32. The de-quantized values are exact in float32 (a 4- or 8-bit
integer times a float16 scale, plus a float16 offset), and float32 is what the CPU paths of this
project run in (bfspo.model_io.default_dtype; vLLM on CPU matches transformers exactly only in
float32). bfloat16 would round them a second time; a GPU run casts to bfloat16 when it loads the
folder anyway. The cost is disk: 4 bytes per parameter (0.54 GB for SmolLM2-135M).

The folder is written through a temporary folder beside OUT and renamed at the end, so a half
written model never looks finished.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.io import atomic_dir

GGUF_MAGIC = b"GGUF"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    gguf = sub.add_parser("from-gguf", help="write a Hugging Face model folder (safetensors, config, tokenizer) "
                                            "from a GGUF file")
    gguf.add_argument("file", type=Path, help="the .gguf file")
    gguf.add_argument("out", type=Path, help="the model folder to write (replaced if it exists)")


def check_gguf(path: Path) -> None:
    """BfspoError unless `path` is a readable file that starts with the GGUF magic bytes."""
    if not path.is_file():
        raise BfspoError(f"{path}: no such file")
    with path.open("rb") as f:
        if f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise BfspoError(f"{path}: not a GGUF file (it does not start with {GGUF_MAGIC.decode()})")


def from_gguf(path: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Convert the GGUF file `path` into the Hugging Face model folder `out` (float32 safetensors,
    config.json, generation_config.json, tokenizer files and chat template); returns `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    path, out = Path(path), Path(out)
    check_gguf(path)
    folder, name = str(path.resolve().parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, trust_remote_code=False,
                                                     quantization_config=GgufConfig(gguf_file=name, dequantize=True))
    except (ValueError, KeyError, NotImplementedError, OSError) as e:
        raise BfspoError(f"{path}: transformers cannot load this GGUF file ({str(e).splitlines()[0]})") from None
    if getattr(model, "is_quantized", False) or hasattr(model.config, "quantization_config"):
        raise BfspoError(f"{path}: the model still holds quantized weights after loading, so it cannot be saved "
                         "as a plain model")
    if tokenizer.chat_template is None:
        raise BfspoError(f"{path}: the file carries no chat template, which the benchmarks' prompts need")
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out


def run(args: argparse.Namespace) -> int:
    out = from_gguf(args.file, args.out)
    print(f"{args.file} -> {out} (float32 safetensors, config, tokenizer with its chat template)")
    return 0
