"""One mini-batch's gradient, accumulated over micro-batches of at most `micro_batch_tokens` row tokens.

Eq. 10 (and Eq. 2) is a token-mean over the whole mini-batch: -(1/N) sum_n min(r_n A_n, clip(...) A_n),
with N the mini-batch's entry count over ALL ranks. Each micro-batch's loss is its own sum divided
by that global N, so the gradients of the micro-batches (and of the ranks, summed by
bfspo.training.dist) add up to the gradient of the unsplit mini-batch: splitting changes the
memory, not the update. The micro-batches come from bfspo.algorithm.packing.plan_micro_batches
(whole trees, or pieces of a tree larger than the budget) and are packed one at a time, when
their turn comes.

Memory: one micro-batch at a time holds what bfspo.algorithm.packing's docstring lists for T <=
micro_batch_tokens row tokens (its activations are freed by its backward pass); across
micro-batches only the trainable parameters' .grad persists (one tensor per trainable parameter,
in its dtype), plus a few floats of statistics per micro-batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from bfspo.algorithm.attention_options import BUCKET_TOKENS
from bfspo.algorithm.loss import policy_loss
from bfspo.algorithm.packing import attention_mode, pack_trees, packed_logprobs, plan_micro_batches, row_buckets
from bfspo.algorithm.tree_attention import flex_errors


@dataclass
class Accumulated:
    """What `minibatch_backward` leaves besides the gradients (this rank's part of the mini-batch)."""

    loss: float = 0.0  # this rank's share of the mini-batch loss (the ranks' shares sum to it)
    stats: dict = field(default_factory=dict)  # policy_loss statistics over this rank's entries
    micro_batches: int = 0
    gap_sum: float = 0.0  # sum over this rank's unique tokens of |log pi_theta - log pi_old|
    gap_max: float = 0.0
    gap_count: int = 0


def merge_loss_stats(parts: Sequence[dict]) -> dict:
    """policy_loss statistics of several micro-batches as those of their union: fractions and means
    weighted by entries, the ratio's maximum, the entry count summed."""
    n = sum(p["n_tokens"] for p in parts)
    if n == 0:
        return {}
    out = {k: sum(p[k] * p["n_tokens"] for p in parts) / n
           for k in ("clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean", "approx_kl")}
    return out | {"ratio_max": max(p["ratio_max"] for p in parts), "n_tokens": n}


def minibatch_backward(model: torch.nn.Module, trees: Sequence, *, micro_batch_tokens: int, normalizer: float,
                       eps_low: float, eps_high: float, attention: str = "auto",
                       bucket: int = BUCKET_TOKENS) -> Accumulated:
    """Backward passes of this rank's trees of one mini-batch, one micro-batch at a time: the
    gradients accumulate in the parameters' .grad, each micro-batch's loss divided by `normalizer`
    (the mini-batch's entry count over all ranks). `attention` is the tree attention (TrainConfig
    `tree_attention`); for the flex kernel each row is padded to a multiple of `bucket` tokens
    (`row_buckets`). Also measures |log pi_theta - log pi_old| on the tokens
    (bfspo.training.trainer logs it as the rollout/trainer log-prob gap)."""
    out = Accumulated()
    if not trees:
        return out
    device = next(model.parameters()).device
    buckets = row_buckets(attention, device, micro_batch_tokens, bucket)
    parts = []
    for pieces in plan_micro_batches(trees, micro_batch_tokens):
        packed = pack_trees(trees, pieces=pieces).to(device)
        # The mode spans the backward pass: checkpointing recomputes the attention there, and the
        # compiled flex kernel's backward is compiled when it first runs.
        with attention_mode(model, attention), flex_errors():
            logprobs, _ = packed_logprobs(model, packed, attention=attention, buckets=buckets)
            loss, stats = policy_loss(logprobs, packed.old_logprobs, packed.advantages, eps_low=eps_low,
                                      eps_high=eps_high, normalizer=normalizer)
            loss.backward()
        parts.append(stats)
        out.loss += float(loss.detach())
        out.micro_batches += 1
        with torch.no_grad():  # a token shared by several chains (global advantage) counts once
            unique, inverse = torch.unique(packed.own, return_inverse=True)
            gap = torch.zeros(unique.numel(), device=device).scatter_(0, inverse, (logprobs - packed.old_logprobs).abs())
        out.gap_sum += float(gap.sum())
        out.gap_max = max(out.gap_max, float(gap.max()))
        out.gap_count += gap.numel()
    out.stats = merge_loss_stats(parts)
    return out
