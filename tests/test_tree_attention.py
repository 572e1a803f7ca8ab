"""The DFS-interval attention kernels against dense masked attention: values, gradients, the
flex-attention BlockMask, and memory that grows linearly with the tokens."""

import random
import warnings

import pytest
import torch

from bfspo.algorithm.tree_attention import (blockwise_attention, flex_tree_attention, interval_block_mask,
                                            tree_attention_forward)
from bfspo.errors import BfspoError


def random_ends(seed: int, t: int, close: float) -> torch.Tensor:
    """Interval ends of a random forest laid out in depth-first order (each node closes its open
    ancestors with probability `close`: small values give deep, long subtrees)."""
    rng = random.Random(seed)
    parent, stack = [], []
    for i in range(t):
        while stack and rng.random() < close:
            stack.pop()
        parent.append(stack[-1] if stack else -1)
        stack.append(i)
    ends = list(range(1, t + 1))
    for i in reversed(range(t)):
        if parent[i] >= 0:
            ends[parent[i]] = max(ends[parent[i]], ends[i])
    return torch.tensor(ends)


def dense_attention(q, k, v, ends, scale):
    cols = torch.arange(ends.numel())
    allowed = (cols[None] <= cols[:, None]) & (cols[:, None] < ends[None])
    groups = q.shape[1] // k.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1),
                                                            v.repeat_interleave(groups, 1), attn_mask=allowed,
                                                            scale=scale)


def qkv(t, dtype=torch.float64, heads=4, kv_heads=2, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, h, t, dim, dtype=dtype, generator=gen).requires_grad_() for h in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("t,close,block", [(1, 0.2, 4), (37, 0.3, 8), (300, 0.1, 64), (300, 0.002, 128)])
def test_blockwise_attention_and_its_gradients_equal_dense_attention(t, close, block):
    ends = random_ends(t, t, close)
    q, k, v = qkv(t)
    grad = torch.randn(1, 4, t, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ours = blockwise_attention(q, k, v, ends, 0.35, block=block)
    ref = dense_attention(q, k, v, ends, 0.35)
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)
    for a, b in zip(torch.autograd.grad((ours * grad).sum(), (q, k, v)), torch.autograd.grad((ref * grad).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_float32_inputs_stay_within_float32_rounding():
    ends = random_ends(3, 200, 0.05)
    q, k, v = qkv(200, dtype=torch.float32)
    out = blockwise_attention(q, k, v, ends, 0.35, block=32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, dense_attention(q, k, v, ends, 0.35), atol=1e-6, rtol=0)


@pytest.mark.parametrize("t,close", [(5, 0.15), (517, 0.15), (700, 0.003), (1300, 0.001)])
def test_block_mask_from_intervals_equals_create_block_mask(t, close):
    """The same partial and full blocks as flex attention's own construction from the mask function."""
    from torch.nn.attention.flex_attention import create_block_mask

    ends = random_ends(t, t, close)
    ours = interval_block_mask(ends)
    ref = create_block_mask(lambda b, h, q, kv: (kv <= q) & (q < ends[kv]), None, None, t, t, device="cpu")
    for counts, indices in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        assert torch.equal(getattr(ours, counts), getattr(ref, counts))
        for row, n in enumerate(getattr(ours, counts)[0, 0].tolist()):
            assert torch.equal(getattr(ours, indices)[0, 0, row, :n], getattr(ref, indices)[0, 0, row, :n])
    if t == 1300:
        assert ours.full_kv_num_blocks.sum() > 0  # deep trees have fully visible blocks


def test_flex_attention_with_the_interval_mask_equals_the_blockwise_kernel():
    """The CUDA path's mask logic, run uncompiled on CPU (forward only: flex attention has no CPU backward)."""
    ends = random_ends(4, 300, 0.05)
    q, k, v = (x.detach().float() for x in qkv(300, dtype=torch.float32))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # uncompiled flex attention warns that it materialises the scores
        flex = flex_tree_attention(q, k, v, interval_block_mask(ends), 0.35, compiled=False)
    torch.testing.assert_close(flex, blockwise_attention(q, k, v, ends, 0.35), atol=1e-6, rtol=0)


def saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for the backward pass while `fn` runs."""
    total = []

    def pack(x):
        total.append(x.numel() * x.element_size())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        fn()
    return sum(total)


def test_saved_memory_grows_linearly_with_tokens():
    """A row twice as long saves twice the bytes for the backward pass; the dense mask's 4x."""
    sizes = {}
    for t in (512, 1024):
        ends = random_ends(0, t, 0.01)
        q, k, v = qkv(t, dtype=torch.float32)
        sizes[t] = (saved_bytes(lambda: blockwise_attention(q, k, v, ends, 0.35)),
                    saved_bytes(lambda: dense_attention(q, k, v, ends, 0.35)))
    ours, dense = sizes[1024][0] / sizes[512][0], sizes[1024][1] / sizes[512][1]
    assert ours == pytest.approx(2.0, rel=0.01)
    assert dense > 3.5


def test_the_attention_interface_refuses_what_it_does_not_compute():
    q, k, v = qkv(4)
    with pytest.raises(BfspoError, match="tree_ends"):
        tree_attention_forward(None, q, k, v, None)
    with pytest.raises(BfspoError, match="sliding_window"):
        tree_attention_forward(None, q, k, v, None, tree_ends=torch.arange(1, 5), sliding_window=2)
    out, weights = tree_attention_forward(None, q, k, v, None, scaling=0.35, tree_ends=torch.full((4,), 4))
    assert weights is None and out.shape == (1, 4, 4, 8)  # [batch, tokens, heads, dim], as transformers expects
    torch.testing.assert_close(out.transpose(1, 2), dense_attention(q, k, v, torch.full((4,), 4), 0.35))
