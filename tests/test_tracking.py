"""W&B logging works offline, with no account and no network, and a resumed run keeps its id."""

import os

from bfspo import tracking


def test_offline_run_is_written_and_resumes_with_the_same_id(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tracking.start(tmp_path, {"k": 3}, project="bfspo-test", group="g", job_type="train", name="r")
    tracking.log(run, {"loss": 0.5}, step=1)
    tracking.finish(run)
    first_id = (tmp_path / "wandb_id.txt").read_text().strip()
    runs = list((tmp_path / "wandb").glob(f"offline-run-*-{first_id}"))
    assert runs and list(runs[0].glob("*.wandb")), "no offline run file"
    again = tracking.start(tmp_path, {"k": 3}, project="bfspo-test", group="g", job_type="train", name="r")
    assert again.id == first_id
    tracking.finish(again)


def test_disabled_mode_logs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = tracking.start(tmp_path, {}, project="p", group=None, job_type="eval", name="n")
    assert run is None
    tracking.log(run, {"x": 1})
    tracking.finish(run)
    assert not (tmp_path / "wandb").exists() and not os.listdir(tmp_path)


def test_runs_are_tagged_with_the_workflows_names(tmp_path, monkeypatch):
    from bfspo.reporting.sync import offline_runs

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    names = {"tables": ["table2", "ablation"], "method_key": "bfspo", "model_label": "Qwen2.5-3B", "seed": 1, "k": 3}
    assert tracking.run_tags(names) == ["table:table2", "table:ablation", "method:bfspo", "model:Qwen2.5-3B", "seed:1"]
    run = tracking.start(tmp_path, names, project="bfspo-test", group="g", job_type="train", name="r")
    tracking.log(run, {"train/loss": 0.5}, step=1)
    tracking.finish(run)
    (offline,) = offline_runs(tmp_path)
    record = tracking.read_run(offline)
    assert record["run"]["tags"] == tracking.run_tags(names)
    assert record["run"]["config"]["update"]["tables"] == ["table2", "ablation"]
    assert [h["train/loss"] for h in record["history"]] == [0.5]
