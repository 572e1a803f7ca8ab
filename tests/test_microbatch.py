"""Gradient accumulation over micro-batches (bfspo.training.accumulate): a mini-batch split into 1, 2
or 7 micro-batches, or over 2 ranks, gives the unsplit gradient (float32, 1e-5)."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from bfspo.algorithm.packing import n_entries, plan_micro_batches
from bfspo.training.accumulate import merge_loss_stats, minibatch_backward
from tests.helpers import process
from tests.helpers.trees import load_float32_model, random_search_tree, with_old_logprobs

HELPERS = Path(__file__).parent / "helpers"


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_float32_model(tiny_model_dir)


def batch(model, k, kind, n=3):
    vocab = model.config.vocab_size
    trees = [random_search_tree(50 * k + i, prompt_len=4 + i, vocab=vocab, group=4, k=k, max_len=16, advantage=kind)
             for i in range(n)]
    return with_old_logprobs(model, trees)


def gradients(model, trees, budget, normalizer=None):
    model.zero_grad(set_to_none=True)
    acc = minibatch_backward(model, trees, micro_batch_tokens=budget,
                             normalizer=sum(n_entries(t) for t in trees) if normalizer is None else normalizer,
                             eps_low=0.2, eps_high=0.28)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads, acc


def budget_for(trees, count):
    """The smallest budget that plans exactly `count` micro-batches."""
    shortest = max(len(t.prompt_ids) + max(t.segments[i].leaf.length for i in t.leaves()) for t in trees) + 1
    total = sum(len(t.prompt_ids) + t.n_tokens for t in trees)
    return next(b for b in range(shortest, total + 1) if len(plan_micro_batches(trees, b)) == count)


@pytest.mark.parametrize("k,kind", [(0, "branch"), (3, "branch"), (3, "global")])
def test_split_update_equals_the_unsplit_one(model, k, kind):
    trees = batch(model, k, kind)
    total = sum(len(t.prompt_ids) + t.n_tokens for t in trees)
    reference, ref_acc = gradients(model, trees, total)
    assert ref_acc.micro_batches == 1 and 0 < ref_acc.stats["clip_frac"] < 1
    for count in (2, 7):
        budget = budget_for(trees, count)
        if count == 7:
            assert any(p.lo > 0 for b in plan_micro_batches(trees, budget) for p in b)  # a tree is cut
        grads, acc = gradients(model, trees, budget)
        assert acc.micro_batches == count
        assert acc.loss == pytest.approx(ref_acc.loss, abs=1e-6)
        assert acc.stats == pytest.approx(ref_acc.stats, abs=1e-6)
        for g, r in zip(grads, reference):
            torch.testing.assert_close(g, r, atol=1e-5, rtol=0)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir):
    """Checkpointing runs each layer's attention again in the backward pass: through tree attention
    there too (the paper config checkpoints), so the gradients are those of the plain update. A
    checkpointed forward outside the tree-attention mode is refused, not run with the wrong attention."""
    from bfspo.algorithm.packing import pack_trees, packed_logprobs
    from bfspo.errors import BfspoError

    model = load_float32_model(tiny_model_dir).train()  # train(): transformers checkpoints only in training
    trees = batch(model, 3, "branch")
    total = sum(len(t.prompt_ids) + t.n_tokens for t in trees)
    reference, _ = gradients(model, trees, total)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    grads, _ = gradients(model, trees, budget_for(trees, 2))
    for g, r in zip(grads, reference):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=0)
    with pytest.raises(BfspoError, match="tree_attention_mode"):
        packed_logprobs(model, pack_trees(trees))


def test_the_normaliser_is_the_whole_mini_batchs():
    """Two halves, each divided by the whole's entry count, sum to the whole; stats merge by weight."""
    parts = [{"clip_frac": 0.5, "clip_frac_low": 0.0, "clip_frac_high": 0.5, "ratio_mean": 1.0, "approx_kl": 0.1,
              "ratio_max": 2.0, "n_tokens": 2},
             {"clip_frac": 0.0, "clip_frac_low": 0.0, "clip_frac_high": 0.0, "ratio_mean": 0.5, "approx_kl": 0.4,
              "ratio_max": 1.5, "n_tokens": 6}]
    merged = merge_loss_stats(parts)
    assert merged == pytest.approx({"clip_frac": 0.125, "clip_frac_low": 0.0, "clip_frac_high": 0.125,
                                    "ratio_mean": 0.625, "approx_kl": 0.325, "ratio_max": 2.0, "n_tokens": 8})
    assert merge_loss_stats([]) == {}


def test_a_rank_without_trees_adds_nothing(model):
    grads_before = [p.grad for p in model.parameters()]
    acc = minibatch_backward(model, [], micro_batch_tokens=64, normalizer=10, eps_low=0.2, eps_high=0.28)
    assert acc.micro_batches == 0 and acc.loss == 0 and acc.stats == {}
    assert [p.grad for p in model.parameters()] == grads_before


@pytest.mark.slow
def test_two_ranks_with_split_trees_give_the_one_process_gradient(model, tiny_model_dir, tmp_path):
    """torchrun, 2 gloo ranks, each cutting its trees into pieces: the summed gradient is the one
    process's unsplit gradient of the same mini-batch."""
    trees = batch(model, 3, "branch", n=4)
    trees_file = tmp_path / "trees.jsonl"
    trees_file.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trees))
    reference, ref_acc = gradients(model, trees, 10_000)
    budget = budget_for(trees[0::2], 3)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = process.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                        str(HELPERS / "ddp_grads.py"), str(tiny_model_dir), str(trees_file), str(budget),
                        str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = torch.load(tmp_path / "grads.pt")
    assert out["micro_batches"][0] == 3 and out["micro_batches"][1] >= 2
    assert out["loss"] == pytest.approx(ref_acc.loss, abs=1e-6)
    for g, r in zip(out["grads"], reference):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=0)
