"""Peak memory of one tree-packed forward + backward against the tokens: the dense [T, T] mask that
bfspo.algorithm.packing used to build, against the DFS-interval tree attention (issue 21).

Each measurement runs in a process of its own (peak RSS is per process): a random-weight model of
`--shape` (with `--layers` layers), one K = 0 tree of G chains of `--chain` tokens after a
`--prompt`-token prompt, G growing with the tokens, packed in one row; then the forward and backward
pass of `packed_logprobs` with attention="dense" (a bool [T, T] mask turned into an additive mask of
the model's dtype, what the previous packer fed to sdpa) or "blockwise" (the tree attention of a CPU
run). Printed: the peak RSS above the
RSS just before the step, in MiB, and its slope from the row above (MiB per 1k more tokens): linear
memory shows as a constant slope; the dense path adds the [T, T] masks, listed for comparison.

    python -m bench.bench_tree_attention --shape cpu --layers 2 --chains 1,2,4,8,16,32 --dense-max 8
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import torch

from bench.common import print_table, random_model
from bfspo.algorithm.packing import pack_trees, packed_logprobs
from bfspo.algorithm.tree import SearchTree


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one(args) -> dict:
    """Measure one (attention, chains) point in this process."""
    torch.manual_seed(0)
    model = random_model(args.shape)
    model.model.layers = model.model.layers[:args.layers]
    model.config.num_hidden_layers = args.layers
    model.train()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    tree = SearchTree(prompt_ids=torch.randint(5, vocab, (args.prompt,), generator=gen).tolist(), budget=args.chain)
    for _ in range(args.one_chains):
        ids = torch.randint(5, vocab, (args.chain,), generator=gen).tolist()
        tree.add_completion(None, ids, [0.0] * args.chain, [1.0] * args.chain, True, 0)
    for s in tree.segments:
        s.advantage = 1.0
    tree.advantage_kind = "branch"
    packed = pack_trees([tree])
    before, peak_before = rss_mib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    logprobs, _ = packed_logprobs(model, packed, attention=args.one_attention)
    logprobs.sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"tokens": packed.input_ids.shape[1], "step_mib": peak - before, "before_mib": before,
            "peak_before_mib": peak_before}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="cpu")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--prompt", type=int, default=150)
    p.add_argument("--chain", type=int, default=512)
    p.add_argument("--chains", default="1,2,4,8,16,32", help="G values: the tokens are prompt + G x chain")
    p.add_argument("--dense-max", type=int, default=8, help="largest G measured with the dense mask")
    p.add_argument("--one-attention", help=argparse.SUPPRESS)
    p.add_argument("--one-chains", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_attention:
        print(json.dumps(one(args)))
        return
    rows, previous = [], None
    for g in map(int, args.chains.split(",")):
        row = {}
        for attention in ("dense", "blockwise"):
            if attention == "dense" and g > args.dense_max:
                row[attention] = None
                continue
            cmd = [sys.executable, "-m", "bench.bench_tree_attention", "--shape", args.shape, "--layers",
                   str(args.layers), "--prompt", str(args.prompt), "--chain", str(args.chain),
                   "--one-attention", attention, "--one-chains", str(g)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            row[attention] = json.loads(out.strip().splitlines()[-1])
        tokens = row["blockwise"]["tokens"]
        cells = [tokens]
        for attention in ("dense", "blockwise"):
            r, p = row[attention], None if previous is None else previous[attention]
            cells.append("-" if r is None else r["step_mib"])
            slope = "-" if r is None or p is None else (r["step_mib"] - p["step_mib"]) / (tokens - previous["tokens"]) * 1024
            cells.append(slope)
        cells.append(tokens ** 2 * (1 + torch.finfo(torch.float32).bits // 8) / 2**20)
        rows.append(cells)
        previous = row | {"tokens": tokens}
    print_table(f"peak RSS above the RSS before one forward + backward, {args.shape} shape with {args.layers} "
                f"layers, one tree of G chains of {args.chain} tokens after {args.prompt}",
                ["tokens", "dense mask MiB", "dense slope MiB / 1k tokens", "tree attention MiB",
                 "tree slope MiB / 1k tokens", "[T, T] bool + float32 masks MiB"], rows)

if __name__ == "__main__":
    main()
