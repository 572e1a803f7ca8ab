"""A finished (or running) `bfspo train` run against its plan: peak memory, generated and trained
tokens/s, and step time, measured (median over the run's steps in metrics.jsonl) beside what
bfspo/pipeline/gpu_plan.py predicts for the same TrainConfig, model shapes and GPU.

    python -m bench.plan_vs_run RUN_DIR [RUN_DIR ...]

The plan's model is the run's own (its config.json's `model`: a local directory, or a hub id whose
config.json ships under config/models/); the card is the visible GPU (or 80 GiB on CPU, where the
memory comparison is not meaningful). The plan assumes vLLM's roofline for generation: with the
transformers engine only the trained tokens/s and the peak compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from bfspo.io import read_json
from bfspo.pipeline.gpu_plan import plan_train_config
from bfspo.training.config import TrainConfig


def medians(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    keys = ("timing/peak_mem_gb", "timing/rollout_tok_s", "timing/train_tok_s", "timing/rollout_s", "timing/update_s",
            "timing/rescore_s", "timing/step_s")
    return {k: statistics.median(r[k] for r in rows if k in r) for k in keys if any(k in r for r in rows)} | {
        "steps": len(rows)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    args = p.parse_args()
    card = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    device = torch.cuda.get_device_name() if card else "CPU (memory not comparable)"
    print(f"\n### Runs against their plan [{device}]\n")
    print("| run | steps | engine | peak GiB (measured / plan) | trained tok/s (measured / plan) | "
          "generated tok/s (measured / plan) | step s (measured / plan) |")
    print("|---|---|---|---|---|---|---|")
    for run_dir in args.runs:
        cfg = TrainConfig(**read_json(run_dir / "config.json"))
        plan = plan_train_config(cfg, run=run_dir.name, gpus=1, nodes=1, ranks=1, gpu_mem=card, cap_min=10**6)
        got = medians(run_dir)
        trained_plan = plan.trained_tokens / plan.step_parts["update"]  # one rank, one GPU
        step = got.get("timing/step_s", got.get("timing/rollout_s", 0) + got.get("timing/update_s", 0))
        print(f"| {run_dir.name} | {got['steps']} | {cfg.engine} | {got.get('timing/peak_mem_gb', float('nan')):.2f} / "
              f"{plan.memory.peak / 2**30:.2f} | {got.get('timing/train_tok_s', float('nan')):.0f} / {trained_plan:.0f} | "
              f"{got.get('timing/rollout_tok_s', float('nan')):.0f} / {plan.decode_tok_s:.0f} | "
              f"{step:.1f} / {plan.step_s:.1f} |")


if __name__ == "__main__":
    main()
