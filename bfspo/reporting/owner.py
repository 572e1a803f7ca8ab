"""Which workflow config owns a table: two configs that name the same table in the same results folder
would overwrite each other's table, figures and report in silence.

`bfspo tables build --owner CONFIG` records the config file(s) of the workflow that built a table in
`<results>/tables/<table>.owner`. When a workflow is planned (workflow/rules/common.smk), a table
whose record names other config files is refused, `snakemake -n` included, with the ways out:
rename the table, give the config its own `results:` folder, or delete the old table's files to
hand its name over. Light (no pandas): this runs in every Snakemake invocation.
"""

from __future__ import annotations

import os
from pathlib import Path

from bfspo.io import atomic_write_text

SUFFIX = ".owner"


def config_id(config_files) -> str:
    """The config file(s) a workflow was started with (Snakemake's `workflow.configfiles`), as paths
    relative to the working directory, so that `config/a.yaml` and `./config/a.yaml` are one owner."""
    return " + ".join(os.path.relpath(os.path.abspath(p)) for p in config_files) or "(no config file)"


def owner_path(tables_dir: str | os.PathLike, table: str) -> Path:
    return Path(tables_dir) / f"{table}{SUFFIX}"


def write_owner(tables_dir: str | os.PathLike, table: str, owner: str) -> None:
    atomic_write_text(owner_path(tables_dir, table), owner + "\n")


def owner_problems(tables_dir: str | os.PathLike, tables, owner: str) -> list[str]:
    """One line per table of `tables` that `tables_dir` holds from another config than `owner`."""
    problems = []
    for table in tables:
        path = owner_path(tables_dir, table)
        recorded = path.read_text(encoding="utf-8").strip() if path.is_file() else owner
        if recorded != owner:
            problems.append(f"table {table}: {Path(tables_dir) / table}.csv was built by the config {recorded}, "
                            f"not {owner}; both would write it. Rename the table in one of them, give one its own "
                            f"`results:` folder, or delete {Path(tables_dir) / table}.* to hand the name to {owner}")
    return problems
