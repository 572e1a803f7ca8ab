"""bfspo.fingerprint: what a run was trained on and what an evaluation scored, by content."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from bfspo import fingerprint
from bfspo.errors import BfspoError


def test_a_file_is_its_bytes(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"id": "1"}\n')
    assert fingerprint.file_sha256(path) == hashlib.sha256(b'{"id": "1"}\n').hexdigest()
    before = fingerprint.data_files(path)
    stat = path.stat()
    path.write_bytes(b'{"id": "2"}\n')  # same size; the modification time put back: only the bytes tell
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert fingerprint.data_files(path) != before
    assert fingerprint.changed({"train_data": before}, {"train_data": fingerprint.data_files(path)}) == \
        ["train_data (train.jsonl)"]
    with pytest.raises(BfspoError, match="no such file"):
        fingerprint.file_sha256(tmp_path / "missing.jsonl")


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


def test_a_hub_id_is_read_from_the_cache_without_hashing_its_weights(tmp_path, monkeypatch):
    """The Hugging Face cache links a snapshot's files to blobs named by their SHA-256 (LFS files): the
    name is the fingerprint. A blob deliberately named by another hash shows the file is not read."""
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--org--tiny"
    commit = "a" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "blobs").mkdir()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    named = "b" * 64
    (repo / "blobs" / named).write_bytes(b"weights")
    (snapshot / "model.safetensors").symlink_to(f"../../blobs/{named}")
    config_blob = "c" * 40  # a small file's blob is named by git's SHA-1: read and hashed
    (repo / "blobs" / config_blob).write_text("{}")
    (snapshot / "config.json").symlink_to(f"../../blobs/{config_blob}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    inputs = fingerprint.model_inputs("org/tiny")
    assert inputs["model"] == {"config.json": hashlib.sha256(b"{}").hexdigest(), "model.safetensors": named}
    with pytest.raises(BfspoError, match="org/absent: neither a local folder nor reachable"):
        fingerprint.model_inputs("org/absent")
    with pytest.raises(BfspoError, match="no such model directory"):
        fingerprint.model_inputs(str(tmp_path / "nowhere"))


def test_the_toy_models_fingerprint_costs_milliseconds(tiny_model_dir):
    start = time.perf_counter()
    fingerprint.model_inputs(str(tiny_model_dir))
    assert time.perf_counter() - start < 1.0
