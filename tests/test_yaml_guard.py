"""Issue 46: every YAML that bfspo reads goes through one reader (bfspo.io.read_yaml / parse_yaml),
which refuses a YAML bomb (aliases of aliases), a self-containing alias, deep nesting, non-UTF-8
text and an oversized file with an error naming the file, before anything walks what it loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bfspo.errors import BfspoError
from bfspo.io import MAX_YAML_BYTES, parse_yaml, read_yaml
from tests.helpers import process

ROOT = Path(__file__).resolve().parents[1]


def bomb(levels: int = 9, width: int = 9) -> str:
    """About 1 KB of YAML whose aliases of aliases expand to width ** levels values."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, named", [
    (bomb(), "more than 100,000 values once its YAML aliases are expanded"),
    ("a: &a [1, *a]", "a YAML alias refers to a value that contains it"),
    ("[" * 300 + "]" * 300, "YAML nested more than 100 levels deep"),
    ("[" * 200_000 + "]" * 200_000, "YAML nested too deeply to parse"),
    (b"lr: 1\xff", "not UTF-8 text (byte 6)"),
    ("a: [1", "not valid YAML"),
], ids=["bomb", "self-alias", "deep", "deeper", "not-utf8", "invalid"])
def test_the_yaml_reader_refuses_what_would_blow_up_naming_the_source(text, named):
    with pytest.raises(BfspoError, match=r"^c\.yaml: " + named.replace("(", r"\(").replace(")", r"\)")):
        parse_yaml(text, "c.yaml")


def test_the_yaml_reader_reads_the_projects_own_files_and_refuses_a_large_one(tmp_path):
    paper = read_yaml(ROOT / "config" / "paper.yaml")  # its methods share a batch through an alias
    assert paper["methods"]["bfspo"]["train"] == paper["methods"]["bfspo-k1"]["train"]
    assert read_yaml(ROOT / "slurm" / "config.yaml") and read_yaml(ROOT / "workflow/schemas/config.schema.yaml")
    big = tmp_path / "big.yaml"
    big.write_text("x: " + "1" * MAX_YAML_BYTES)
    with pytest.raises(BfspoError, match="big.yaml: larger than 1 MiB"):
        read_yaml(big)


def _run(args, timeout=90):
    try:
        return process.run(args, cwd=ROOT, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(map(str, args[:4]))} grew on a YAML bomb instead of refusing it")


@pytest.fixture
def bomb_config(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text((ROOT / "config" / "config.yaml").read_text() + bomb())
    return path


def test_plan_and_a_dry_run_refuse_a_yaml_bomb_naming_the_file(bomb_config):
    """Before: `bfspo plan` and `snakemake -n` grew to 2.4-2.7 GB in 60 s. Snakemake loads the file
    itself (aliases as shared references, at once); the Snakefile reads it through bfspo's reader
    before the schema validation walks it."""
    plan = _run([sys.executable, "-m", "bfspo.cli", "plan", "--config", str(bomb_config)])
    assert plan.returncode != 0 and f"{bomb_config}: more than 100,000 values" in plan.stderr
    dry = _run([sys.executable, "-m", "snakemake", "-n", "--nolock", "--configfile", str(bomb_config)])
    assert dry.returncode != 0 and f"invalid config: {bomb_config}: more than 100,000 values" in dry.stderr
    value = "[" + ", ".join(f"&b{i} [" + ", ".join([f"*b{i - 1}" if i else "1"] * 10) + "]" for i in range(6)) + "]"
    merged = _run([sys.executable, "-m", "snakemake", "-n", "--nolock", "--config", f"bomb={value}"])
    assert merged.returncode != 0 and "the config (--configfile and --config merged): more than" in merged.stderr


def test_train_refuses_a_yaml_bomb_in_a_config_or_a_set_value(tmp_path, bomb_config):
    from bfspo.training.config import load_train_config

    with pytest.raises(BfspoError, match="bomb.yaml: more than 100,000 values"):
        load_train_config(str(bomb_config), [])
    with pytest.raises(BfspoError, match="override 'lr=.*': the value: a YAML alias refers to a value that contains it"):
        load_train_config(None, ["lr=&a [*a]"])
