"""`bfspo sync` finds every offline W&B run of a results folder: training, evaluation and report runs."""

import pytest

from bfspo import cli, tracking
from bfspo.errors import BfspoError
from bfspo.reporting.sync import offline_runs


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def _run(run_dir, job_type):
    wb = tracking.start(run_dir, {}, project="bfspo-test", group="g", job_type=job_type, name=run_dir.name)
    tracking.log(wb, {"x": 1.0}, step=1)
    tracking.finish(wb)
    return wb.id


def test_sync_lists_training_evaluation_and_report_runs(tmp_path, offline, capsys):
    results = tmp_path / "results"
    dirs = [results / "runs" / "m_ts_dapo_s0", results / "eval" / "m_ts_dapo_s0" / "toy",
            results / "wandb" / "report-table2"]
    ids = [_run(d, job) for d, job in zip(dirs, ("train", "eval", "report"))]
    _run(dirs[0], "train")  # a resumed training run: a second fragment with the same id
    found = offline_runs(results)
    # the id from the run file: a folder made in the same second as another gets a "-1" suffix
    assert len(found) == 4 and sorted({next(p.glob("run-*.wandb")).stem[4:] for p in found}) == sorted(ids)
    assert all(any(str(p).startswith(str(d)) for p in found) for d in dirs)
    assert cli.main(["sync", str(results), "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(p) for p in found]


def test_sync_of_a_folder_without_runs_is_an_error(tmp_path, capsys):
    assert cli.main(["sync", str(tmp_path)]) == 2
    assert "no offline W&B runs" in capsys.readouterr().err
    with pytest.raises(BfspoError, match="no such results folder"):
        offline_runs(tmp_path / "missing")


def test_sync_runs_wandb_sync_on_each_run_and_names_the_failures(tmp_path, offline, monkeypatch, capsys):
    import subprocess
    from types import SimpleNamespace

    results = tmp_path / "results"
    _run(results / "runs" / "a", "train")
    _run(results / "eval" / "a" / "toy", "eval")
    calls = []

    def fake_run(cmd):
        calls.append(cmd)
        return SimpleNamespace(returncode=1 if "/eval/" in cmd[-1] else 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert cli.main(["sync", str(results)]) == 2
    assert [c[1:-1] for c in calls] == [["sync"], ["sync"]] and [c[-1] for c in calls] == list(map(str, offline_runs(results)))
    assert "wandb sync failed for 1 of 2 offline runs" in capsys.readouterr().err
