"""The clipped surrogate objective: Eq. 10 (BFS-PO) and Eq. 2 (DAPO), as a loss to minimise.

    loss = -(1 / N) * sum_n min(r_n * A_n, clip(r_n, 1 - eps_low, 1 + eps_high) * A_n),
    r_n = exp(log pi_theta(w_n | ...) - log pi_old(w_n | ...)),

a token-mean with no KL term. For BFS-PO the sum runs over the unique tokens of the trees in the
(mini-)batch and N = |T| is their number (Eq. 10); for DAPO, and for the global-advantage variant,
it runs over the tokens of the flattened chains and N = sum_i |o_i| (Eq. 2). Which entries exist is
decided by bfspo.algorithm.packing; this function only sees one value per entry.
"""

from __future__ import annotations

import torch

EPS_LOW = 0.2
EPS_HIGH = 0.28


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor | None = None, *, eps_low: float = EPS_LOW, eps_high: float = EPS_HIGH,
                normalizer: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. 10 / Eq. 2 as a loss: (loss, stats). All tensors share one shape; `mask` marks real entries.

    `normalizer` defaults to the number of real entries; pass the mini-batch total when one
    mini-batch is split into several backward passes, so the summed gradients equal one pass.
    stats: clip_frac (entries where the clipped term is the active one), clip_frac_low/high (ratio
    below 1 - eps_low with A < 0 / above 1 + eps_high with A > 0), ratio_mean, ratio_max,
    approx_kl (mean of old - new log-prob), n_tokens.
    """
    mask = torch.ones_like(logprobs, dtype=torch.bool) if mask is None else mask.bool()
    n = mask.sum()
    denom = float(n) if normalizer is None else float(normalizer)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * advantages
    surrogate = torch.minimum(unclipped, clipped)
    loss = -torch.where(mask, surrogate, torch.zeros_like(surrogate)).sum() / max(denom, 1.0)
    with torch.no_grad():
        count = max(int(n), 1)
        r = ratio[mask]
        stats = {
            "clip_frac": float(((clipped < unclipped) & mask).sum()) / count,
            "clip_frac_low": float(((ratio < 1 - eps_low) & (advantages < 0) & mask).sum()) / count,
            "clip_frac_high": float(((ratio > 1 + eps_high) & (advantages > 0) & mask).sum()) / count,
            "ratio_mean": float(r.mean()) if r.numel() else 1.0,
            "ratio_max": float(r.max()) if r.numel() else 1.0,
            "approx_kl": float((old_logprobs - logprobs)[mask].mean()) if r.numel() else 0.0,
            "n_tokens": int(n),
        }
    return loss, stats
