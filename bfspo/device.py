"""The device a `bfspo train` or `bfspo evaluate` job runs on, and a fast failure where it is not there.

`device: auto` takes CUDA when torch can use it, else the CPU. `device: cuda` (what the workflow's
GPU size classes pass) refuses to start without a usable CUDA device: a GPU job on a node whose
driver is older than torch's CUDA build, or with no GPU visible, would otherwise fall back to the
CPU in silence (float32, gloo) and run until its time limit. The error names what decides it:
torch's CUDA build, the driver's version where it can be read, and CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import warnings

from bfspo.errors import BfspoError

DEVICES = ("auto", "cuda", "cpu")
NVIDIA_SMI_TIMEOUT_S = 10


def driver_version(torch_warnings: list[str]) -> str | None:
    """The NVIDIA driver's version: nvidia-smi's answer, else the version torch's CUDA initialisation
    warning quotes ('... driver on your system is too old (found version 11040)'); None if unknown."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
            versions = sorted(set(out.stdout.split()))
            if out.returncode == 0 and versions:
                return ", ".join(versions)
        except (OSError, subprocess.TimeoutExpired):
            pass
    for text in torch_warnings:
        found = re.search(r"found version (\d+)", text)
        if found:
            return found.group(1)
    return None


def cuda_unavailable(torch_warnings: list[str]) -> str:
    """Why CUDA was asked for and cannot be used, with what decides it."""
    import torch

    build = torch.version.cuda
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    reasons = "; ".join(w.strip().splitlines()[0] for w in torch_warnings if w.strip())
    return (f"device=cuda, but torch sees no usable CUDA device: torch {torch.__version__} is built "
            f"{'without CUDA' if build is None else f'for CUDA {build}'}, NVIDIA driver "
            f"{driver_version(torch_warnings)}, CUDA_VISIBLE_DEVICES={visible!r}"
            + (f" (torch: {reasons})" if reasons else "")
            + (". Install torch's CUDA build (environment.yml)" if build is None else
               f". A CUDA {build} build needs a driver that supports CUDA {build} (CUDA 13: 580 or newer)")
            + "; `device: auto` would run on the CPU instead")


def resolve_device(name: str):
    """torch.device of a DEVICES value: `auto` picks CUDA when usable, `cuda` without a usable CUDA
    device is a BfspoError (`cuda_unavailable`), `cpu` is the CPU."""
    import torch

    if name not in DEVICES:
        raise BfspoError(f"device must be one of {DEVICES}, got {name!r}")
    if name == "cpu":
        return torch.device("cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        usable = torch.cuda.is_available()
    if usable:
        return torch.device("cuda")
    if name == "cuda":
        raise BfspoError(cuda_unavailable([str(w.message) for w in caught]))
    return torch.device("cpu")
