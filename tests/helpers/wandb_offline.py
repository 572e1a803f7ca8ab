"""Read an offline W&B run back with wandb's own reader (`wandb leet inspect --json`).

wandb runs as `python -m wandb` with the interpreter running the tests, so that the reader is found
whether or not the venv's bin/ is on PATH (a bare `pytest -k ...` outside `make` has it off PATH)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def read_offline_run(offline_dir: Path) -> dict:
    """{"run": the run record, "history": [history items], "summary": the merged summary updates}."""
    (wandb_file,) = offline_dir.glob("run-*.wandb")
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_file)],
                          capture_output=True, text=True, timeout=120, check=True)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    summary: dict = {}
    for r in records:
        if r["type"] == "summary":
            summary |= r["summary"].get("update", {})
    return {"run": next(r["run"] for r in records if r["type"] == "run"),
            "history": [r["history"]["item"] for r in records if r["type"] == "history"],
            "summary": summary}
