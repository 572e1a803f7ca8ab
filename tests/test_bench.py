"""bench/gpu_session.sh, the one-command GPU session, run on CPU at tiny sizes: every step runs
(toy build, DAPO and BFS-PO training, four evaluations, both benchmarks) and the report is complete."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(SIZE="test", N_TRAIN="300", N_EVAL="8", STEPS="2", CHAINS="16", MINI="8", BENCH_SHAPE="cpu",
            PACKING_ARGS="--trees 2 --shared 16 --branches 2 --length 16 --repeats 1",
            ROLLOUT_ARGS="--batch 4 --prompt 8 --new 8 --prefixes 8 --group 2 --repeats 1",
            PLAN_LAYERS="1", PLAN_TOKENS="1024", PLAN_ARGS="--no-checkpointing", DECODE_ARGS="--seqs 2 --prompt 4 --new 4")
# The plan's model on CPU: Qwen2.5-3B's config.json at a small width (the plan reads any config.json).
SMALL_QWEN = {"hidden_size": 64, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 512}


@pytest.mark.slow
def test_gpu_session_script_runs_end_to_end_on_cpu(tmp_path):
    shape = tmp_path / "shape"
    shape.mkdir()
    cfg = json.loads((ROOT / "config/models/Qwen/Qwen2.5-3B-Instruct/config.json").read_text()) | SMALL_QWEN
    (shape / "config.json").write_text(json.dumps(cfg))
    env = {**os.environ, **TINY, "WORK": str(tmp_path / "work"), "OMP_NUM_THREADS": "1", "PYTHON": sys.executable,
           "PLAN_SHAPE": str(shape)}
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "bench/gpu_session.sh", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["env.txt", "log.txt", "packing.txt", "plan.txt", "rollout.txt",
                                                     "summary.md"]
    plan = (out / "plan.txt").read_text()
    assert "One micro-batch update against the plan" in plan and "measured / plan" in plan
    assert "vLLM decode against the plan" in plan and "Runs against their plan" in plan
    summary = (out / "summary.md").read_text()
    for run in ("dapo", "bfspo"):
        assert f"| {run} | toy |" in summary and f"| {run} | toy_ood |" in summary
        assert f"| {run} | 2 |" in summary  # two training steps logged
    assert "tree-packed" in (out / "packing.txt").read_text()
    assert "prefix reuse" in (out / "rollout.txt").read_text()
    assert "CPU (no CUDA)" in (out / "env.txt").read_text()


def test_gpu_session_script_needs_an_output_dir():
    proc = subprocess.run(["bash", "bench/gpu_session.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "usage: bench/gpu_session.sh OUT_DIR" in proc.stderr
