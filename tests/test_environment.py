"""environment.yml (conda, GPU clusters) and pyproject.toml (pip) pin the same versions."""

import re
import tomllib
from pathlib import Path

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
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_pins = pins(conda_pip)
    assert conda_pins, "environment.yml pins nothing"
    for name, version in conda_pins.items():
        assert pip_pins.get(name) == version, f"{name}: environment.yml {version}, pyproject {pip_pins.get(name)}"
    assert set(pins(project["dependencies"])) <= set(conda_pins), "a pyproject dependency is missing in environment.yml"
