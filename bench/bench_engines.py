"""The two rollout engines on the toy model: sampling tokens/s, and time per RL step (issue 12).

1. Rollouts: `--prompts` toy questions x G samples at T = 1 with a budget of `--budget` tokens,
   from a LoRA policy (as the trainer samples), `--repeats` timed calls after one warm-up.
2. RL steps: `bfspo train` for `--steps` steps with each engine (the toy config's shape: k = 3,
   G = 8, 64 chains a step); the median over steps of the rollout and update seconds that the
   trainer logs in metrics.jsonl (step 1 left out: it warms up).

    python -m bench.bench_engines --model results/toy/model --data results/toy/data/rl_train.jsonl

vLLM starts worker processes by spawn: hence the `__main__` guard.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import add_toy_arguments, print_table, train_metrics

ENGINES = ("transformers", "vllm")


def rollout_rate(engine_name: str, args) -> tuple[float, float, int]:
    """(seconds per call, new tokens/s, new tokens per call) of `engine_name` sampling the toy questions."""
    from peft import LoraConfig, get_peft_model

    from bfspo.io import read_jsonl
    from bfspo.model_io import load_model
    from bfspo.rollout import make_engine
    from bfspo.tasks.benchmarks import get_benchmark
    from bfspo.tasks.prompts import prompt_ids

    base, tokenizer = load_model(args.model)
    policy = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])).eval()
    benchmark = get_benchmark("toy")
    rows = [row for _, row in read_jsonl(args.data)][:args.prompts]
    contexts = [prompt_ids(tokenizer, benchmark, row["question"]) for row in rows]
    sequences = args.prompts * args.group
    kw = {"max_model_len": 512, "max_num_seqs": sequences} if engine_name == "vllm" else {"batch_size": sequences}
    engine = make_engine(engine_name, policy, tokenizer, **kw)
    engine.generate(contexts, args.group, args.budget, seed=0)
    times, tokens = [], 0
    for seed in range(1, args.repeats + 1):
        start = time.perf_counter()
        out = engine.generate(contexts, args.group, args.budget, seed=seed)
        times.append(time.perf_counter() - start)
        tokens += sum(len(c.token_ids) for group in out for c in group)
    seconds = statistics.median(times)
    return seconds, tokens / sum(times), tokens // args.repeats


def rl_step_times(engine_name: str, args, out_dir: Path) -> tuple[float, float]:
    """Median (rollout seconds, update seconds) per step of a short `bfspo train` with `engine_name`."""
    values = dict(model=args.model, train_data=args.data, benchmark="toy", budget=args.budget, k=3, group_size=8,
                  train_batch=64, mini_batch=32, lr=2e-3, steps=args.steps, save_every=args.steps,
                  threads=1, log_trees=False, engine=engine_name)
    rows = train_metrics(values, out_dir)[1:]
    return statistics.median(r["rollout_s"] for r in rows), statistics.median(r["train_s"] for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_toy_arguments(p)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--budget", type=int, default=160)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=4, help="RL steps per engine (the first is not counted)")
    args = p.parse_args()
    torch.set_num_threads(1)
    rollout_rows, step_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ENGINES:
            seconds, rate, tokens = rollout_rate(name, args)
            rollout_rows.append([name, tokens, seconds, rate])
            t_roll, t_train = rl_step_times(name, args, Path(tmp) / name)
            step_rows.append([name, t_roll, t_train, t_roll + t_train])
    print_table(f"rollouts: {args.prompts} toy prompts x G = {args.group}, T = 1, budget {args.budget}",
                ["engine", "new tokens", "s", "new tokens/s"], rollout_rows)
    print_table(f"RL step (k = 3, G = 8, 64 chains), median of steps 2-{args.steps}",
                ["engine", "rollout s", "update s", "step s"], step_rows)


if __name__ == "__main__":
    main()
