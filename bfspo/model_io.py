"""Load a causal LM and its tokenizer from a hub id or a local directory, with an optional LoRA adapter;
save a LoRA adapter whose files are the same bytes for the same weights in every process.

Precision follows the paper's setting: bfloat16 on CUDA, float32 on CPU. Every way a user can
point at the wrong thing (a missing path, a folder that holds no model, a hub id that is neither
cached nor reachable: bfspo/model_source.py; a folder whose config.json asks for its own code, an
adapter trained on another base model) is a BfspoError naming it. So is a
model whose weights do not match its config.json (keys missing, unexpected or of another shape, as
transformers' loading report lists them): loaded anyway, it would be partly random. That check
runs on the meta device, before any memory is allocated, and names the config.json fields behind a
tensor of another shape: a damaged `vocab_size: 10**12` is named, not an allocation traceback.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bfspo.device import resolve_device
from bfspo.errors import BfspoError
from bfspo.io import read_json, write_json
from bfspo.model_source import check_model_source, offline

TOKENIZER_PROBE = "The answer is 42."


def default_device() -> torch.device:
    """CUDA if torch can use it, else the CPU (`device: auto`, bfspo.device)."""
    return resolve_device("auto")


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on CUDA, float32 elsewhere (CPU bf16 matmuls are slow and lose precision)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _from_pretrained(loader, name: str, **kw):
    """Call a transformers `from_pretrained` with `trust_remote_code=False`, turning a missing,
    uncached, unreadable or inconsistent model into a BfspoError (for a local folder: what is wrong
    with it, e.g. no weights, a truncated file, or a config.json whose fields contradict each other).

    trust_remote_code=False, not transformers' default None: given None, transformers asks on stdin
    whether to run a folder's own code (`auto_map`), and a `y` there would import it. Given False it
    raises at once, which `unloadable` names; every transformers load in bfspo passes False."""
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError

    try:
        return loader.from_pretrained(name, trust_remote_code=False, **kw)
    except ValueError as e:  # a model type transformers does not know, custom code it would have to run, ...
        raise BfspoError(unloadable(name, e)) from None
    except StrictDataclassError as e:  # e.g. num_hidden_layers 3 but 2 layer_types
        reason = str(e).strip().splitlines()[-1].strip().removeprefix("ValueError: ")
        raise BfspoError(f"{name}: its config.json contradicts itself ({reason})") from None
    except SafetensorError as e:
        files = ", ".join(sorted(p.name for p in Path(name).expanduser().glob("*.safetensors"))) or "a weights file"
        raise BfspoError(f"{name}: {files}: damaged or truncated ({e}); copy the model again") from None
    except RuntimeError as e:  # torch's allocators: a model too large for the memory, CUDA's or the host's
        if "allocate" not in str(e):
            raise
        raise BfspoError(f"{name}: not enough memory for the model its config.json describes "
                         f"({str(e).strip().splitlines()[0]})") from None
    except OSError as e:
        if Path(name).expanduser().is_dir():
            raise BfspoError(f"{name}: could not load the model folder ({str(e).splitlines()[0]})") from None
        if offline():
            raise BfspoError(f"{name}: not a local model directory and not in the Hugging Face cache "
                             "(HF_HUB_OFFLINE=1 forbids downloading it)") from None
        raise BfspoError(f"{name}: could not load ({e})") from None


def unloadable(name: str, error: ValueError) -> str:
    """Why transformers refused the model folder or hub id `name`, in a line."""
    config = Path(name).expanduser() / "config.json"
    try:
        fields = read_json(config) if config.is_file() else {}
    except BfspoError:
        fields = {}
    if isinstance(fields, dict) and isinstance(fields.get("auto_map"), dict):
        return (f"{name}: its config.json asks for the model's own code (auto_map: "
                f"{', '.join(map(str, fields['auto_map'].values()))}), which bfspo never runs, and its "
                f"model_type {fields.get('model_type')!r} is not one that transformers knows")
    return f"{name}: transformers cannot load it ({str(error).strip().splitlines()[0]})"


def load_tokenizer(name: str):
    """The model's tokenizer, left-padded for batched generation (pad falls back to EOS)."""
    from transformers import AutoTokenizer

    check_model_source(name)
    tokenizer = _from_pretrained(AutoTokenizer, name)
    if not tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False):
        raise BfspoError(f"{name}: its tokenizer encodes the text {TOKENIZER_PROBE!r} to no tokens, so it is not the "
                         "model's tokenizer (is tokenizer.json missing from the folder?)")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _same_model(recorded: str | None, given: str) -> bool:
    """Whether the base model an adapter records is `given`: the same string or the same local folder."""
    if recorded is None or recorded == given:
        return True
    a, b = Path(recorded).expanduser(), Path(given).expanduser()
    return a.exists() and b.exists() and a.resolve() == b.resolve()


def read_adapter_config(adapter: str) -> dict:
    """The adapter_config.json of a peft adapter directory (BfspoError if it is not one)."""
    config = Path(adapter) / "adapter_config.json"
    if not Path(adapter).is_dir():
        raise BfspoError(f"{adapter}: no such adapter directory")
    if not config.is_file():
        raise BfspoError(f"{adapter}: not a peft adapter directory (no adapter_config.json)")
    return read_json(config)


def save_adapter(model, path: str | Path) -> None:
    """`model.save_pretrained(path)` for a peft model, with its adapter_config.json the same bytes in
    every process: peft holds some fields as sets (`target_modules`) and writes them in the set's
    order, which follows Python's per-process string hashing; they are written sorted here, so that
    an adapter's fingerprint (done.json's `adapter_sha256`) is the same for the same weights."""
    model.save_pretrained(path)
    sets = {key for adapter in getattr(model, "peft_config", {}).values() for key, value in vars(adapter).items()
            if isinstance(value, set)}  # none for a model without peft's configs (nothing to normalise)
    if sets:
        config_file = Path(path) / "adapter_config.json"
        config = read_json(config_file)
        config.update({key: sorted(config[key]) for key in sets if isinstance(config.get(key), list)})
        write_json(config_file, config)


def check_adapter(adapter: str, name: str) -> dict:
    """The adapter's config, after checking that it was trained on base model `name`."""
    config = read_adapter_config(adapter)
    base = config.get("base_model_name_or_path")
    if not _same_model(base, name):
        raise BfspoError(f"adapter {adapter} was trained on base model {base!r}, not {name!r}; "
                         "pass that base model with --model")
    return config


def load_config(name: str):
    """The model's transformers config (BfspoError for a missing or uncached model)."""
    from transformers import AutoConfig

    check_model_source(name)
    return _from_pretrained(AutoConfig, name)


def _fields_of(config: dict, sizes: set[int]) -> str:
    """The top-level fields of a config whose integer value is among `sizes`: `vocab_size 1000000000000`."""
    return ", ".join(f"{k} {v}" for k, v in config.items() if type(v) is int and v in sizes)


def _check_loading_info(name: str, info: dict, config: dict) -> None:
    """BfspoError unless transformers' loading report of `name` is clean: no weight missing (it would be
    random), unexpected (the config describes another model) or of another shape, naming the fields of
    its config.json (`config`) behind the first such shape. transformers has already dropped what the
    architecture allows: a tied lm_head, rotary buffers and the like."""
    missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
    mismatched = sorted(info["mismatched_keys"])
    problems = [f"{len(keys)} {what} ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''})"
                for what, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
    if mismatched:
        key, found, expected = mismatched[0]
        fields = _fields_of(config, set(expected) - set(found))
        problems.append(f"{len(mismatched)} of another shape ({key} is {list(found)} in the weights, "
                        f"{list(expected)} in the model its config.json describes"
                        f"{f' with {fields}' if fields else ''}{', ...' if len(mismatched) > 1 else ''})")
    if problems:
        raise BfspoError(f"{name}: its weights do not match its config.json: {'; '.join(problems)}. A model "
                         "loaded from them would be partly random; copy the model folder again or fix its config.json")


def check_weights(name: str) -> None:
    """Check that the weights of model `name` match its config.json (see `_check_loading_info`), without
    loading them: the model is built on the meta device. For engines that load the weights themselves."""
    from transformers import AutoModelForCausalLM

    check_model_source(name)
    model, info = _from_pretrained(AutoModelForCausalLM, name, device_map="meta", output_loading_info=True,
                                   ignore_mismatched_sizes=True)
    _check_loading_info(name, info, model.config.to_dict())


def load_model(name: str, adapter: str | None = None, *, device: str | torch.device | None = None,
               dtype: torch.dtype | None = None, trainable: bool = False):
    """Return (model, tokenizer). With `adapter`, the model is a peft PeftModel (frozen unless
    `trainable`). The model is in eval mode on `device` (default: CUDA if present, else CPU).
    Weights that do not match the config (missing, unexpected, another shape) are a BfspoError, found
    on the meta device (`check_weights`) before the model is allocated."""
    from transformers import AutoModelForCausalLM

    device = torch.device(device) if device is not None else default_device()
    if adapter is not None:
        check_adapter(adapter, name)
    tokenizer = load_tokenizer(name)
    check_weights(name)
    model, info = _from_pretrained(AutoModelForCausalLM, name, dtype=dtype or default_dtype(device),
                                   output_loading_info=True, ignore_mismatched_sizes=True)
    _check_loading_info(name, info, model.config.to_dict())
    model = model.to(device)
    if adapter is not None:
        from peft import PeftModel

        try:
            model = PeftModel.from_pretrained(model, adapter, is_trainable=trainable)
        except (RuntimeError, ValueError) as e:
            raise BfspoError(f"adapter {adapter} does not fit model {name}: {str(e).splitlines()[0]}") from None
    model.eval()
    return model, tokenizer
