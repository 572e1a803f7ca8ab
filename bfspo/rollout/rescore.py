"""Training-side log-probs and entropies for engines that return only top-k log-probs (vLLM).

Backtracking (Eq. 6-7) needs the entropy of the FULL next-token distribution after every token,
which vLLM does not return. `RescoredEngine` wraps such an engine: after each `generate` it runs
one no-grad, tree-packed forward of the training model over each context and its n continuations
(the context is computed once, bfspo.algorithm.packing) and replaces the log-probs and entropies with the
training model's values. The first step's entropy (the distribution at the context's end) is left
NaN: the search tree only keeps the entropy AFTER each generated token (bfspo.algorithm.tree).
"""

from __future__ import annotations

import torch

from bfspo.algorithm.packing import pack_trees, packed_logprobs
from bfspo.algorithm.tree import SearchTree

NAN = float("nan")


class RescoredEngine:
    """A RolloutEngine whose completions carry the training model's log-probs and entropies."""

    def __init__(self, engine, model, contexts_per_forward: int = 8):
        self.engine, self.model, self.contexts_per_forward = engine, model, contexts_per_forward

    def sync_weights(self, model) -> None:
        self.model = model
        self.engine.sync_weights(model)

    def generate(self, contexts, n, max_new_tokens, **kw):
        out = self.engine.generate(contexts, n, max_new_tokens, **kw)
        device = next(self.model.parameters()).device
        for start in range(0, len(contexts), self.contexts_per_forward):
            trees, owners = [], []
            for ctx, comps in zip(contexts[start:start + self.contexts_per_forward],
                                  out[start:start + self.contexts_per_forward]):
                real = [c for c in comps if c.token_ids]
                if not real:
                    continue
                tree = SearchTree(prompt_ids=list(ctx), budget=max(len(c.token_ids) for c in real))
                for c in real:
                    tree.add_completion(None, c.token_ids, c.logprobs, [NAN] * len(c.token_ids), c.finished, 0)
                trees.append(tree)
                owners.extend(real)
            if not trees:
                continue
            with torch.no_grad():
                logp, ent = packed_logprobs(self.model, pack_trees(trees).to(device))
            logp, ent, pos = logp.tolist(), ent.tolist(), 0
            for c in owners:  # entries are the trees' tokens in depth-first order: completion by completion
                k = len(c.token_ids)
                c.logprobs, c.entropies = logp[pos:pos + k], [NAN] + ent[pos:pos + k - 1]
                pos += k
        return out
