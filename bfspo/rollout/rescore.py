"""Training-side log-probs and entropies for engines that return only top-k log-probs (vLLM).

Backtracking (Eq. 6-7) needs the entropy of the FULL next-token distribution after every token,
which vLLM does not return, and the PPO ratio of Eq. 10 needs log pi_old as the trainer computes
it (docs/algorithm.md, "Old log-probs"). `RescoredEngine` wraps such an engine: after each
`generate` (or, for a streamed rollout, as each context's samples finish: `rescore`) it runs
no-grad, tree-packed forwards of the training model (eval mode: no dropout; its own dtype) over
each context and its n continuations (the context is computed once, bfspo.algorithm.packing),
one context at a time (a micro-batch's other rows would change the last bits of its numbers), in
micro-batches of at most `micro_batch_tokens` row tokens, through the update's tree attention (and,
for flex, its bucket lengths), and replaces the log-probs and entropies with the training model's values. These are the old
log-probs the update uses: one training-side forward gives both, and no pass recomputes them.
The first step's entropy (the distribution at the context's end) is left NaN: the search tree
only keeps the entropy AFTER each generated token (bfspo.algorithm.tree).

It keeps, until `pop_stats`, the gap |engine log-prob - trainer log-prob| over the rescored
tokens and the seconds spent rescoring.
"""

from __future__ import annotations

import math
import time

import numpy as np

from bfspo.algorithm.attention_options import BUCKET_TOKENS
from bfspo.algorithm.packing import pack_trees, packed_logprobs, plan_micro_batches, row_buckets
from bfspo.algorithm.tree import SearchTree
from bfspo.rollout.hf_engine import rollout_mode

NAN = float("nan")


class RescoredEngine:
    """A RolloutEngine whose completions carry the training model's log-probs and entropies."""

    def __init__(self, engine, model, micro_batch_tokens: int, attention: str = "auto", bucket: int = BUCKET_TOKENS):
        self.engine, self.model, self.micro_batch_tokens = engine, model, micro_batch_tokens
        self.attention, self.bucket = attention, bucket  # as the update's (bfspo.training.accumulate)
        self._stats = self._empty_stats()

    @staticmethod
    def _empty_stats() -> dict:
        return {"gap_sum": 0.0, "gap_max": 0.0, "gap_count": 0, "seconds": 0.0}

    def pop_stats(self) -> dict:
        """Since the last call: gap_sum, gap_max and gap_count of |engine - trainer| over the rescored
        tokens (tokens whose engine log-prob is NaN are left out), and the seconds spent rescoring."""
        stats, self._stats = self._stats, self._empty_stats()
        return stats

    def sync_weights(self, model) -> None:
        self.model = model
        self.engine.sync_weights(model)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def pop_occupancy(self) -> dict:
        return self.engine.pop_occupancy()

    def generate(self, contexts, n, max_new_tokens, **kw):
        out = self.engine.generate(contexts, n, max_new_tokens, **kw)
        for ctx, comps in zip(contexts, out):
            self.rescore(ctx, comps)
        return out

    def rescore(self, context, completions) -> None:
        """Give one context's completions the training model's log-probs and entropies, in forwards
        of their own: no other context shares them, so their numbers do not depend on which
        contexts were sampled with them (the lockstep and the streamed rollouts give the same)."""
        t0 = time.perf_counter()
        real = [c for c in completions if c.token_ids]
        if real:
            tree = SearchTree(prompt_ids=list(context), budget=max(len(c.token_ids) for c in real))
            for c in real:
                tree.add_completion(None, c.token_ids, c.logprobs, [NAN] * len(c.token_ids), c.finished, 0)
            self._rescore([tree], [real])
        self._stats["seconds"] += time.perf_counter() - t0

    def _rescore(self, trees: list[SearchTree], groups: list[list]) -> None:
        device = next(self.model.parameters()).device
        buckets = row_buckets(self.attention, device, self.micro_batch_tokens, self.bucket)
        logprobs = [np.empty(t.n_tokens) for t in trees]
        entropies = [np.empty(t.n_tokens) for t in trees]
        with rollout_mode(self.model):
            for pieces in plan_micro_batches(trees, self.micro_batch_tokens):
                packed = pack_trees(trees, pieces=pieces)
                lp, ent = packed_logprobs(self.model, packed.to(device), attention=self.attention, buckets=buckets)
                lp, ent = lp.cpu().numpy(), ent.cpu().numpy()
                where, token = packed.tree_index.numpy(), packed.token_index.numpy()
                for t in np.unique(where):
                    mine = where == t
                    logprobs[t][token[mine]] = lp[mine]
                    entropies[t][token[mine]] = ent[mine]
        for comps, lp, ent in zip(groups, logprobs, entropies):
            pos = 0  # a tree's depth-first order is its completions one after the other
            for c in comps:
                k = len(c.token_ids)
                gap = [abs(a - b) for a, b in zip(c.logprobs, lp[pos:pos + k]) if not math.isnan(a)]
                self._stats["gap_sum"] += sum(gap)
                self._stats["gap_max"] = max([self._stats["gap_max"], *gap])
                self._stats["gap_count"] += len(gap)
                c.logprobs, c.entropies = lp[pos:pos + k].tolist(), [NAN] + ent[pos:pos + k - 1].tolist()
                pos += k
