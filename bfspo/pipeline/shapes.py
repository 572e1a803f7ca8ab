"""A model's shapes, read from its config.json: what the memory and time plan is computed from.

A hub model's config.json ships in this repository, under config/models/<hub id>/config.json
(a few kB each; config/models/README.md cites where each value comes from); a local model
directory's own config.json is read where it exists. Only decoder-only models with Llama's layer
layout (Qwen2, Llama, Mistral: RMSNorm, grouped-query attention, SwiGLU MLP) are planned.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.io import read_json

# Where the config.json files of hub models ship, in a source checkout.
MODELS_DIR = Path(__file__).resolve().parents[2] / "config" / "models"
# Model types whose decoder layer is Llama's: q/k/v/o projections, RMSNorm, SwiGLU.
LLAMA_LAYOUT = {"llama": False, "qwen2": True, "mistral": False}  # model_type -> q/k/v projections have biases
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Shape:
    """The shapes of a decoder-only transformer (the fields of its config.json)."""

    name: str
    hidden: int  # hidden_size
    intermediate: int  # intermediate_size
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    vocab: int  # vocab_size
    max_positions: int  # max_position_embeddings
    tied: bool  # tie_word_embeddings
    qkv_bias: bool  # Qwen2's q/k/v projections have biases
    dtype: str = "bfloat16"  # torch_dtype of the published weights

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer, by module name (LoRA's targets)."""
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def from_config(name: str, cfg: dict) -> Shape:
    """The Shape of a config.json's contents; a missing key or another layer layout is an error."""
    model_type = cfg.get("model_type")
    if model_type not in LLAMA_LAYOUT:
        raise BfspoError(f"{name}: model_type {model_type!r} is not planned (known: {', '.join(LLAMA_LAYOUT)})")
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
            "max_position_embeddings")
    missing = [k for k in keys if type(cfg.get(k)) is not int or cfg[k] <= 0]
    if missing:
        raise BfspoError(f"{name}: config.json lacks a positive integer {', '.join(missing)}")
    return Shape(
        name=name, hidden=cfg["hidden_size"], intermediate=cfg["intermediate_size"], layers=cfg["num_hidden_layers"],
        heads=cfg["num_attention_heads"], kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        vocab=cfg["vocab_size"], max_positions=cfg["max_position_embeddings"],
        tied=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=LLAMA_LAYOUT[model_type] or bool(cfg.get("attention_bias", False)),
        dtype=cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16",
    )


def config_path(model: str, models_dir: Path = MODELS_DIR) -> Path | None:
    """The config.json of a model path: the local directory's own, else the shipped one of a hub id."""
    for path in (Path(model) / "config.json", models_dir / model / "config.json"):
        if path.is_file():
            return path
    return None


def load_shape(model: str, models_dir: Path = MODELS_DIR) -> Shape:
    """The Shape of a model path or hub id (see `config_path`); an unknown model is an error naming
    where its config.json was looked for, and a config.json that is not a readable JSON object (not
    UTF-8, nested too deeply, not JSON: bfspo.io.read_json) an error naming the file."""
    path = config_path(model, models_dir)
    if path is None:
        raise BfspoError(f"{model}: no config.json in {model}/ nor in {models_dir / model}/; for a hub model, "
                         "add its config.json there (a few kB, no weights)")
    return from_config(model, read_json(path))
