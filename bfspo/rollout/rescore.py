"""Training-side log-probs and entropies for engines that return only top-k log-probs (vLLM).

Backtracking (Eq. 6-7) needs the entropy of the FULL next-token distribution after every token,
which vLLM does not return, and the PPO ratio of Eq. 10 needs log pi_old as the trainer computes
it (docs/algorithm.md, "Old log-probs"). `RescoredEngine` wraps such an engine: after each
`generate` (or, for a streamed rollout, as groups of samples finish: `rescore`) it runs no-grad,
tree-packed forwards of the training model (eval mode: no dropout; its own dtype) and replaces the
log-probs and entropies with the training model's values. These are the old log-probs the update
uses: one training-side forward gives both, and no pass recomputes them. The first step's entropy
(the distribution at the context's end) is left NaN: the search tree only keeps the entropy AFTER
each generated token (bfspo.algorithm.tree).

Rows: each context with its n continuations is one tree (the context computed once), and the
trees share rows as the update's trees do (bfspo.algorithm.packing.plan_micro_batches: whole trees,
first fit in order, at most `micro_batch_tokens` row tokens; a longer group is cut into pieces),
through the update's tree attention. The compiled flex kernel pads each row to its bucket length,
so the padding is at most one bucket per row, not one per context (issue 38). A context's numbers
then depend on its row's other contexts in their last bits only (float rounding of other shapes:
tests/test_rescore.py compares with one row per context to 1e-5). So a streamed rollout rescores
finished groups together only where the rows are padded (`pads_rows`), and each alone elsewhere
(bfspo.rollout.streamed).

It keeps, until `pop_stats`, the gap |engine log-prob - trainer log-prob| over the rescored
tokens, the seconds spent rescoring, and the rows' tokens with and without their padding.
"""

from __future__ import annotations

import math
import time

import numpy as np

from bfspo.algorithm.attention_options import BUCKET_TOKENS, padded_length
from bfspo.algorithm.packing import pack_trees, packed_logprobs, plan_micro_batches, row_buckets
from bfspo.algorithm.tree import SearchTree
from bfspo.algorithm.tree_attention import flex_errors
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
        return {"gap_sum": 0.0, "gap_max": 0.0, "gap_count": 0, "seconds": 0.0, "rows": 0, "tokens": 0,
                "row_tokens": 0}

    def pop_stats(self) -> dict:
        """Since the last call: gap_sum, gap_max and gap_count of |engine - trainer| over the rescored
        tokens (tokens whose engine log-prob is NaN are left out), the seconds spent rescoring, and
        the forwards' rows: their count, their tokens (contexts and samples) and their tokens with
        the padding to their bucket lengths (`row_tokens`)."""
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
        self.rescore(contexts, out)
        return out

    def rescore(self, contexts, groups) -> None:
        """Give each context's completions (`groups[i]` of `contexts[i]`) the training model's log-probs
        and entropies, the contexts packed into shared rows (the module doc)."""
        t0 = time.perf_counter()
        trees, reals = [], []
        for context, completions in zip(contexts, groups, strict=True):
            real = [c for c in completions if c.token_ids]
            if real:
                tree = SearchTree(prompt_ids=list(context), budget=max(len(c.token_ids) for c in real))
                for c in real:
                    tree.add_completion(None, c.token_ids, c.logprobs, [NAN] * len(c.token_ids), c.finished, 0)
                trees.append(tree)
                reals.append(real)
        if trees:
            self._rescore(trees, reals)
        self._stats["seconds"] += time.perf_counter() - t0

    def _buckets(self) -> tuple[int, ...]:
        """The lengths its rows are padded to (`row_buckets`): none but for the compiled flex kernel."""
        device = next(self.model.parameters()).device
        return row_buckets(self.attention, device, self.micro_batch_tokens, self.bucket)

    @property
    def pads_rows(self) -> bool:
        """Whether its rows are padded to bucket lengths (the compiled flex kernel, on CUDA): only then
        do contexts rescored together save padding (a bucket's at most per row, where a row per
        context pads each). Otherwise a context rescored alone costs its own tokens, and its numbers
        depend on it alone (bfspo.rollout.streamed)."""
        return bool(self._buckets())

    def _rescore(self, trees: list[SearchTree], groups: list[list]) -> None:
        device = next(self.model.parameters()).device
        buckets = self._buckets()
        logprobs = [np.empty(t.n_tokens) for t in trees]
        entropies = [np.empty(t.n_tokens) for t in trees]
        # a compiler failure names the way out (`tree_attention: blockwise`), as in the update
        with rollout_mode(self.model), flex_errors():
            for pieces in plan_micro_batches(trees, self.micro_batch_tokens):
                packed = pack_trees(trees, pieces=pieces)
                tokens = packed.n_row_tokens
                self._stats["rows"] += 1
                self._stats["tokens"] += tokens
                self._stats["row_tokens"] += padded_length(tokens, buckets) if buckets else tokens
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
