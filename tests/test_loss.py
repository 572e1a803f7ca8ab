"""The clipped token-mean surrogate (Eq. 10 / Eq. 2) on hand-picked ratios."""

import math

import pytest
import torch

from bfspo.algorithm.loss import EPS_HIGH, EPS_LOW, policy_loss


def case():
    # ratios 1.5, 0.5, 0.5, 1.5, 1.0 with advantages +1, -1, +1, -1, +2
    ratio = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.0], dtype=torch.float64)
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.2], dtype=torch.float64)
    logp = (old + ratio.log()).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0], dtype=torch.float64)
    return logp, old, adv


def test_defaults_are_dapo_clip_ranges():
    assert (EPS_LOW, EPS_HIGH) == (0.2, 0.28)


def test_loss_value_gradient_and_stats_by_hand():
    logp, old, adv = case()
    loss, stats = policy_loss(logp, old, adv)
    # min(r A, clip(r) A): 1.28 (clipped high), -0.8 (clipped low), 0.5, -1.5, 2.0
    assert loss.item() == pytest.approx(-(1.28 - 0.8 + 0.5 - 1.5 + 2.0) / 5)
    loss.backward()
    # clipped entries get no gradient; the others d/dlogp (-r A / N)
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, -0.5 / 5, 1.5 / 5, -2.0 / 5])
    assert stats["clip_frac"] == pytest.approx(2 / 5)
    assert (stats["clip_frac_low"], stats["clip_frac_high"]) == (pytest.approx(1 / 5), pytest.approx(1 / 5))
    assert stats["ratio_mean"] == pytest.approx(1.0) and stats["ratio_max"] == pytest.approx(1.5)
    assert stats["n_tokens"] == 5
    assert stats["approx_kl"] == pytest.approx(-(math.log(1.5) * 2 + math.log(0.5) * 2) / 5)


def test_mask_and_normalizer_split_a_batch_without_changing_its_gradient():
    logp, old, adv = case()
    full, _ = policy_loss(logp, old, adv)
    (g_full,) = torch.autograd.grad(full, logp)
    halves = [torch.tensor([1, 1, 0, 0, 0], dtype=torch.bool), torch.tensor([0, 0, 1, 1, 1], dtype=torch.bool)]
    total = 0
    grads = torch.zeros_like(logp)
    for m in halves:
        loss, stats = policy_loss(logp, old, adv, m, normalizer=5)
        assert stats["n_tokens"] == int(m.sum())
        total = total + loss.item()
        grads += torch.autograd.grad(loss, logp)[0]
    assert total == pytest.approx(full.item()) and torch.allclose(grads, g_full)
    masked, _ = policy_loss(logp, old, adv, halves[1])
    assert masked.item() == pytest.approx(-(0.5 - 1.5 + 2.0) / 3)  # default normaliser: real entries


def test_on_policy_loss_is_minus_the_mean_advantage():
    adv = torch.tensor([0.3, -1.2, 2.0])
    logp = torch.tensor([-1.0, -2.0, -3.0])
    loss, stats = policy_loss(logp, logp, adv)
    assert loss.item() == pytest.approx(-adv.mean().item()) and stats["clip_frac"] == 0.0
