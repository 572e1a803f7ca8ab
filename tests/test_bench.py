"""bench/gpu/gpu_session.sh and bench/gpu/gpu_check.py, the GPU check (issues 30, 38). `make gpu-session-rehearsal`
runs the whole check on CPU at tiny sizes in a venv of the GPU image's packages; these tests check
what a GPU run relies on: a part cut off at its limit, or killed, leaves what it measured and a
summary; OUT holds what the device returns whole; no probe of the environment stops the check;
the carried wheels are the lock's versions; and the wrapper's usage."""

import subprocess
from pathlib import Path

import yaml

from bench.gpu import gpu_check
from bench.gpu.gpu_rehearsal_check import kill_after_first, out_problems
from bfspo.algorithm.attention_options import BUCKET_TOKENS

ROOT = Path(__file__).resolve().parents[1]


def test_a_part_cut_off_at_its_limit_leaves_the_summary_and_what_it_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_CHECK_WORK", str(tmp_path / "work"))
    monkeypatch.setitem(gpu_check.PRESETS["tiny"]["toy"], "limit", 12)  # its data, not its training
    out = tmp_path / "out"
    assert gpu_check.main(["--out", str(out), "--preset", "tiny", "--parts", "toy", "attention", "--total-s", "20"]) == 1
    summary = (out / "summary.md").read_text()
    assert "| toy | cut off at its limit of 12 s" in summary
    assert "- data (300 SFT rows):" in summary  # written by the part before it was cut off
    assert "| attention | not run: the check's time is spent |" in summary  # under 10 s were left
    assert "not installed:" in (out / "env.txt").read_text()
    assert sorted(p.name for p in out.iterdir()) == sorted(gpu_check.OUT_FILES) and out_problems(out) == []
    assert "===== toy (limit 12 s) =====" in (out / "logs.txt").read_text()


def test_the_update_part_killed_after_its_first_measurement_leaves_it_in_the_results(tmp_path, monkeypatch):
    """Issue 38: each measurement reaches results.json (and summary.md) as it is made, so a part killed
    at its limit keeps it (the update part used to print its JSON only at its end)."""
    monkeypatch.setenv("GPU_CHECK_WORK", str(tmp_path / "work"))
    out = tmp_path / "out"
    record, rc = kill_after_first(out, "update")
    assert rc == 1 and record["status"] == "killed by signal 9", record
    first = record["measurements"][0]
    assert first["stage"] == "model" and first["layers"] == 2 and first["row_tokens"] <= 4096 and first["trees"] >= 1
    assert "| model built, s |" in (out / "summary.md").read_text()
    assert out_problems(out) == []


def test_out_problems_names_what_the_device_would_not_return(tmp_path):
    for i in range(9):
        (tmp_path / f"f{i}.txt").write_text("x")
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    (tmp_path / "odd name.txt").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "f0.txt")
    problems = "\n".join(out_problems(tmp_path))
    assert "12 files, more than 8" in problems
    assert "a/b/c/deep.txt: deeper than OUT/a/b/file" in problems
    assert "odd name.txt: a name other than" in problems and "link: not a plain file" in problems


def test_no_probe_of_the_environment_stops_the_check(monkeypatch, tmp_path):
    """Issue 38: without git (or nvidia-smi) on the PATH, the commit is unknown, and the check goes on."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no git, no nvidia-smi
    env = gpu_check.environment()
    assert env["commit"].startswith("unknown (FileNotFoundError") and env["driver"].startswith("unknown (")
    assert env["torch"] and env["python"]
    assert gpu_check.probe(lambda: 1 / 0).startswith("unknown (ZeroDivisionError")


def test_the_attention_part_measures_paper_yamls_3b_buckets_largest_first():
    config = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    assert gpu_check.PAPER_CLASS == {"micro_batch_tokens": config["resources"]["3b"]["train"]["micro_batch_tokens"],
                                     "attention_bucket": config["train"].get("attention_bucket", BUCKET_TOKENS)}
    assert gpu_check.attention_lengths(**gpu_check.PAPER_CLASS) == [32768, 2048, 16384]
    assert gpu_check.TOTAL_S["gpu"] <= 8 * 60  # with a machine start, 15 min of device time leave a rerun


def test_the_carried_wheels_are_the_locks_versions():
    lock = dict(line.split("==") for line in (ROOT / "requirements/lock-cpu.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    lock = {k.lower().replace("_", "-"): v for k, v in lock.items()}
    carried = [line for line in (ROOT / "bench/gpu/gpu-wheels.txt").read_text().splitlines()
               if line and not line.startswith("#")]
    assert carried
    for pin in carried:
        name, version = pin.split("==")
        assert lock[name.lower().replace("_", "-")] == version, pin
    assert not {"torch", "vllm", "wandb", "snakemake", "pandas"} & {p.split("==")[0] for p in carried}


def test_gpu_session_script_needs_an_output_dir():
    proc = subprocess.run(["bash", "bench/gpu/gpu_session.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "usage: bench/gpu/gpu_session.sh OUT_DIR" in proc.stderr
