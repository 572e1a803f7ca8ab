"""`bfspo sync` finds every offline W&B run of a results folder (training, evaluation and report runs),
uploads a resumed run's fragments together, oldest first, and never puts a rehearsal run in the
paper's project."""

import json
import subprocess
from types import SimpleNamespace

import pytest

from bfspo import cli, tracking
from bfspo.errors import BfspoError
from bfspo.reporting.sync import find_runs, offline_runs


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def _run(run_dir, job_type, project="bfspo-test", tags=None):
    wb = tracking.start(run_dir, {}, project=project, group="g", job_type=job_type, name=run_dir.name, tags=tags)
    tracking.log(wb, {"x": 1.0}, step=1)
    tracking.finish(wb)
    return wb.id


@pytest.fixture
def fake_wandb(monkeypatch):
    calls, real_run = [], subprocess.run

    def fake_run(cmd, **kwargs):  # `wandb sync` is faked; wandb's reader (tracking.read_run) runs
        if cmd[1:2] != ["sync"]:
            return real_run(cmd, **kwargs)
        calls.append(cmd)
        return SimpleNamespace(returncode=1 if any("/eval/" in c for c in cmd) else 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    return calls


def test_sync_lists_training_evaluation_and_report_runs(tmp_path, offline, capsys):
    results = tmp_path / "results"
    dirs = [results / "runs" / "m_ts_dapo_s0", results / "eval" / "m_ts_dapo_s0" / "toy",
            results / "wandb" / "report-table2"]
    ids = [_run(d, job) for d, job in zip(dirs, ("train", "eval", "report"))]
    _run(dirs[0], "train")  # a resumed training run: a second fragment with the same id
    found = offline_runs(results)
    # the id from the run file: a folder made in the same second as another gets a "-1" suffix
    assert len(found) == 4 and sorted({tracking.folder_run_id(p) for p in found}) == sorted(ids)
    assert all(any(str(p).startswith(str(d)) for p in found) for d in dirs)
    runs = find_runs(results)  # runs started in the same second come in path order
    assert sorted((r.run_id, len(r.fragments)) for r in runs) == sorted(zip(ids, [2, 1, 1]))
    assert [tracking.folder_run_id(p) for p in runs[[r.run_id for r in runs].index(ids[0])].fragments] == \
        [ids[0], ids[0]]
    capsys.readouterr()
    assert cli.main(["sync", str(results), "--dry-run"]) == 0
    header, *listed = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert header == ["name", "project", "group", "fragments", "tags", "folder"]
    # issue 33: each run once (the resumed one was two lines), with its name, group, tags and fragments
    assert sorted((name, fragments, folder) for name, _, _, fragments, _, folder in listed) == sorted(
        [(d.name, "2" if d == dirs[0] else "1", str(d / "wandb")) for d in dirs])
    assert {(project, group, tags) for _, project, group, _, tags, _ in listed} == {("bfspo-test", "g", "-")}


def test_sync_lists_the_workflows_tags(tmp_path, offline, capsys):
    run_dir = tmp_path / "results" / "runs" / "toy_toy_dapo_s0"
    wb = tracking.start(run_dir, {"tables": ["toy-ablation"], "method_key": "dapo", "model_label": "toy", "seed": 0},
                        project="bfspo", group="toy-ablation", job_type="train", name=run_dir.name)
    tracking.finish(wb)
    capsys.readouterr()
    assert cli.main(["sync", str(tmp_path / "results"), "--list"]) == 0
    (line,) = capsys.readouterr().out.splitlines()[1:]
    assert line.split("\t")[:5] == ["toy_toy_dapo_s0", "bfspo", "toy-ablation", "1",
                                    "table:toy-ablation,method:dapo,model:toy,seed:0"]


def test_an_offline_runs_log_ends_pointing_at_bfspo_sync(tmp_path, monkeypatch, capfd):
    """Issue 33: a train log ended with wandb's own advice, `wandb sync <one fragment>`."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    run_dir = tmp_path / "runs" / "r"
    wb = tracking.start(run_dir, {}, project="p", group="g", job_type="train", name="r", footer=False)
    tracking.log(wb, {"x": 1.0}, step=1)
    tracking.finish(wb, {"x": 1.0})
    out = capfd.readouterr()
    text = out.out + out.err
    assert "wandb sync" not in text and "sync this run" not in text
    assert out.out.strip().splitlines()[-1].startswith("W&B: offline run offline-run-")
    assert f"upload it with `bfspo sync {run_dir}`" in out.out


def test_sync_leaves_out_a_run_set_aside_when_its_inputs_changed(tmp_path, offline):
    """Issue 31: a training run whose inputs changed moves to previous/<n>/ with its W&B run; the run that
    replaces it is the only one uploaded."""
    results = tmp_path / "results"
    _run(results / "runs" / "a" / "previous" / "1", "train")
    _run(results / "runs" / "a" / "previous" / "2", "train")
    kept = _run(results / "runs" / "a", "train")
    assert [tracking.folder_run_id(p) for p in offline_runs(results)] == [kept]


def test_sync_of_a_folder_without_runs_is_an_error(tmp_path, capsys):
    assert cli.main(["sync", str(tmp_path)]) == 2
    assert "no offline W&B runs" in capsys.readouterr().err
    with pytest.raises(BfspoError, match="no such results folder"):
        offline_runs(tmp_path / "missing")


def test_sync_uploads_each_run_in_one_call_and_names_the_failures(tmp_path, offline, fake_wandb, capsys):
    results = tmp_path / "results"
    _run(results / "runs" / "a", "train")
    _run(results / "runs" / "a", "train")  # resumed
    _run(results / "eval" / "a" / "toy", "eval")
    assert cli.main(["sync", str(results)]) == 2
    fragments = offline_runs(results)
    train = [str(p) for p in fragments if "/runs/" in str(p)]
    assert sorted(fake_wandb) == sorted([[fake_wandb[0][0], "sync", "--project", "bfspo-test", *train],
                                         [fake_wandb[0][0], "sync", "--project", "bfspo-test",
                                          *(set(map(str, fragments)) - set(train))]])
    assert "wandb sync failed for 1 of 2 runs" in capsys.readouterr().err


def test_rehearsal_runs_never_reach_the_papers_project(tmp_path, offline, fake_wandb, capsys):
    """Tagged runs, runs of a rehearsal project, and untagged runs under a rehearsal's results folder
    (made before the rehearsal had its own project) are left out of a plain sync; --rehearsal
    uploads only them, each into a `-rehearsal` project."""
    results = tmp_path / "results"
    _run(results / "runs" / "paper", "train", project="bfspo")
    _run(results / "rehearsal" / "runs" / "tagged", "train", project="bfspo-rehearsal", tags=["rehearsal"])
    _run(results / "other" / "tagged-elsewhere", "eval", project="bfspo", tags=["table:x", "rehearsal"])
    (results / "rehearsal" / "config.yaml").write_text("# REHEARSAL\nstand_ins: {dir: results/rehearsal/models}\n")
    _run(results / "rehearsal" / "evals" / "old", "eval", project="bfspo")  # untagged, in the paper's project
    assert cli.main(["sync", str(results)]) == 0
    assert [c[3:] for c in fake_wandb] == [["bfspo", str(next((results / "runs" / "paper").rglob("offline-run-*")))]]
    assert "left out 3 rehearsal run(s)" in capsys.readouterr().out
    fake_wandb.clear()
    assert cli.main(["sync", str(results), "--rehearsal"]) == 0
    assert sorted(c[3] for c in fake_wandb) == ["bfspo-rehearsal"] * 3
    assert all("/runs/paper/" not in c[-1] for c in fake_wandb)
    assert cli.main(["sync", str(results / "runs"), "--rehearsal"]) == 2
    assert "no rehearsal runs to upload" in capsys.readouterr().err


def test_a_fifo_in_place_of_a_run_file_is_skipped_with_a_warning(tmp_path, offline, capsys):
    """Issue 46: a FIFO in place of a `.wandb` file hung `sync --list` and left a stuck child; the run
    is left out, with a warning naming the file, and the others are listed."""
    import os
    import sys

    from tests.helpers import process

    results = tmp_path / "results"
    kept = _run(results / "runs" / "m_ts_dapo_s0", "train")
    _run(results / "runs" / "m_ts_dapo_s1", "train")
    (run_file,) = (results / "runs" / "m_ts_dapo_s1" / "wandb").glob("offline-run-*/run-*.wandb")
    run_file.unlink()
    os.mkfifo(run_file)
    try:
        proc = process.run([sys.executable, "-m", "bfspo.cli", "sync", str(results), "--list"], timeout=60,
                           capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        pytest.fail("bfspo sync --list hung on a FIFO")
    assert proc.returncode == 0 and f"warning: {run_file}: not a regular file; its run is left out" in proc.stderr
    assert [line.split("\t")[0] for line in proc.stdout.splitlines()[1:]] == ["m_ts_dapo_s0"]
    assert [r.run_id for r in find_runs(results)] == [kept]
    with pytest.raises(BfspoError, match="not a regular file"):
        tracking.read_run(run_file.parent)


def test_a_rebuilt_tables_report_sets_the_stale_report_aside(tmp_path, offline, capsys):
    """Issue 45: after a rerun, `sync --list` showed two report runs with one name, the stale one and
    the new one. The earlier report run is set aside under previous/<n>/, as a stale run is."""
    import pandas as pd

    results = tmp_path / "results"
    csv = tmp_path / "t.csv"
    pd.DataFrame({"Method": ["DAPO"], "mean": [82.5]}).to_csv(csv, index=False)
    report = ["report", "--project", "p", "--group", "t", "--tables", str(csv), "--wandb-dir", str(results / "wandb"),
              "--out", str(results / "report" / "t.json")]
    ids = []
    for _ in range(2):
        assert cli.main(report) == 0
        ids.append(json.loads((results / "report" / "t.json").read_text())["run_id"])
    assert ids[0] != ids[1]
    assert [(r.name, r.run_id) for r in find_runs(results)] == [("t", ids[1])]
    capsys.readouterr()
    assert cli.main(["sync", str(results), "--list"]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()[1:]] == ["t"]
    (previous,) = (results / "wandb" / "report-t" / "previous").iterdir()
    assert previous.name == "1" and (previous / "wandb_id.txt").read_text().strip() == ids[0]
