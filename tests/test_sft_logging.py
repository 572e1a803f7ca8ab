"""The SFT of the toy model (and of the stand-ins, with the same loop) logs each step to W&B and a
line every 5% of its steps (every step here)."""

from bfspo import cli, tracking


def test_toy_sft_logs_each_step_to_wandb_and_lines_to_the_log(tmp_path, monkeypatch, capsys):
    from bfspo.io import write_jsonl
    from bfspo.toy.task import make_splits

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    rows = make_splits(0, 40, 1, 1)["train"]
    write_jsonl(tmp_path / "train.jsonl", rows)
    out = tmp_path / "model"
    assert cli.main(["toy", "build", "--train", str(tmp_path / "train.jsonl"), "--out-dir", str(out), "--size", "test",
                     "--steps", "10", "--threads", "1", "--wandb-project", "p", "--wandb-dir", str(tmp_path / "wb"),
                     "--run-name", "sft-toy"]) == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if line.startswith("toy sft: step")]
    assert len(lines) == 10 and lines[-1].startswith("toy sft: step 10/10 | loss ")
    (folder,) = tracking.run_folders(tmp_path / "wb" / "wandb")
    record = tracking.read_run(folder)
    assert [h["_step"] for h in record["history"]] == list(range(1, 11))
    assert all("sft/loss" in h and "sft/lr" in h for h in record["history"])
    assert record["run"]["job_type"] == "sft" and record["summary"]["parameters"] > 0
    assert not (out / "wandb").exists()  # the model folder holds the model only
