"""The device a `bfspo train` or `bfspo evaluate` job runs on, and a fast failure where it is not there.

`device: auto` takes CUDA when torch can use it, else the CPU; where an NVIDIA GPU is visible
(its device file, /dev/nvidia0, and CUDA_VISIBLE_DEVICES not hiding it) but torch cannot use it, it
says so in one line with torch's reason, once per process, so that a hand-run job on a node with a
broken driver does not train on the CPU without a word. `device: cuda` (what the workflow's GPU
size classes pass) refuses to start without a usable CUDA device: a GPU job on a node whose driver
is older than torch's CUDA build, or with no GPU visible, would otherwise fall back to the CPU in
silence (float32, gloo) and run until its time limit. The error names what decides it: torch's
CUDA build, the driver's version where it can be read, and CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

from bfspo.errors import BfspoError

DEVICES = ("auto", "cuda", "cpu")
NVIDIA_SMI_TIMEOUT_S = 10
DEVICE_FILES = Path("/dev")  # where the NVIDIA driver's device files are (nvidia0, nvidia1, ...)
_auto_line: list[str] = []  # the `device: auto` line, once said in this process (torch warns only once)


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


def visible_gpus() -> list[str]:
    """The NVIDIA GPUs' device files (/dev/nvidia0, ...), none if CUDA_VISIBLE_DEVICES hides them all
    (empty, or starting with -1)."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and (not hidden.strip() or hidden.strip().startswith("-")):
        return []
    return sorted(str(p) for p in DEVICE_FILES.glob("nvidia*") if p.name[6:].isdigit())


def torch_reasons(torch_warnings: list[str]) -> str:
    """The first line of each of torch's warnings, joined."""
    return "; ".join(w.strip().splitlines()[0] for w in torch_warnings if w.strip())


def auto_on_cpu(torch_warnings: list[str]) -> str | None:
    """The line `device: auto` says when it takes the CPU while a GPU is visible (None: none visible)."""
    import torch

    gpus = visible_gpus()
    if not gpus:
        return None
    reason = (f"torch {torch.__version__} is built without CUDA" if torch.version.cuda is None else
              torch_reasons(torch_warnings) or f"torch {torch.__version__} (CUDA {torch.version.cuda}) gave no reason")
    return (f"device: auto runs on the CPU, though {len(gpus)} NVIDIA GPU(s) are visible ({', '.join(gpus)}): "
            f"torch cannot use CUDA ({reason}); set `device: cuda` to stop instead")


def cuda_unavailable(torch_warnings: list[str]) -> str:
    """Why CUDA was asked for and cannot be used, with what decides it."""
    import torch

    build = torch.version.cuda
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    reasons = torch_reasons(torch_warnings)
    return (f"device=cuda, but torch sees no usable CUDA device: torch {torch.__version__} is built "
            f"{'without CUDA' if build is None else f'for CUDA {build}'}, NVIDIA driver "
            f"{driver_version(torch_warnings)}, CUDA_VISIBLE_DEVICES={visible!r}"
            + (f" (torch: {reasons})" if reasons else "")
            + (". Install torch's CUDA build (environment.yml)" if build is None else
               f". A CUDA {build} build needs a driver that supports CUDA {build} (CUDA 13: 580 or newer)")
            + "; `device: auto` would run on the CPU instead")


def resolve_device(name: str):
    """torch.device of a DEVICES value: `auto` picks CUDA when usable (else the CPU, with `auto_on_cpu`'s
    line on stderr, once per process, where a GPU is visible), `cuda` without a usable CUDA device is
    a BfspoError (`cuda_unavailable`), `cpu` is the CPU."""
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
    reasons = [str(w.message) for w in caught]
    if name == "cuda":
        raise BfspoError(cuda_unavailable(reasons))
    said = None if _auto_line else auto_on_cpu(reasons)
    if said is not None:
        _auto_line.append(said)
        print(said, file=sys.stderr, flush=True)
    return torch.device("cpu")
