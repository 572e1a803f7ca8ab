"""bfspo.fingerprint: what a run was trained on and what an evaluation scored, by content."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time

import pytest

from bfspo import fingerprint
from bfspo.errors import BfspoError


def test_a_file_is_its_bytes(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"id": "1"}\n')
    assert fingerprint.file_sha256(path) == hashlib.sha256(b'{"id": "1"}\n').hexdigest()
    data, before = fingerprint.read_data(path)
    assert data == b'{"id": "1"}\n' and before == {"train.jsonl": fingerprint.file_sha256(path)}
    stat = path.stat()
    path.write_bytes(b'{"id": "2"}\n')  # same size; the modification time put back: only the bytes tell
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert fingerprint.read_data(path)[1] != before
    assert fingerprint.changed({"train_data": before}, {"train_data": fingerprint.read_data(path)[1]}) == \
        ["train_data (train.jsonl)"]
    with pytest.raises(BfspoError, match="no such file"):
        fingerprint.file_sha256(tmp_path / "missing.jsonl")
    with pytest.raises(BfspoError, match="no such file"):
        fingerprint.read_data(tmp_path / "missing.jsonl")


def test_a_file_written_after_its_stamp_is_named_even_with_its_times_put_back(tiny_model_dir, tmp_path):
    """The check between a model's fingerprint and the end of its load: a rewrite in place (same size,
    modification time put back) moves the change time, and a replacement the inode."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    stamps = {}
    fingerprint.model_inputs(str(model), stamps)
    assert str(model / "model.safetensors") in stamps and str(model / "tokenizer.json") in stamps
    fingerprint.check_unchanged(stamps, "loading the model")  # reading is no change
    weights = model / "model.safetensors"
    stat = weights.stat()
    time.sleep(0.01)
    weights.write_bytes(weights.read_bytes())
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(BfspoError, match=re.escape(f"{weights}: replaced or written to between its fingerprint and "
                                                   "the end of loading the model")):
        fingerprint.check_unchanged(stamps, "loading the model")
    stamps = {}
    fingerprint.model_inputs(str(model), stamps)
    (tmp_path / "other.json").write_bytes((model / "tokenizer.json").read_bytes())
    os.replace(tmp_path / "other.json", model / "tokenizer.json")  # the same bytes, another file
    with pytest.raises(BfspoError, match=re.escape(f"{model / 'tokenizer.json'}: replaced or written to")):
        fingerprint.check_unchanged(stamps, "loading the model")


def test_a_model_folder_splits_into_network_and_tokenizer(tiny_model_dir, tmp_path):
    inputs = fingerprint.model_inputs(str(tiny_model_dir))
    assert "config.json" in inputs["model"] and "model.safetensors" in inputs["model"]
    assert "tokenizer.json" in inputs["tokenizer"] and not set(inputs["model"]) & set(inputs["tokenizer"])
    for name, sha in inputs["model"].items():
        assert sha == hashlib.sha256((tiny_model_dir / name).read_bytes()).hexdigest()
    assert fingerprint.digest(inputs["model"]) == fingerprint.digest(dict(reversed(inputs["model"].items())))
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in tiny_model_dir.iterdir():
        if p.is_file():
            (copy / p.name).write_bytes(p.read_bytes())
    (copy / "README.md").write_text("notes")  # not part of what is loaded
    assert fingerprint.model_inputs(str(copy)) == inputs
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(weights))
    assert fingerprint.changed(inputs, fingerprint.model_inputs(str(copy))) == ["model (model.safetensors)"]


def test_the_changes_name_an_unrecorded_input():
    assert fingerprint.changed({}, {"model": {"a": "1"}}) == ["model (not recorded)"]
    assert fingerprint.changed({"model": {"a": "1"}}, {"model": {"a": "1"}}) == []


def test_a_data_file_is_its_bytes_under_any_name():
    """Issue 39, finding 9: one file is compared by content; a folder's file names are part of it."""
    assert fingerprint.changed({"train_data": {"a.jsonl": "1"}}, {"train_data": {"b.jsonl": "1"}}) == []
    assert fingerprint.changed({"train_data": {"a.jsonl": "1"}}, {"train_data": {"b.jsonl": "2"}}) == \
        ["train_data (a.jsonl, b.jsonl)"]
    assert fingerprint.changed({"model": {"a": "1", "b": "2"}}, {"model": {"a": "1", "c": "2"}}) == ["model (b, c)"]


def _hub_cache(tmp_path, weights: bytes):
    """A Hugging Face cache holding org/tiny: its weights a link to a blob named by their SHA-256, its
    config.json a link to a blob named by git's SHA-1 (a small file: read and hashed)."""
    repo = tmp_path / "hub" / "models--org--tiny"
    commit = "a" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "blobs").mkdir()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    named = hashlib.sha256(weights).hexdigest()
    (repo / "blobs" / named).write_bytes(weights)
    (snapshot / "model.safetensors").symlink_to(f"../../blobs/{named}")
    config_blob = "c" * 40
    (repo / "blobs" / config_blob).write_text("{}")
    (snapshot / "config.json").symlink_to(f"../../blobs/{config_blob}")
    return snapshot


def test_a_hub_id_is_read_from_the_cache_hashing_its_weights_once(tmp_path, monkeypatch):
    """The Hugging Face cache links a snapshot's files to blobs named by their SHA-256 (LFS files): the
    name is the fingerprint once the bytes were checked against it; later uses do not read them."""
    from huggingface_hub import constants

    snapshot = _hub_cache(tmp_path, b"weights")
    named = hashlib.sha256(b"weights").hexdigest()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("BFSPO_CACHE", str(tmp_path / "bfspo-cache"))
    inputs = fingerprint.model_inputs("org/tiny")
    assert inputs["model"] == {"config.json": hashlib.sha256(b"{}").hexdigest(), "model.safetensors": named}
    read = []
    hash_bytes = fingerprint._sha256_of_bytes
    monkeypatch.setattr(fingerprint, "_sha256_of_bytes", lambda path: read.append(path.name) or hash_bytes(path))
    assert fingerprint.model_inputs("org/tiny") == inputs and read == ["config.json"]  # the blob is not read again
    assert fingerprint.model_inputs(str(snapshot)) == inputs  # its snapshot given as a folder: the same model
    with pytest.raises(BfspoError, match="org/absent: neither a local folder nor reachable"):
        fingerprint.model_inputs("org/absent")
    with pytest.raises(BfspoError, match="no such model directory"):
        fingerprint.model_inputs(str(tmp_path / "nowhere"))


# ---- issue 46, finding 1: a name that looks like a hub blob is not trusted without its bytes --------


def test_a_rewrite_through_a_hub_cache_link_is_named(tmp_path, monkeypatch):
    """Other weights written through a snapshot's link: the stamp moved, the bytes are hashed again, and
    are not what the blob's name says: refused, naming the link."""
    from huggingface_hub import constants

    snapshot = _hub_cache(tmp_path, b"weights")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("BFSPO_CACHE", str(tmp_path / "bfspo-cache"))
    fingerprint.model_inputs("org/tiny")
    (snapshot / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(BfspoError, match=re.escape(f"{snapshot / 'model.safetensors'}: links to the Hugging Face "
                                                   "cache blob")):
        fingerprint.model_inputs("org/tiny")


def test_a_blob_named_link_outside_a_hub_cache_is_hashed(tmp_path, monkeypatch):
    """The probe's folder: model.safetensors -> ../blobs/<sha256>, in no hub cache. Its name proves
    nothing: the bytes are hashed, and other bytes written through the link are another model."""
    monkeypatch.setenv("BFSPO_CACHE", str(tmp_path / "bfspo-cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "blobs").mkdir()
    named = hashlib.sha256(b"weights").hexdigest()
    (tmp_path / "blobs" / named).write_bytes(b"weights")
    (model / "model.safetensors").symlink_to(f"../blobs/{named}")
    before = fingerprint.model_inputs(str(model))
    assert before["model"]["model.safetensors"] == named
    (model / "model.safetensors").write_bytes(b"other weights")
    after = fingerprint.model_inputs(str(model))
    assert after["model"]["model.safetensors"] == hashlib.sha256(b"other weights").hexdigest()
    assert fingerprint.changed(before, after) == ["model (model.safetensors)"]


def test_the_toy_models_fingerprint_costs_milliseconds(tiny_model_dir):
    start = time.perf_counter()
    fingerprint.model_inputs(str(tiny_model_dir))
    assert time.perf_counter() - start < 1.0


# ---- issue 39, finding 2: what is hashed is what is trained on and scored ----------------------------


def _rows(prefix: str) -> str:
    return "".join(json.dumps({"id": f"{prefix}{i}", "question": f"Tom has {i} apples and buys 3 more. How many?",
                               "answer": str(i + 3)}) + "\n" for i in range(12))


def _train(model, data, out, **overrides) -> int:
    """One step of `bfspo train`; `filter: none` keeps every group, so that the step trains whatever the
    tiny model's samples (at a seed where all its groups are all wrong, dynamic sampling would keep none)."""
    from bfspo.cli import main

    values = dict(model=model, train_data=data, benchmark="gsm8k_train", k=0, group_size=4, budget=10, steps=1,
                  filter="none",
                  train_batch=8, mini_batch=8, lr=1e-2, log_trees=-1, max_empty_steps=50, threads=1,
                  wandb_mode="disabled") | overrides
    return main(["train", "--output-dir", str(out), "--set", *[f"{k}={v}" for k, v in values.items()]])


def _while_the_model_loads(monkeypatch, module, name, action):
    """Run `action` when `module.name` (a loader) is called, before it loads: the probe's window between
    the fingerprint and the load. Returns the list of calls made, so that a test can assert the window
    was reached (a caller that bound the loader at import would bypass the patch)."""
    load, calls = getattr(module, name), []

    def acting(*args, **kwargs):
        calls.append(args)
        action()
        return load(*args, **kwargs)

    monkeypatch.setattr(module, name, acting)
    return calls


def test_a_data_file_replaced_after_its_hash_is_not_what_the_run_trains_on(tiny_model_dir, tmp_path, monkeypatch):
    """The probe replaced the data file while the model loaded: inputs.json recorded the original bytes,
    the adapter was trained on the replacing file, and a rerun said "already finished"."""
    from bfspo import model_io
    from bfspo.io import read_jsonl

    data = tmp_path / "train.jsonl"
    data.write_text(_rows("old-"))
    original = hashlib.sha256(data.read_bytes()).hexdigest()
    loads = _while_the_model_loads(monkeypatch, model_io, "load_model", lambda: data.write_text(_rows("new-")))
    out = tmp_path / "run"
    assert _train(tiny_model_dir, data, out) == 0
    assert loads, "the trainer did not load through bfspo.model_io.load_model"
    assert json.loads((out / "inputs.json").read_text())["train_data"] == {"train.jsonl": original}
    trained = {tree["meta"]["question_id"] for path in (out / "trees").iterdir() for _, tree in read_jsonl(path)}
    assert trained and all(q.startswith("old-") for q in trained), trained


def test_a_model_file_replaced_between_its_hash_and_its_load_is_refused(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from bfspo import model_io

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    data = tmp_path / "train.jsonl"
    data.write_text(_rows("q"))
    weights = model / "model.safetensors"

    def replace_weights():
        changed = bytearray(weights.read_bytes())
        changed[-1] ^= 1  # the last byte of the last tensor: loads as well as before
        (tmp_path / "new.safetensors").write_bytes(bytes(changed))
        os.replace(tmp_path / "new.safetensors", weights)

    loads = _while_the_model_loads(monkeypatch, model_io, "load_model", replace_weights)
    out = tmp_path / "run"
    assert _train(model, data, out) == 2
    assert loads
    assert (f"{weights}: replaced or written to between its fingerprint and the end of loading the model"
            in capsys.readouterr().err)
    assert not (out / "inputs.json").exists() and not (out / "config.json").exists()  # nothing recorded
    monkeypatch.undo()
    assert _train(model, data, out) == 0  # the next start fingerprints and trains the new bytes
    assert json.loads((out / "inputs.json").read_text())["model"] == fingerprint.model_inputs(str(model))["model"]


def test_evaluation_scores_the_data_bytes_it_records_and_refuses_a_model_changed_meanwhile(tiny_model_dir, tmp_path,
                                                                                           monkeypatch, capsys):
    from bfspo.cli import main
    from bfspo.evaluation import evaluate as ev
    from bfspo.io import read_json, read_jsonl

    data = tmp_path / "gsm8k.jsonl"
    data.write_text(_rows("old-"))
    original = fingerprint.digest({"gsm8k.jsonl": hashlib.sha256(data.read_bytes()).hexdigest()})
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)

    def evaluate(out) -> int:
        return main(["evaluate", "--model", str(model), "--benchmark", "gsm8k", "--data", str(data), "--out-dir",
                     str(out), "--budget", "4", "--limit", "3"])

    loads = _while_the_model_loads(monkeypatch, ev, "load_config", lambda: data.write_text(_rows("new-")))
    assert evaluate(tmp_path / "eval") == 0
    assert loads
    assert read_json(tmp_path / "eval" / "summary.json")["settings"]["fingerprints"]["data"] == original
    assert {s["id"] for _, s in read_jsonl(tmp_path / "eval" / "samples.jsonl")} == {"old-0", "old-1", "old-2"}
    monkeypatch.undo()
    def rewrite_tokenizer():  # the same bytes written in place, a clock tick (at most 10 ms) after the stamp
        time.sleep(0.02)
        (model / "tokenizer.json").write_bytes((model / "tokenizer.json").read_bytes())

    _while_the_model_loads(monkeypatch, ev, "load_config", rewrite_tokenizer)
    assert evaluate(tmp_path / "eval2") == 2
    assert f"{model / 'tokenizer.json'}: replaced or written to" in capsys.readouterr().err
    assert not (tmp_path / "eval2" / "summary.json").exists()


# ---- issue 46, findings 1, 2 and 4: every byte a model folder loads is fingerprinted, end to end ------


def _scaled_weights(path) -> bytes:
    """The safetensors file at `path` (through a link too) with every tensor doubled, as bytes."""
    from safetensors import safe_open
    from safetensors.torch import save

    with safe_open(str(path), "pt") as f:
        tensors, metadata = {k: f.get_tensor(k) * 2 for k in f.keys()}, f.metadata()
    return save(tensors, metadata)


def _blob_link(model):
    """The probe's layout: the weights a link ../blobs/<sha256>, in no hub cache; other weights are then
    written through the link."""
    weights = model / "model.safetensors"
    blobs = model.parent / "blobs"
    blobs.mkdir()
    blob = blobs / hashlib.sha256(weights.read_bytes()).hexdigest()
    os.replace(weights, blob)
    weights.symlink_to(f"../blobs/{blob.name}")
    return lambda: weights.write_bytes(_scaled_weights(weights))


def _embedded_adapter(model):
    """A peft adapter saved in the model folder, which transformers applies on load; then its lora_alpha
    multiplied by 8."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model))
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(str(model))

    def scale_alpha():
        path = model / "adapter_config.json"
        config = json.loads(path.read_text())
        path.write_text(json.dumps(config | {"lora_alpha": config["lora_alpha"] * 8}))

    return scale_alpha


def _subfolder_shard(model):
    """The weights as one shard in a subfolder that model.safetensors.index.json names; then scaled."""
    from safetensors import safe_open

    shard = model / "sub" / "model-00001-of-00001.safetensors"
    shard.parent.mkdir()
    os.replace(model / "model.safetensors", shard)
    with safe_open(str(shard), "pt") as f:
        weight_map = {k: "sub/model-00001-of-00001.safetensors" for k in f.keys()}
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return lambda: shard.write_bytes(_scaled_weights(shard))


LAYOUTS = {"blob-named link": (_blob_link, "model.safetensors"),
           "embedded adapter": (_embedded_adapter, "adapter_config.json"),
           "subfolder shard": (_subfolder_shard, "sub/model-00001-of-00001.safetensors")}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_changed_model_file_is_a_changed_fingerprint(tiny_model_dir, tmp_path, layout, monkeypatch):
    from bfspo.model_io import load_model

    monkeypatch.setenv("BFSPO_CACHE", str(tmp_path / "bfspo-cache"))
    prepare, name = LAYOUTS[layout]
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    change = prepare(model)
    load_model(str(model), device="cpu")  # transformers loads this folder
    before = fingerprint.model_inputs(str(model))
    key = fingerprint.model_key(str(model))
    assert name in before["model"]
    change()
    assert fingerprint.changed(before, fingerprint.model_inputs(str(model))) == [f"model ({name})"]
    assert fingerprint.model_key(str(model)) != key


@pytest.mark.parametrize("layout", LAYOUTS)
def test_evaluate_and_train_run_again_on_a_model_changed_in_any_file_it_loads(tiny_model_dir, tmp_path, layout,
                                                                              monkeypatch, capsys):
    """The probe: after the change, `bfspo evaluate` said "already done with these settings" and `bfspo
    train` "already finished", though the folder loads another model."""
    from bfspo.cli import main
    from bfspo.io import read_json

    monkeypatch.setenv("BFSPO_CACHE", str(tmp_path / "bfspo-cache"))
    prepare, name = LAYOUTS[layout]
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    change = prepare(model)
    data = tmp_path / "train.jsonl"
    data.write_text(_rows("q"))

    def evaluate() -> int:
        return main(["evaluate", "--model", str(model), "--benchmark", "gsm8k", "--data", str(data), "--out-dir",
                     str(tmp_path / "eval"), "--budget", "4", "--limit", "3"])

    assert evaluate() == 0 and _train(model, data, tmp_path / "run") == 0
    first = read_json(tmp_path / "eval" / "summary.json")["settings"]["fingerprints"]["model"]
    capsys.readouterr()
    change()
    assert evaluate() == 0 and _train(model, data, tmp_path / "run") == 0
    out = capsys.readouterr()
    assert "already" not in out.out + out.err
    assert f"model ({name})" in out.out  # the trainer names what changed
    assert read_json(tmp_path / "eval" / "summary.json")["settings"]["fingerprints"]["model"] != first
    assert (tmp_path / "eval" / "previous" / "1" / "summary.json").is_file()
    assert (tmp_path / "run" / "previous" / "1" / "done.json").is_file()


# ---- issue 46, finding 3: a local model replaced in place after a finished DAG reruns its jobs -------


@pytest.mark.slow
def test_snakemake_reruns_the_jobs_of_a_local_model_replaced_in_place(tiny_model_dir, tmp_path):
    """The probe's "Nothing to be done" after other weights were written over a finished DAG's local
    model: the rules take the model's cheap key (sizes and mtimes) as a parameter, so the dry run names
    the evaluation as changed, and the rerun scores the new weights."""
    import subprocess
    import sys

    from bfspo.io import read_json
    from tests.helpers import process
    from tests.test_workflow import workflow_copy, write_config

    env = workflow_copy(tmp_path)
    model = tmp_path / "outside-model"
    shutil.copytree(tiny_model_dir, model)
    config = write_config(tmp_path, "config/test.yaml", lambda c: c["models"]["toy-test"].update(path=str(model)))
    target = "results/eval/toy-test_zero-shot/toy/summary.json"

    def snakemake(*args) -> subprocess.CompletedProcess:
        proc = process.run([sys.executable, "-m", "snakemake", target, "--cores", "1", "--configfile", str(config),
                            *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return proc

    snakemake()
    first = read_json(tmp_path / target)["settings"]["fingerprints"]["model"]
    assert "Nothing to be done" in snakemake("-n").stdout
    weights = model / "model.safetensors"
    weights.write_bytes(_scaled_weights(weights))
    dry = snakemake("-n")
    assert "rule evaluate:" in dry.stdout and "Params have changed since last execution" in dry.stdout, dry.stdout
    snakemake()
    assert read_json(tmp_path / target)["settings"]["fingerprints"]["model"] != first


def test_a_hub_repository_holding_an_adapter_is_refused(tmp_path, monkeypatch):
    """transformers loads a hub id holding adapter_config.json as the base model that the adapter names,
    from elsewhere: what the fingerprint would cover is not what is loaded."""
    from huggingface_hub import constants

    snapshot = _hub_cache(tmp_path, b"weights")
    (snapshot.parent.parent / "blobs" / ("d" * 40)).write_text('{"base_model_name_or_path": "org/other"}')
    (snapshot / "adapter_config.json").symlink_to(f"../../blobs/{'d' * 40}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("BFSPO_CACHE", str(tmp_path / "bfspo-cache"))
    with pytest.raises(BfspoError, match="org/tiny: a hub repository holding a peft adapter"):
        fingerprint.model_inputs("org/tiny")
    assert "adapter_config.json" in fingerprint.model_inputs(str(snapshot))["model"]  # a folder loads its own base


def test_a_model_key_needs_no_model_yet(tiny_model_dir, tmp_path):
    """The rules' key is computed when Snakemake plans, before a model is built or for a hub id: no key."""
    assert fingerprint.model_key("org/tiny") == fingerprint.model_key(str(tmp_path / "not-built")) == ""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    key = fingerprint.model_key(str(model))
    (model / "README.md").write_text("notes")  # not a file the fingerprint covers
    assert fingerprint.model_key(str(model)) == key
    (model / "model.safetensors.index.json").write_text("[")  # damaged: keyed, for the job to name
    assert fingerprint.model_key(str(model)) not in ("", key)
