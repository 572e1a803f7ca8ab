"""Tree-packed training step against flat chains and the ceiling (issue 8, goal 3).

Layout: T trees, each a shared prefix of S tokens followed by B branches of L tokens (the
issue's layout is 4 trees x (256 shared + 4 x 256)). Three ways to compute every chain token's
log-prob, forward + backward:
  flat     one row per chain (prompt + prefix + branch), what DAPO computes;
  tree     bfspo.algorithm.packing: one row per tree, shared prefix computed once, tree attention mask;
  ceiling  one ordinary causal row per tree holding the same number of unique tokens.
Correctness is checked before timing: packed log-probs equal the flat ones.

    python bench/bench_packing.py --shape cpu --trees 2 --shared 64 --branches 4 --length 64
    python bench/bench_packing.py --shape 0.5b        # on a GPU: the issue's layout
"""

from __future__ import annotations

import argparse

import torch

from bench.common import device_and_dtype, print_table, random_model, timed
from bfspo.algorithm.packing import pack_trees, packed_logprobs
from bfspo.algorithm.tree import SearchTree


def make_tree(prompt: list[int], shared: int, branches: int, length: int, vocab: int, gen: torch.Generator) -> SearchTree:
    """A tree whose root child runs `shared` tokens, then splits into `branches` branches of `length`."""
    def toks(n):
        return torch.randint(5, vocab, (n,), generator=gen).tolist()

    tree = SearchTree(prompt_ids=prompt, budget=shared + length)
    first = tree.add_completion(None, toks(shared + length), [0.0] * (shared + length), [1.0] * (shared + length), True, 0)
    b = tree.split(first, shared - 1)
    tree.segments[b].ends_in_B = True
    for _ in range(branches - 1):
        tree.add_completion(b, toks(length), [0.0] * length, [1.0] * length, True, 1)
    for s in tree.segments:
        s.advantage = 1.0
    tree.advantage_kind = "branch"
    return tree


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="cpu")
    p.add_argument("--trees", type=int, default=4)
    p.add_argument("--shared", type=int, default=256)
    p.add_argument("--branches", type=int, default=4)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    device, _ = device_and_dtype()
    model = random_model(args.shape)
    model.train()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, vocab, (args.prompt,), generator=gen).tolist()
    trees = [make_tree(prompt, args.shared, args.branches, args.length, vocab, gen) for _ in range(args.trees)]
    packed = pack_trees(trees, "tree").to(device)
    flat = pack_trees(trees, "flat").to(device)
    unique = sum(t.n_tokens for t in trees)
    chain_tokens = sum(t.n_chain_tokens for t in trees)

    with torch.no_grad():
        a, _ = packed_logprobs(model, packed)
        b, _ = packed_logprobs(model, flat)
    err = (a.float() - b.float()).abs().max().item()
    tol = 1e-4 if a.dtype == torch.float32 and device.type == "cpu" else 5e-2
    assert err < tol, f"packed and flat log-probs differ by {err}"

    def step(pk):
        def run():
            logp, _ = packed_logprobs(model, pk)
            logp.sum().backward()
            model.zero_grad(set_to_none=True)
        return run

    ceiling_ids = torch.randint(5, vocab, (args.trees, args.prompt + unique // args.trees), generator=gen).to(device)

    def ceiling():
        out = model(input_ids=ceiling_ids, use_cache=False)
        out.logits.float().log_softmax(-1).mean().backward()
        model.zero_grad(set_to_none=True)

    t_flat, t_tree, t_ceil = (timed(f, args.repeats) for f in (step(flat), step(packed), ceiling))
    print_table(f"fwd+bwd, {args.shape} shape: {args.trees} trees x ({args.shared} shared + {args.branches} x {args.length})",
                ["layout", "tokens", "ms", "speed-up vs flat"],
                [["flat (one row per chain)", chain_tokens, t_flat * 1e3, 1.0],
                 ["tree-packed (bfspo.algorithm.packing)", unique, t_tree * 1e3, t_flat / t_tree],
                 ["ceiling (causal, unique tokens)", unique, t_ceil * 1e3, t_flat / t_ceil]])
    print(f"\nmax |packed - flat| log-prob: {err:.2e}; token ratio {chain_tokens / unique:.2f}")


if __name__ == "__main__":
    main()
