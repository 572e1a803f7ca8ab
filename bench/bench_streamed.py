"""Lockstep against streamed tree expansion on vLLM (issue 32): rollout wall time and the engine's
occupancy, at K = 0 and K = 3, in one run on one engine.

Both rollouts grow the same trees (the same toy questions, seed and options; with per-request
seeds, the default on CPU, the trees are byte-identical, which the table checks): the lockstep one
with `build_trees` (K+1 engine calls, each waiting for its longest chain), the streamed one with
`stream_trees` (one engine loop; each tree expands as soon as its G samples finish). Both rescore
each group on the training side, as the trainer does. Occupancy is the mean sequences vLLM ran
per engine step over `max_num_seqs` (bfspo.rollout.base.Occupancy); `max_num_seqs` defaults to the
lockstep call's first batch, questions x G. The order of the two rollouts alternates per repeat,
after one warm-up rollout of each.

    python -m bench.bench_streamed --model results/toy/model --data results/toy/data/rl_train.jsonl

It prints a table; the numbers belong in bench/RESULTS.md with the device, date and command.
vLLM starts its engine process by spawn: hence the `__main__` guard.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bench.common import add_toy_arguments, print_table

MODES = ("lockstep", "streamed")


def rollout(mode: str, engine, prompts, scorers, search: dict) -> tuple[float, dict, list]:
    """(seconds, occupancy, trees) of one rollout of `prompts` in `mode`."""
    from bfspo.algorithm.search import build_trees
    from bfspo.rollout.streamed import stream_trees

    engine.pop_occupancy()
    t0 = time.perf_counter()
    trees = (build_trees if mode == "lockstep" else stream_trees)(engine, prompts, scorers, **search)
    seconds = time.perf_counter() - t0
    return seconds, engine.pop_occupancy(), trees


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_toy_arguments(p)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--group", type=int, default=8, help="G")
    p.add_argument("--k", type=int, nargs="+", default=[0, 3])
    p.add_argument("--budget", type=int, default=160, help="the toy's training budget")
    p.add_argument("--filter", default="first_samples", help="first_samples (config/paper.yaml) or all_leaves")
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: questions x G")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from peft import LoraConfig, get_peft_model

    from bfspo.io import read_jsonl
    from bfspo.model_io import load_model
    from bfspo.rollout import make_engine
    from bfspo.rollout.base import needed_model_len
    from bfspo.tasks.benchmarks import get_benchmark
    from bfspo.tasks.prompts import prompt_ids
    from bfspo.tasks.verify import is_correct

    base, tokenizer = load_model(args.model)
    policy = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])).eval()
    rows = [row for _, row in read_jsonl(args.data)][:args.questions]
    prompts = [prompt_ids(tokenizer, get_benchmark("toy"), row["question"]) for row in rows]

    def scorer(gold):
        return lambda ids: is_correct("toy", tokenizer.decode(ids, skip_special_tokens=True), gold)

    scorers = [scorer(str(row["answer"])) for row in rows]
    capacity = args.max_num_seqs or args.questions * args.group
    engine = make_engine("vllm", policy, tokenizer, micro_batch_tokens=8192, max_num_seqs=capacity,
                         max_model_len=needed_model_len([len(x) for x in prompts], args.budget))
    table = []
    for k in args.k:
        search = dict(group_size=args.group, k=k, budget=args.budget, filter=args.filter, seed=args.seed)
        for mode in MODES:  # warm-up
            rollout(mode, engine, prompts[:2], scorers[:2], search)
        runs = {mode: [] for mode in MODES}
        for r in range(args.repeats):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                runs[mode].append(rollout(mode, engine, prompts, scorers, search))
        same = all(json.dumps([t.to_dict() for t in a[2]]) == json.dumps([t.to_dict() for t in b[2]])
                   for a, b in zip(runs["lockstep"], runs["streamed"]))
        lock_s = statistics.median(s for s, _, _ in runs["lockstep"])
        for mode in MODES:
            seconds = statistics.median(s for s, _, _ in runs[mode])
            occ = statistics.median(o["occupancy"] for _, o, _ in runs[mode])
            steps = statistics.median(o["engine_steps"] for _, o, _ in runs[mode])
            trees = runs[mode][0][2]
            tokens = sum(t.n_tokens for t in trees)
            table.append([k, mode, f"{seconds:.2f}", f"{lock_s / seconds:.2f}x", f"{occ:.3f}", int(steps),
                          sum(len(t.leaves()) for t in trees), tokens, "yes" if same else "NO"])
    print_table(f"lockstep vs streamed rollout: {args.questions} questions x G = {args.group}, budget "
                f"{args.budget}, max_num_seqs {capacity}, filter {args.filter}, median of {args.repeats}",
                ["K", "rollout", "wall s", "speed-up", "occupancy", "engine steps", "chains", "tokens",
                 "trees identical"], table)


if __name__ == "__main__":
    main()
