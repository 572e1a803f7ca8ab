"""Random search trees shaped like Algorithm 1's (an initial group of G, then K expansions of G
children at a token of some path), for the packing, attention and micro-batch tests."""

from __future__ import annotations

import random

from bfspo.algorithm.advantages import assign_advantages, assign_rewards
from bfspo.algorithm.tree import SearchTree


def random_search_tree(seed: int, *, prompt_len: int, vocab: int, group: int = 3, k: int = 3, max_len: int = 12,
                       advantage: str | None = "branch") -> SearchTree:
    """G root children of random lengths, then K expansions, each at a random non-final token of a
    random path, with G children; leaves correct at random, random log-probs and entropies, and
    advantages of the given kind (None: left unset)."""
    rng = random.Random(seed)
    tree = SearchTree(prompt_ids=[rng.randrange(vocab) for _ in range(prompt_len)], budget=(k + 1) * max_len)

    def add(parent):
        n = rng.randint(1, max_len)
        s = tree.add_completion(parent, [rng.randrange(vocab) for _ in range(n)], [-rng.random() * 3 for _ in range(n)],
                                [rng.random() for _ in range(n)], True, 0 if parent is None else 1)
        tree.segments[s].leaf.correct = rng.random() < 0.5

    for _ in range(group):
        add(None)
    for _ in range(k):
        leaf = rng.choice(tree.leaves())
        path = [(s, j) for s in tree.path(leaf) for j in range(len(tree.segments[s].token_ids))]
        options = [(s, j) for s, j in path if j < len(tree.segments[s].token_ids) - 1 or tree.segments[s].ends_in_B]
        if not options:
            continue
        s, j = rng.choice(options)
        wb = s if j == len(tree.segments[s].token_ids) - 1 else tree.split(s, j)
        tree.segments[wb].ends_in_B = True
        for _ in range(group):
            add(wb)
    if advantage is not None:
        assign_rewards(tree, overlong=False)
        assign_advantages(tree, advantage)
    return tree


def load_float32_model(model_dir):
    """A saved model in float32 with sdpa attention and every parameter trainable, in eval mode (no dropout)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()


def with_old_logprobs(model, trees, noise: float = 0.5, seed: int = 0):
    """Set each tree token's old log-prob to the model's own plus uniform noise of width `noise`
    (so that some ratios clip), from one dense-reference packed forward."""
    import torch

    from bfspo.algorithm.packing import pack_trees, packed_logprobs

    packed = pack_trees(trees)
    with torch.no_grad():
        logprobs, _ = packed_logprobs(model, packed, attention="dense")
    gen = torch.Generator().manual_seed(seed)
    values = logprobs + (torch.rand(logprobs.shape, generator=gen) - 0.5) * noise
    by_token = dict(zip(zip(packed.tree_index.tolist(), packed.token_index.tolist()), values.tolist()))
    for t, tree in enumerate(trees):
        x = 0
        for s in tree.dfs():  # the depth-first token order
            seg = tree.segments[s]
            seg.logprobs = [by_token[(t, x + j)] for j in range(len(seg.token_ids))]
            x += len(seg.token_ids)
    return trees
