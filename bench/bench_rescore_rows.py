"""The rescoring's rows: one per group (before issue 38) against groups packed into shared rows.

vLLM's samples are rescored on the training side (bfspo.rollout.rescore.RescoredEngine), each group
(a context and its G samples) a tree. Groups shaped as paper.yaml's Qwen2.5-3B BFS-PO on GSM8K (G = 4,
K = 3: a line-2 group holds a `--prompt`-token prompt and G answers of about `--answer` tokens; an
expansion's group the prompt, a prefix of half an answer and G continuations of half an answer;
answers 0.5-1.5x the mean, within the budget; line-2 and expansion groups 1 : 1.27, as the plan's
first_samples filter expands 42% of trees) are rescored by a random-weight model with Qwen2.5-3B's
config.json, narrower (`--hidden`, `--layers`), in float32, through the compiled flex kernel, whose rows are
padded to bucket lengths (`--tokens`, `--bucket`: paper.yaml's 3b class), as on CUDA: one call per
group against one call for all. Printed per layout: rows, their tokens, the tokens with the padding
(what the GPU runs), seconds (the second of two runs: compiles excluded), and the largest
difference of a log-prob and of an entropy from the per-group layout's.

    python -m bench.bench_rescore_rows                  # CPU: torch compiles flex's forward there too
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from bench.common import print_table
from bfspo.rollout.base import Completion
from bfspo.rollout.rescore import RescoredEngine


def groups(args, vocab: int) -> tuple[list, list]:
    """(contexts, their groups of completions) shaped as the module doc says."""
    rng = random.Random(0)

    def ids(n):
        return [rng.randrange(5, vocab) for _ in range(n)]

    def answer(mean):
        return max(1, min(args.budget, int(rng.uniform(0.5, 1.5) * mean)))

    contexts, out = [], []
    for i in range(args.groups):
        expansion = i % 9 >= 4  # 4 line-2 groups to 5 expansions
        contexts.append(ids(args.prompt) + (ids(answer(args.answer / 2)) if expansion else []))
        mean = args.answer / 2 if expansion else args.answer
        out.append([Completion(c, [-1.0] * len(c), [float("nan")] * len(c), True)
                    for c in (ids(answer(mean)) for _ in range(args.group))])
    return contexts, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=36)
    p.add_argument("--group", type=int, default=4, help="G")
    p.add_argument("--prompt", type=int, default=140)
    p.add_argument("--answer", type=int, default=317)
    p.add_argument("--budget", type=int, default=512)
    p.add_argument("--tokens", type=int, default=32768, help="micro_batch_tokens")
    p.add_argument("--bucket", type=int, default=2048, help="attention_bucket")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM

    from bfspo.pipeline.shapes import config_path

    with tempfile.TemporaryDirectory() as tmp:
        config = json.loads(config_path("Qwen/Qwen2.5-3B-Instruct").read_text()) | {
            "hidden_size": args.hidden, "intermediate_size": 4 * args.hidden, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": args.layers, "vocab_size": 4096}
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp), dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()  # the config says bfloat16
    contexts, completions = groups(args, 4096)
    rescoring = RescoredEngine(None, model, micro_batch_tokens=args.tokens, attention="flex", bucket=args.bucket)
    results = {}
    for layout, calls in (("a row per group", [([c], [g]) for c, g in zip(contexts, completions)]),
                          ("shared rows", [(contexts, completions)])):
        for _ in range(2):  # the first run compiles flex's forward for each row length
            done = [(cs, copy.deepcopy(gs)) for cs, gs in calls]
            rescoring.pop_stats()
            t0 = time.perf_counter()
            for cs, gs in done:
                rescoring.rescore(cs, gs)
            seconds = time.perf_counter() - t0
        results[layout] = ([c for _, gs in done for g in gs for c in g], rescoring.pop_stats(), seconds)
    reference = results["a row per group"][0]
    rows = []
    for layout, (comps, stats, seconds) in results.items():
        dlp = max(abs(a - b) for x, y in zip(comps, reference) for a, b in zip(x.logprobs, y.logprobs))
        dent = max(abs(a - b) for x, y in zip(comps, reference) for a, b in zip(x.entropies[1:], y.entropies[1:]))
        rows.append([layout, stats["rows"], stats["tokens"], stats["row_tokens"],
                     stats["row_tokens"] / stats["tokens"], seconds, dlp, dent])
    print_table(f"rescoring {args.groups} groups of G = {args.group} (paper.yaml's 3B BFS-PO shapes), rows of at most "
                f"{args.tokens}, buckets of {args.bucket}, flex; {args.layers} layers of {args.hidden}",
                ["layout", "rows", "tokens", "tokens with padding", "padded / tokens", "s (compiled)",
                 "max |d log-prob|", "max |d entropy|"], rows)


if __name__ == "__main__":
    main()
