"""`device: cuda` without a usable CUDA device stops a job within seconds, naming torch's CUDA build,
the driver and CUDA_VISIBLE_DEVICES (bfspo/device.py), for `bfspo train` and `bfspo evaluate`."""

import json
import os
import sys
import time

import pytest
import torch

from bfspo import device as dev
from bfspo.errors import BfspoError
from tests.helpers import process

ENV = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "CUDA_VISIBLE_DEVICES": "3"}
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")

TOO_OLD = ("CUDA initialization: The NVIDIA driver on your system is too old (found version 12040). Please update "
           "your GPU driver by downloading and installing a new version from the URL: http://www.nvidia.com/...")


def test_the_message_names_the_build_the_driver_and_the_visible_devices(monkeypatch):
    monkeypatch.setattr(dev.shutil, "which", lambda name: None)  # no nvidia-smi: the driver from torch's warning
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    message = dev.cuda_unavailable([TOO_OLD])
    assert f"torch {torch.__version__} is built " in message
    assert (f"for CUDA {torch.version.cuda}" if torch.version.cuda else "without CUDA") in message
    assert "NVIDIA driver 12040" in message and "CUDA_VISIBLE_DEVICES='0,1'" in message
    assert "driver on your system is too old (found version 12040)" in message  # torch's reason, first line
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert "NVIDIA driver None, CUDA_VISIBLE_DEVICES=None" in dev.cuda_unavailable([])


def test_nvidia_smi_gives_the_driver_when_it_answers(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 550.54.15\necho 550.54.15\n")
    smi.chmod(0o755)
    monkeypatch.setattr(dev.shutil, "which", lambda name: str(smi))
    assert dev.driver_version([TOO_OLD]) == "550.54.15"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert dev.driver_version([TOO_OLD]) == "12040"
    assert dev.driver_version([]) is None


@no_cuda
def test_resolve_device():
    assert dev.resolve_device("cpu").type == dev.resolve_device("auto").type == "cpu"
    with pytest.raises(BfspoError, match="device=cuda, but torch sees no usable CUDA device"):
        dev.resolve_device("cuda")
    with pytest.raises(BfspoError, match="device must be one of"):
        dev.resolve_device("gpu")


def run_cli(*args):
    start = time.monotonic()
    proc = process.run([sys.executable, "-m", "bfspo.cli", *args], env=ENV, capture_output=True, text=True,
                       timeout=120)
    return proc, time.monotonic() - start


def assert_named_cuda_failure(proc, seconds):
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "device=cuda, but torch sees no usable CUDA device" in proc.stderr
    assert f"torch {torch.__version__}" in proc.stderr and "NVIDIA driver" in proc.stderr
    assert "CUDA_VISIBLE_DEVICES='3'" in proc.stderr
    assert seconds < 30  # an interpreter and torch's import: seconds, not a job's time limit


@no_cuda
def test_train_with_device_cuda_stops_within_seconds(tiny_model_dir, train_data, tmp_path):
    out = tmp_path / "run"
    proc, seconds = run_cli("train", "--output-dir", str(out), "--set", f"model={tiny_model_dir}",
                            f"train_data={train_data}", "device=cuda")
    assert_named_cuda_failure(proc, seconds)
    assert not out.exists()  # nothing written: no config.json to refuse the corrected command


@no_cuda
def test_evaluate_with_device_cuda_stops_within_seconds(tiny_model_dir, tmp_path):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"id": "q1", "question": "1 + 1?", "answer": "2"}) + "\n")
    out = tmp_path / "eval"
    proc, seconds = run_cli("evaluate", "--model", str(tiny_model_dir), "--benchmark", "gsm8k", "--data", str(data),
                            "--out-dir", str(out), "--device", "cuda")
    assert_named_cuda_failure(proc, seconds)
    assert not out.exists()


def unusable_cuda(monkeypatch, tmp_path, files=("nvidia0", "nvidia1", "nvidiactl")):
    """A machine whose GPUs are visible (their device files) and whose driver torch finds too old."""
    for name in files:
        (tmp_path / name).touch()
    monkeypatch.setattr(dev, "DEVICE_FILES", tmp_path)
    monkeypatch.setattr(dev, "_auto_line", [])  # a fresh process: nothing said yet

    def too_old():
        import warnings

        warnings.warn(TOO_OLD)
        return False

    monkeypatch.setattr(torch.cuda, "is_available", too_old)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_auto_says_once_why_it_runs_on_the_cpu_beside_a_visible_gpu(monkeypatch, tmp_path, capsys):
    """Issue 38: `device: auto` on a node whose GPU torch cannot use prints one line with torch's
    reason (once per process), instead of training on the CPU without a word."""
    unusable_cuda(monkeypatch, tmp_path)
    assert dev.resolve_device("auto").type == dev.resolve_device("auto").type == "cpu"
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("device: auto runs on the CPU, though 2 NVIDIA GPU(s) are visible")
    assert f"{tmp_path}/nvidia0, {tmp_path}/nvidia1" in lines[0]
    assert "driver on your system is too old (found version 12040)" in lines[0]  # torch's reason


@pytest.mark.parametrize("case", ["no device files", "hidden", "torch without CUDA"])
def test_auto_is_silent_without_a_visible_gpu_and_names_a_cpu_build(monkeypatch, tmp_path, capsys, case):
    unusable_cuda(monkeypatch, tmp_path, files=() if case == "no device files" else ("nvidia0",))
    if case == "hidden":
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    if case == "torch without CUDA":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(torch.version, "cuda", None)
    assert dev.resolve_device("auto").type == "cpu"
    err = capsys.readouterr().err
    if case == "torch without CUDA":
        assert "1 NVIDIA GPU(s) are visible" in err and f"torch {torch.__version__} is built without CUDA" in err
    else:
        assert err == ""


def test_tensor_parallel_is_refused_with_more_than_one_rank(tiny_model_dir, train_data, tmp_path, monkeypatch):
    """Issue 38: a hand-run torchrun whose ranks would each start a vLLM engine over
    tensor_parallel_size GPUs stops before anything is written (the workflow refuses it too)."""
    from bfspo.training import dist

    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.refuse_tensor_parallel(2)  # one rank: its engine takes the GPUs
    monkeypatch.setenv("WORLD_SIZE", "2")
    dist.refuse_tensor_parallel(1)
    with pytest.raises(BfspoError, match="tensor_parallel_size=2 with 2 ranks: each rank runs its own vLLM engine"):
        dist.refuse_tensor_parallel(2)
    out = tmp_path / "run"
    proc = process.run([sys.executable, "-m", "bfspo.cli", "train", "--output-dir", str(out), "--set",
                        f"model={tiny_model_dir}", f"train_data={train_data}", "tensor_parallel_size=2", "device=cpu"],
                       env={**ENV, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, capture_output=True,
                       text=True, timeout=120)
    assert proc.returncode == 2 and "tensor_parallel_size=2 with 2 ranks" in proc.stderr, proc.stderr[-2000:]
    assert not out.exists()
