"""bench/gpu_session.sh and bench/gpu_check.py, the GPU check (issue 30). `make gpu-session-rehearsal`
runs the whole check on CPU at tiny sizes in a venv of the GPU image's packages; these tests check
what a GPU run relies on: a part cut off at its limit leaves what it measured and a summary, the
carried wheels are the lock's versions, and the wrapper's usage."""

import subprocess
from pathlib import Path

from bench import gpu_check

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


def test_the_carried_wheels_are_the_locks_versions():
    lock = dict(line.split("==") for line in (ROOT / "requirements/lock-cpu.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    lock = {k.lower().replace("_", "-"): v for k, v in lock.items()}
    carried = [line for line in (ROOT / "bench/gpu-wheels.txt").read_text().splitlines()
               if line and not line.startswith("#")]
    assert carried
    for pin in carried:
        name, version = pin.split("==")
        assert lock[name.lower().replace("_", "-")] == version, pin
    assert not {"torch", "vllm", "wandb", "snakemake", "pandas"} & {p.split("==")[0] for p in carried}


def test_gpu_session_script_needs_an_output_dir():
    proc = subprocess.run(["bash", "bench/gpu_session.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "usage: bench/gpu_session.sh OUT_DIR" in proc.stderr
