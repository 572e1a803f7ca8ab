"""docs/coming-from.md maps other frameworks' config keys and metric names to bfspo's: every bfspo key
it names is a `bfspo train` key, and every bfspo metric it names is one the trainer logs."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from bfspo.training.config import TrainConfig, choices

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "coming-from.md").read_text()


def first_column(section: str) -> list[str]:
    """The backticked names in the first column of the table under `## section`."""
    body = DOC.split(f"## {section}\n")[1].split("\n## ")[0]
    rows = [line.split("|")[1] for line in body.splitlines() if line.startswith("| ") and "---" not in line][1:]
    return [name for cell in rows for name in re.findall(r"`([^`]+)`", cell)]


def test_every_bfspo_config_key_of_the_table_is_a_train_key():
    keys = {f.name for f in fields(TrainConfig)}
    values = {v for allowed in choices().values() for v in allowed}  # allowed values the cells name
    named = [n.split(":")[0] for n in first_column("Config keys")]
    assert named and [n for n in named if n not in keys | values] == []
    assert {"group_size", "k", "train_batch", "mini_batch", "eps_low", "eps_high", "filter", "budget"} <= set(named)


def test_every_bfspo_metric_of_the_table_is_logged():
    source = "".join(p.read_text() for p in (ROOT / "bfspo" / "training").glob("*.py"))
    logged = set(re.findall(r'"((?:rollout|tree|advantage|train|timing|val-core)/[a-z_]+)"', source))
    named = [n for n in first_column("Metrics") if "/" in n]
    assert len(named) > 15 and [n for n in named if n not in logged] == []
