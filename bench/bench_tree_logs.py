"""The size of a paper run's tree logs (trees/step_*.jsonl, `log_trees`), from measured bytes per tree.

One paper-shaped tree per setting is built with the real SearchTree and serialised as the trainer
writes it (SearchTree.to_dict with per-token text): G answers of about half the budget, then K
expansions of G answers each from a backtracking token halfway down a path. Token ids are drawn
from Qwen2.5's vocabulary range, log-probs and entropies are float32 values (as the engines return
them), and token texts have the length of Qwen2.5's English tokens (about 4 characters). A step
writes `log_trees` trees (all of them for -1); with every tree logged a step writes the trees of at
least the first generation round, oversample x the batch's chains / G (K + 1) questions.

    python -m bench.bench_tree_logs [--steps 100] [--log-trees 8]
"""

from __future__ import annotations

import argparse
import json
import math
import random

import numpy as np

from bench.common import print_table
from bfspo.algorithm.tree import SearchTree

VOCAB = 151936
# (train set, budget) x (method, K, G) of config/paper.yaml: DAPO G = 16, BFS-PO G = 4, 8192 chains a
# batch, oversample 3
SETTINGS = [("gsm8k", 512, "dapo", 0, 16), ("gsm8k", 512, "bfspo", 3, 4), ("math", 1024, "dapo", 0, 16),
            ("math", 1024, "bfspo", 3, 4)]
CHAINS, OVERSAMPLE = 512 * 16, 3.0


def completion(rng: random.Random, n: int) -> tuple[list[int], list[float], list[float], list[str]]:
    ids = [rng.randrange(VOCAB) for _ in range(n)]
    logprobs = [float(np.float32(-rng.expovariate(3.0))) for _ in range(n)]
    entropies = [float(np.float32(rng.expovariate(1.5))) for _ in range(n)]
    texts = [(" " if rng.random() < 0.5 else "") + "".join(rng.choice("etaoinshrdlu0123456789=+")
                                                            for _ in range(rng.randint(1, 6))) for _ in range(n)]
    return ids, logprobs, entropies, texts


def paper_tree(budget: int, k: int, g: int, seed: int = 0) -> tuple[SearchTree, dict[int, list[str]]]:
    """A tree of g first answers of about budget / 2 tokens and k expansions of g answers, with texts."""
    rng = random.Random(seed)
    tree, texts = SearchTree(prompt_ids=list(range(120)), budget=budget), {}

    def add(parent, start: int, iteration: int) -> None:
        n = max(1, min(budget - start + 1, int(rng.gauss(budget / 2, budget / 8)) - start + 1))
        ids, logprobs, entropies, text = completion(rng, n)
        seg = tree.add_completion(parent, ids, logprobs, entropies, finished=True, iteration=iteration)
        texts[seg] = text

    for _ in range(g):
        add(None, 1, 0)
    for iteration in range(1, k + 1):
        leaf = rng.choice(tree.leaves())
        seg = tree.segments[leaf]
        if len(seg.token_ids) < 2:
            continue
        offset = len(seg.token_ids) // 2
        upper = tree.split(leaf, offset)
        texts[upper], texts[leaf] = texts[leaf][:offset + 1], texts[leaf][offset + 1:]
        tree.segments[upper].ends_in_B = True
        for _ in range(g):
            add(upper, tree.segments[upper].end + 1, iteration)
    return tree, texts


def tree_bytes(budget: int, k: int, g: int) -> tuple[int, int]:
    """(bytes of one JSONL line, unique tokens) of a paper-shaped tree logged with its token text."""
    tree, texts = paper_tree(budget, k, g)
    text_of = {i: t for seg in tree.segments for i, t in zip(seg.token_ids, texts[seg.id])}
    line = json.dumps(tree.to_dict(decode=lambda ids: [text_of[i] for i in ids])) + "\n"
    return len(line.encode()), tree.n_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps of a run (TrainConfig default)")
    parser.add_argument("--log-trees", type=int, default=8, help="trees written per step")
    args = parser.parse_args()
    rows = []
    for train_set, budget, method, k, g in SETTINGS:
        size, tokens = tree_bytes(budget, k, g)
        trees = math.ceil(OVERSAMPLE * CHAINS / (g * (k + 1)))
        rows.append([train_set, method, tokens, f"{size / tokens:.1f}", f"{size / 2**20:.2f}", trees,
                     f"{trees * size * args.steps / 2**30:.1f}", f"{args.log_trees * size * args.steps / 2**30:.2f}"])
    print_table("Tree logs of config/paper.yaml's runs", ["train set", "method", "tokens/tree", "bytes/token", "MiB/tree", "trees/step (>=)",
                 f"GiB/run, all trees ({args.steps} steps)", f"GiB/run, log_trees {args.log_trees}"], rows)


if __name__ == "__main__":
    main()
