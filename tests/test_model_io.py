"""Loading a model, its tokenizer and a LoRA adapter, and every way of pointing at the wrong thing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from bfspo.errors import BfspoError
from bfspo.model_io import check_adapter, default_dtype, load_config, load_model, load_tokenizer
from bfspo.toy.model import new_model, save_model_dir


def make_adapter(model_dir, out_dir, **lora):
    """A peft LoRA adapter with non-zero B (so it changes the output), saved from `model_dir`."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir))
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False, **lora)
    get_peft_model(base, config).save_pretrained(str(out_dir))
    return out_dir


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory):
    return make_adapter(tiny_model_dir, tmp_path_factory.mktemp("adapter"))


@pytest.fixture(scope="module")
def other_model_dir(tiny_model_dir, tmp_path_factory):
    """A model of another shape (hidden 48) with the same tokenizer."""
    tokenizer = load_tokenizer(str(tiny_model_dir))
    return save_model_dir(new_model(tokenizer, hidden_size=48, layers=2, heads=4, kv_heads=2, seed=1),
                          tokenizer, tmp_path_factory.mktemp("other_model"))


def test_loads_a_local_model_in_float32_on_cpu(tiny_model_dir):
    model, tokenizer = load_model(str(tiny_model_dir), device="cpu")
    assert next(model.parameters()).dtype == torch.float32
    assert not model.training
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None
    assert tokenizer.eos_token == "<|im_end|>"
    assert load_config(str(tiny_model_dir)).hidden_size == model.config.hidden_size


def test_precision_follows_the_device():
    assert default_dtype(torch.device("cuda")) == torch.bfloat16
    assert default_dtype(torch.device("cpu")) == torch.float32


def test_missing_path_and_non_model_dirs(tmp_path):
    with pytest.raises(BfspoError, match="no such model directory"):
        load_model(str(tmp_path / "nowhere" / "model"))
    with pytest.raises(BfspoError, match="no such model directory"):
        load_model("./not-here")
    with pytest.raises(BfspoError, match="not a model directory"):
        load_model(str(tmp_path))
    (tmp_path / "weights.bin").write_text("x")
    with pytest.raises(BfspoError, match="not a model directory"):
        load_tokenizer(str(tmp_path / "weights.bin"))


def test_uncached_hub_id_while_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BfspoError, match="not in the Hugging Face cache.*HF_HUB_OFFLINE=1"):
        load_model("bfspo-tests/no-such-model")


def test_adapter_is_applied_and_frozen(tiny_model_dir, adapter_dir):
    base, tokenizer = load_model(str(tiny_model_dir))
    model, _ = load_model(str(tiny_model_dir), str(adapter_dir))
    assert isinstance(model, PeftModel) and not model.training
    assert not any(p.requires_grad for p in model.parameters())
    ids = torch.tensor([tokenizer("Tom has 3 apples.")["input_ids"]])
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, base(ids).logits)
    trainable, _ = load_model(str(tiny_model_dir), str(adapter_dir), trainable=True)
    names = [n for n, p in trainable.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)


def test_same_base_through_a_relative_path(tiny_model_dir, adapter_dir, monkeypatch):
    monkeypatch.chdir(tiny_model_dir.parent)
    model, _ = load_model(f"./{tiny_model_dir.name}", str(adapter_dir))
    assert isinstance(model, PeftModel)


def test_adapter_of_another_base_model(tiny_model_dir, other_model_dir, tmp_path):
    other_adapter = make_adapter(other_model_dir, tmp_path / "other_adapter")
    with pytest.raises(BfspoError, match="trained on base model .*other_model"):
        load_model(str(tiny_model_dir), str(other_adapter))
    # Even when its recorded base is edited to match, the shapes give it away.
    config_path = other_adapter / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = str(tiny_model_dir)
    config_path.write_text(json.dumps(config))
    assert check_adapter(str(other_adapter), str(tiny_model_dir))["r"] == 4
    with pytest.raises(BfspoError, match="does not fit model"):
        load_model(str(tiny_model_dir), str(other_adapter))


def test_bad_adapter_dirs(tiny_model_dir, tmp_path):
    with pytest.raises(BfspoError, match="no such adapter directory"):
        load_model(str(tiny_model_dir), str(tmp_path / "missing"))
    with pytest.raises(BfspoError, match="no adapter_config.json"):
        load_model(str(tiny_model_dir), str(tmp_path))
    (tmp_path / "adapter_config.json").write_text("{not json")
    with pytest.raises(BfspoError, match="not valid JSON"):
        load_model(str(tiny_model_dir), str(tmp_path))


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    import shutil

    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def test_a_folder_whose_tokenizer_encodes_nothing_is_refused(model_copy):
    (model_copy / "tokenizer.json").unlink()  # transformers then builds a 3-token tokenizer
    with pytest.raises(BfspoError, match="encodes the text 'The answer is 42.' to no tokens"):
        load_tokenizer(str(model_copy))


def test_a_folder_without_weights_says_so(model_copy):
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(BfspoError, match="could not load the model folder .*no file named model.safetensors"):
        load_model(str(model_copy))


def test_truncated_weights_are_named(model_copy):
    weights = model_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(BfspoError, match="model.safetensors: damaged or truncated"):
        load_model(str(model_copy))


# ---- issue 46, finding 11: a damaged size in config.json is named before anything is allocated -------


def test_a_huge_vocab_size_is_named_not_an_allocation_traceback(tiny_model_dir, tmp_path, capsys):
    """`vocab_size: 10**12` in config.json gave a memory-allocation traceback from `bfspo evaluate`."""
    import shutil

    from bfspo.cli import main

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"vocab_size": 10**12}))
    with pytest.raises(BfspoError, match=r"\[1000000000000, 32\] in the model its config.json describes with "
                                         r"vocab_size 1000000000000"):
        load_model(str(model), device="cpu")
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"id": "1", "question": "Tom has 2 apples and buys 3 more. How many?", "answer": "5"}))
    assert main(["evaluate", "--model", str(model), "--benchmark", "gsm8k", "--data", str(data), "--out-dir",
                 str(tmp_path / "eval"), "--budget", "4"]) == 2
    assert "with vocab_size 1000000000000" in capsys.readouterr().err


def test_a_model_too_large_for_the_memory_is_named():
    """A config whose weights agree with it, but too large to allocate: torch's allocation error, named;
    another RuntimeError is not mistaken for it."""
    from bfspo.model_io import _from_pretrained

    class Loader:
        @staticmethod
        def from_pretrained(message, **kw):
            raise RuntimeError(message)

    with pytest.raises(BfspoError, match="not enough memory for the model its config.json describes .*you tried to "
                                         "allocate 128000000000000 bytes"):
        _from_pretrained(Loader, "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                                 "you tried to allocate 128000000000000 bytes. Error code 12")
    with pytest.raises(RuntimeError, match="expected scalar type Float"):
        _from_pretrained(Loader, "expected scalar type Float but found BFloat16")


SAVE_IN_A_PROCESS = """
import sys
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
from bfspo.model_io import save_adapter
base = AutoModelForCausalLM.from_pretrained(sys.argv[1])
torch.manual_seed(0)  # the same LoRA weights in every process
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
save_adapter(get_peft_model(base, LoraConfig(r=4, target_modules=targets)), sys.argv[2])
"""


def test_an_adapters_files_are_the_same_bytes_in_every_process(tiny_model_dir, tmp_path):
    """peft writes target_modules in a set's order, which follows the process's string hashing
    (PYTHONHASHSEED); save_adapter writes them sorted, so that the same weights give the same
    adapter fingerprint (done.json's adapter_sha256) in every process."""
    from bfspo import fingerprint

    digests = set()
    for seed in ("1", "2", "3"):
        out = tmp_path / f"hashseed{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-c", SAVE_IN_A_PROCESS, str(tiny_model_dir), str(out)], env=env, check=True)
        digests.add(fingerprint.digest(fingerprint.folder_files(out, "adapter")))
        config = json.loads((out / "adapter_config.json").read_text())
        assert config["target_modules"] == sorted(config["target_modules"])
    assert len(digests) == 1
