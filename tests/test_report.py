"""`bfspo report`: the tables go to W&B as numbers (sortable, plottable), not as strings."""

import json

import pandas as pd

from bfspo import cli
from bfspo.reporting.report import read_table


def test_report_tables_hold_numbers(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    csv = tmp_path / "t.csv"
    pd.DataFrame({"Method": ["DAPO", "BFS-PO"], "Source": ["ours", "paper"], "mean": [82.5, 80.0],
                  "n_seeds": [3.0, None], "runs": ["a;b;c", None]}).to_csv(csv, index=False)
    table = read_table(csv)
    assert table["mean"].dtype.kind == "f" and table["n_seeds"].isna().tolist() == [False, True]
    assert table["runs"].tolist() == ["a;b;c", ""]
    (tmp_path / "figs").mkdir()
    out = tmp_path / "report.json"
    assert cli.main(["report", "--project", "p", "--group", "t", "--tables", str(csv), "--figures", str(tmp_path / "figs"),
                     "--wandb-dir", str(tmp_path / "wandb"), "--wandb-tags", "rehearsal", "--out", str(out)]) == 0
    (logged,) = (tmp_path / "wandb").rglob("files/media/table/table/t_*.table.json")
    data = json.loads(logged.read_text())
    assert data["columns"] == ["Method", "Source", "mean", "n_seeds", "runs"]
    assert data["data"][0][2:4] == [82.5, 3.0] and isinstance(data["data"][1][2], float)
