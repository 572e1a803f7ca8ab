"""The dynamic-sampling filter's cost on the toy (issue 32): chains generated per optimizer step
against chains trained, for each method and filter, beside the plan's signal model.

Arms (one `bfspo train` each, `--steps` steps, 1 thread, one optimizer step per step: `train_batch`
= `mini_batch` = `--chains` chains, the paper's oversample 3 and up to 10 generation rounds):
  dapo-g16           DAPO, G = 16 (K = 0: both filters are the same);
  bfspo-g4-first     BFS-PO K = 3, G = 4 (config/paper.yaml's trees of 16 chains), filter first_samples;
  bfspo-g4-all       the same with filter all_leaves;
  bfspo-g16-first    BFS-PO K = 3, G = 16 (64-chain trees), first_samples;
  bfspo-g16-all      the same with all_leaves.
Per arm, the means over steps of what metrics.jsonl logs (`rollout/`): questions generated and the
share kept, chains generated (`rollout/chains_generated`) and trained (`rollout/chains`), tokens
generated, rollout seconds; and the plan's prediction of the share kept,
bfspo.pipeline.throughput.signal_rate at the step's measured first-sample accuracy p.

    python -m bench.bench_filter_cost --model results/toy/model --data results/toy/data/rl_train.jsonl
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.common import add_toy_arguments, print_table, train_metrics
from bfspo.pipeline.throughput import signal_rate

ARMS = (("dapo-g16", 16, 0, "first_samples"), ("bfspo-g4-first", 4, 3, "first_samples"),
        ("bfspo-g4-all", 4, 3, "all_leaves"), ("bfspo-g16-first", 16, 3, "first_samples"),
        ("bfspo-g16-all", 16, 3, "all_leaves"))


def run_arm(args, out_dir: Path, group: int, k: int, filter: str) -> list[dict]:
    """metrics.jsonl's rows of a short `bfspo train` of one arm."""
    values = dict(model=args.model, train_data=args.data, benchmark="toy", budget=args.budget, k=k, group_size=group,
                  train_batch=args.chains, mini_batch=args.chains, filter=filter, oversample=3.0, max_gen_rounds=10,
                  lr=2e-3, steps=args.steps, save_every=args.steps, threads=1, log_trees=0, seed=args.seed,
                  engine="transformers")
    return train_metrics(values, out_dir)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_toy_arguments(p)
    p.add_argument("--chains", type=int, default=64, help="chains per batch and per optimizer step")
    p.add_argument("--budget", type=int, default=160)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, group, k, filter in ARMS:
            steps = run_arm(args, Path(tmp) / name, group, k, filter)

            def mean(key):
                return statistics.fmean(r[key] for r in steps)

            accuracy = mean("rollout/accuracy")
            generated, trained = mean("rollout/chains_generated"), mean("rollout/chains")
            rows.append([name, group, k, filter, mean("rollout/questions_generated"),
                         mean("rollout/questions_kept") / mean("rollout/questions_generated"),
                         signal_rate(group, k, filter, accuracy), accuracy, generated, trained, generated / trained,
                         mean("rollout/tokens_generated"), mean("timing/rollout_s")])
    print_table(f"the filter's cost on the toy: {args.chains} chains per optimizer step, oversample 3, "
                f"budget {args.budget}, means over {args.steps} steps, seed {args.seed}",
                ["arm", "G", "K", "filter", "questions generated", "share kept", "plan's signal_rate(p)",
                 "first-sample accuracy p", "chains generated", "chains trained", "generated / trained",
                 "tokens generated", "rollout s"], rows)


if __name__ == "__main__":
    main()
