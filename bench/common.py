"""Shared pieces of the benchmarks: random-weight model shapes and a timer.

Speed does not depend on the weights' values, so every benchmark builds its model offline from a
config with random weights (no hub). Times are medians over repeats after warm-up; on CUDA they are
taken with CUDA events.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

# name -> Qwen2Config fields. "0.5b" and "3b" are Qwen2.5-0.5B / 3B shaped; "cpu" fits a laptop core.
SHAPES = {
    "cpu": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=2, vocab_size=8192),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
    "3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, vocab_size=151936),
}


def device_and_dtype() -> tuple[torch.device, torch.dtype]:
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16
    return torch.device("cpu"), torch.float32


def random_model(shape: str, attn: str = "sdpa"):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    device, dtype = device_and_dtype()
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=shape != "3b",
                         attn_implementation=attn)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()


def timed(fn, repeats: int = 5, warmup: int = 2) -> float:
    """Median seconds of fn() after warm-up."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def timed_rounds(fns, repeats: int = 5, warmup: int = 2) -> list[list[float]]:
    """Seconds of each fn per round, after warm-up: every round runs each fn once, in turn, so that a
    change of load on shared cores hits them all alike (compare them round by round)."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            out.append(timed(fn, repeats=1, warmup=0))
    return times


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({torch.get_num_threads()} threads)"


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    print(f"\n### {title}  [{device_name()}, torch {torch.__version__}]\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(f"{x:.3g}" if isinstance(x, float) else str(x) for x in row) + " |")


def train_command(settings: dict, out_dir: Path) -> list[str]:
    """`bfspo train` in this Python, with `settings` (TrainConfig fields) as its --set values."""
    return [sys.executable, "-m", "bfspo.cli", "train", "--output-dir", str(out_dir),
            "--set", *(f"{key}={value}" for key, value in settings.items())]


def train_metrics(settings: dict, out_dir: Path) -> list[dict]:
    """The metrics.jsonl rows of a `bfspo train` run (one thread, W&B off); exits naming the run if it fails."""
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(train_command(settings, out_dir), env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bfspo train ({out_dir.name}) failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def add_toy_arguments(p) -> None:
    """--model and --data of a benchmark on the toy (the outputs of `bfspo toy build` and `bfspo toy data`)."""
    p.add_argument("--model", required=True, help="the toy model directory (bfspo toy build)")
    p.add_argument("--data", required=True, help="toy questions (rl_train.jsonl of bfspo toy data)")
