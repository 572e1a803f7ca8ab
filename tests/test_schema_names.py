"""Issue 46: a name of the config (a method, model, train set, table or size class key) becomes part
of run ids and file names; one too long for a file name is refused by the schema, by name, in the
dry run, instead of failing inside Snakemake once the jobs run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from bfspo.pipeline.matrix import ConfigError, load_config
from tests.helpers import process

ROOT = Path(__file__).resolve().parents[1]


def renamed_method(tmp_path: Path, key: str) -> Path:
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    first = next(iter(cfg["methods"]))
    cfg["methods"][key] = cfg["methods"].pop(first)
    for table in cfg["tables"].values():
        table["methods"] = [key if m == first else m for m in table["methods"]]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_a_method_key_too_long_for_a_file_name_is_refused_by_the_dry_run(tmp_path):
    with pytest.raises(ConfigError, match=r"methods: 'm{56}\.\.\. is not valid here \(maxLength: 64\)"):
        load_config(renamed_method(tmp_path, "m" * 300))
    load_config(renamed_method(tmp_path, "m" * 64))  # the longest allowed
    proc = process.run([sys.executable, "-m", "snakemake", "-n", "--nolock", "--configfile",
                        str(renamed_method(tmp_path, "m" * 300))], cwd=ROOT, timeout=120, capture_output=True, text=True)
    assert proc.returncode != 0 and "is not valid here (maxLength: 64)" in proc.stderr and "Traceback" not in proc.stderr
