"""Tree-packed training step against flat chains and the ceiling (issue 8, goal 3), and the packer's
own speed on paper-shaped mini-batches (issue 21).

Layout: T trees, each a shared prefix of S tokens followed by B branches of L tokens (the
issue's layout is 4 trees x (256 shared + 4 x 256)). Three ways to compute every chain token's
log-prob, forward + backward:
  flat     one row per chain (prompt + prefix + branch), what DAPO computes;
  tree     bfspo.algorithm.packing: one row per tree, shared prefix computed once, tree attention;
  ceiling  one ordinary causal row per tree holding the same number of unique tokens.
Correctness is checked before timing: packed log-probs equal the flat ones. The three are timed
in interleaved rounds (one of each per round: shared cores slow them alike), and the tree layout's
share of the ceiling is the median over rounds of ceiling / tree-packed time.

    python bench/bench_packing.py --shape cpu --trees 2 --shared 64 --branches 4 --length 64
    python bench/bench_packing.py --shape 0.5b        # on a GPU: the issue's layout

`--parts` also times, alone, what the tree-packed step computes differently from the ceiling: one
layer's tree attention and the chunked output head, each against its ceiling's way.

`--packer` times the packing alone on one paper-shaped mini-batch (`--prompts` questions of G =
`--group` answers, budget `--budget`, `--prompt-len`-token prompts, chains of budget/4 to the
budget; K = 0 groups, and K = 3 trees holding the same chains): the previous packer (a Python loop
per position and a [rows, L, L] mask, frozen in tests/helpers/previous_packing.py, which also checks
that both give the same rows) against `pack_trees` on the whole mini-batch, and against the
trainer's lazy path, `plan_micro_batches` at `--micro-batch-tokens` then one `pack_trees` per
micro-batch, one at a time. Memory: the bytes of the packed tensors one pack holds.

    python -m bench.bench_packing --packer --prompts 32 --group 16 --budget 512 --prompt-len 150
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch

from bench.common import device_and_dtype, print_table, random_model, timed, timed_rounds
from bfspo.algorithm.packing import pack_trees, packed_logprobs, plan_micro_batches
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


def paper_tree(rng: random.Random, prompt: list[int], group: int, k: int, budget: int, vocab: int) -> SearchTree:
    """G chains of budget/4 to budget tokens, then K expansions of G continuations at a random
    token of a random path (each continuation as long as the budget allows, at least a quarter of it)."""
    tree = SearchTree(prompt_ids=prompt, budget=budget)

    def add(parent, depth):
        n = rng.randint(max(1, (budget - depth) // 4), budget - depth)
        tree.add_completion(parent, [rng.randrange(5, vocab) for _ in range(n)], [-1.0] * n, [1.0] * n, True, 0)

    for _ in range(group):
        add(None, 0)
    for _ in range(k):
        leaf = rng.choice(tree.leaves())
        depth = rng.randint(1, tree.segments[leaf].leaf.length - 1)
        seg = next(s for s in tree.path(leaf) if tree.segments[s].end >= depth)
        offset = depth - tree.segments[seg].start
        wb = seg if offset == len(tree.segments[seg].token_ids) - 1 else tree.split(seg, offset)
        tree.segments[wb].ends_in_B = True
        for _ in range(group):
            add(wb, depth)
    for s in tree.segments:
        s.advantage = 1.0
    tree.advantage_kind = "branch"
    return tree


def packed_bytes(pack) -> int:
    return sum(v.numel() * v.element_size() for v in vars(pack).values() if isinstance(v, torch.Tensor))


def packer(args) -> None:
    from tests.helpers.previous_packing import previous_pack_trees

    rows = []
    for k in (0, 3):
        rng = random.Random(k)
        n_trees = max(1, args.prompts // (k + 1))  # the same chains: a K = 3 tree holds G (K + 1)
        trees = [paper_tree(rng, [rng.randrange(5, 1000) for _ in range(args.prompt_len)], args.group, k,
                            args.budget, 151936) for _ in range(n_trees)]
        chains = sum(len(t.leaves()) for t in trees)
        unique = sum(len(t.prompt_ids) + t.n_tokens for t in trees)

        def lazy():
            return max(packed_bytes(pack_trees(trees, pieces=pieces))
                       for pieces in plan_micro_batches(trees, args.micro_batch_tokens))

        old_s = timed(lambda: previous_pack_trees(trees), repeats=1, warmup=0)
        old = previous_pack_trees(trees)
        new_s = timed(lambda: pack_trees(trees), repeats=args.repeats, warmup=1)
        lazy_s = timed(lazy, repeats=args.repeats, warmup=1)
        n_micro = len(plan_micro_batches(trees, args.micro_batch_tokens))
        old_mib = sum(v.numel() * v.element_size() for v in vars(old).values() if isinstance(v, torch.Tensor)) / 2**20
        rows.append([f"K={k}: {n_trees} trees, {chains} chains", f"{old.input_ids.numel():,} / {unique:,}",
                     old_s, old_mib, new_s, packed_bytes(pack_trees(trees)) / 2**20, old_s / new_s,
                     f"{lazy_s:.3g} ({n_micro})", lazy() / 2**20])
    print_table(f"packing one mini-batch: {args.prompts} prompts x G={args.group}, budget {args.budget}, "
                f"{args.prompt_len}-token prompts",
                ["mini-batch", "tokens (previous, padded / now)", "previous s", "previous MiB", "pack_trees s",
                 "pack_trees MiB", "speed-up", f"lazy s (micro-batches of {args.micro_batch_tokens})",
                 "lazy MiB held"], rows)


def parts(args, model, packed) -> None:
    """The two parts of the tree-packed step that the ceiling does differently, each against its
    ceiling, fwd+bwd, in interleaved rounds: one layer's tree attention (BlockPlan built once per model
    call, as `tree_kwargs` does, or per layer) against causal sdpa over one row per tree of the same
    tokens; the output head in chunks (`_LinearHeadChunk`, or activation checkpointing, what a
    non-linear head runs) against log-softmax over every row at once, as the ceiling computes it."""
    from torch.utils.checkpoint import checkpoint

    from bfspo.algorithm.packing import _head_chunk, _head_chunk_with_grad
    from bfspo.algorithm.tree_attention import BlockPlan, blockwise_attention

    cfg, gen = model.config, torch.Generator().manual_seed(1)
    t, d = packed.input_ids.shape[1], cfg.hidden_size // cfg.num_attention_heads

    def leaf(*shape):
        return torch.randn(*shape, generator=gen).requires_grad_()

    q, k, v = leaf(1, cfg.num_attention_heads, t, d), leaf(1, cfg.num_key_value_heads, t, d), leaf(1, cfg.num_key_value_heads, t, d)
    rows = [leaf(args.trees, h, t // args.trees, d) for h in (cfg.num_attention_heads, cfg.num_key_value_heads,
                                                             cfg.num_key_value_heads)]
    plan = BlockPlan(packed.ends)
    head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    hidden = leaf(packed.positions.numel(), cfg.hidden_size)
    chunks = [(c, packed.parent[(packed.parent >= c) & (packed.parent < c + 1024)] - c,
               packed.targets[(packed.parent >= c) & (packed.parent < c + 1024)]) for c in range(0, hidden.shape[0], 1024)]

    def head_run(fn):
        def run():
            for c, r, tg in chunks:
                lse, _, target = fn(head, hidden[c:c + 1024], r, tg)
                (target.sum() - lse.sum()).backward()
        return run

    fns = {"attention: blockwise, plan once per call": lambda: blockwise_attention(q, k, v, packed.ends, d ** -0.5, plan=plan).sum().backward(),
           "attention: blockwise, plan per layer": lambda: blockwise_attention(q, k, v, packed.ends, d ** -0.5).sum().backward(),
           "attention ceiling: causal sdpa, one row per tree": lambda: torch.nn.functional.scaled_dot_product_attention(
               *rows, is_causal=True, enable_gqa=True).sum().backward(),
           "head: linear head chunk": head_run(_head_chunk_with_grad),
           "head: checkpointed chunk": head_run(lambda *a: checkpoint(_head_chunk, *a, use_reentrant=False)),
           "head ceiling: log-softmax of all rows": lambda: head(hidden).float().log_softmax(-1).mean().backward()}
    times = timed_rounds(list(fns.values()), args.repeats)
    print_table(f"parts, fwd+bwd, {args.shape} shape, one row of {t} tokens", ["part", "ms"],
                [[name, statistics.median(ts) * 1e3] for name, ts in zip(fns, times)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--packer", action="store_true", help="time the packer on a paper-shaped mini-batch")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group", type=int, default=16)
    p.add_argument("--budget", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=150)
    p.add_argument("--micro-batch-tokens", type=int, default=16384)
    p.add_argument("--shape", default="cpu")
    p.add_argument("--trees", type=int, default=4)
    p.add_argument("--shared", type=int, default=256)
    p.add_argument("--branches", type=int, default=4)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--parts", action="store_true", help="also time the attention and the output head alone")
    args = p.parse_args()
    if args.packer:
        packer(args)
        return
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

    rounds = timed_rounds([step(flat), step(packed), ceiling], args.repeats)
    t_flat, t_tree, t_ceil = (statistics.median(t) for t in rounds)
    shares = sorted(c / t for t, c in zip(rounds[1], rounds[2]))
    print_table(f"fwd+bwd, {args.shape} shape: {args.trees} trees x ({args.shared} shared + {args.branches} x {args.length})",
                ["layout", "tokens", "ms", "speed-up vs flat"],
                [["flat (one row per chain)", chain_tokens, t_flat * 1e3, 1.0],
                 ["tree-packed (bfspo.algorithm.packing)", unique, t_tree * 1e3, t_flat / t_tree],
                 ["ceiling (causal, unique tokens)", unique, t_ceil * 1e3, t_flat / t_ceil]])
    if args.parts:
        parts(args, model, packed)
    print(f"\nmax |packed - flat| log-prob: {err:.2e}; token ratio {chain_tokens / unique:.2f}; tree-packed at "
          f"{statistics.median(shares):.0%} of the ceiling (median over {args.repeats} interleaved rounds of "
          f"ceiling ms / tree-packed ms; range {shares[0]:.0%}-{shares[-1]:.0%})")


if __name__ == "__main__":
    main()
