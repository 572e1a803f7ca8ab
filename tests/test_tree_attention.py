"""The DFS-interval attention kernels against dense masked attention: values, gradients, the
flex-attention BlockMask, and memory that grows linearly with the tokens."""

import random
import warnings

import pytest
import torch

from bfspo.algorithm import tree_attention
from bfspo.algorithm.attention_options import MAX_BUCKETS, bucket_lengths, padded_length
from bfspo.algorithm.tree_attention import (
    FLEX_EAGER_MAX_TOKENS,
    blockwise_attention,
    flex_errors,
    flex_refusal,
    flex_tree_attention,
    interval_block_mask,
    tree_attention_forward,
)
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


@pytest.mark.parametrize("fused", [None, False], ids=["fused", "portable"])
@pytest.mark.parametrize("t,close,block", [(1, 0.2, 4), (37, 0.3, 8), (300, 0.1, 64), (300, 0.002, 128)])
def test_blockwise_attention_and_its_gradients_equal_dense_attention(t, close, block, fused):
    """The fused CPU kernel, and the portable one that runs on CUDA (plain tensor operations)."""
    ends = random_ends(t, t, close)
    q, k, v = qkv(t)
    grad = torch.randn(1, 4, t, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ours = blockwise_attention(q, k, v, ends, 0.35, block=block, fused=fused)
    ref = dense_attention(q, k, v, ends, 0.35)
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)
    for a, b in zip(torch.autograd.grad((ours * grad).sum(), (q, k, v)), torch.autograd.grad((ref * grad).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("fused", [None, False], ids=["fused", "portable"])
def test_float32_inputs_stay_within_float32_rounding(fused):
    ends = random_ends(3, 200, 0.05)
    q, k, v = qkv(200, dtype=torch.float32)
    out = blockwise_attention(q, k, v, ends, 0.35, block=32, fused=fused)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, dense_attention(q, k, v, ends, 0.35), atol=1e-6, rtol=0)


def test_the_portable_kernel_keeps_bfloat16_inputs_to_bfloat16_rounding():
    """What the blockwise kernel computes on CUDA (bfloat16): float32 inside, outputs and gradients in bfloat16."""
    ends = random_ends(5, 300, 0.02)
    q, k, v = (x.detach().bfloat16().requires_grad_() for x in qkv(300, dtype=torch.float32))
    out = blockwise_attention(q, k, v, ends, 0.35, fused=False)
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = dense_attention(*ref_in, ends, 0.35)
    ref_grads = torch.autograd.grad(ref.square().sum(), ref_in)
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in grads)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a.double(), b, atol=5e-2, rtol=5e-2)


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


# --- the compiled flex kernel: one compile per row length (bucket) -----------------------------


def test_bucket_lengths_are_few_and_never_pass_the_budget():
    assert bucket_lengths(16384, 2048) == tuple(range(2048, 16385, 2048))
    assert bucket_lengths(10000, 4096) == (4096, 8192, 10000) and bucket_lengths(300, 2048) == (300,)
    assert bucket_lengths(32768, 512) == bucket_lengths(32768, 1024) == tuple(range(1024, 32769, 1024))
    assert max(len(bucket_lengths(m, 1)) for m in (1, 7, 33, 4096, 1 << 20)) == MAX_BUCKETS
    assert padded_length(1, (4096, 8192)) == 4096 and padded_length(4097, (4096, 8192)) == 8192
    assert padded_length(8192, (4096, 8192)) == 8192
    with pytest.raises(BfspoError, match="longer than the longest bucket"):
        padded_length(8193, (4096, 8192))


def flex_inputs(t: int, seed: int):
    """Tiny GQA inputs (4 query heads on 2 key/value heads of size 16) and a random forest's intervals."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, h, t, 16, generator=gen) for h in (4, 2, 2))
    return q, k, v, random_ends(seed, t, 0.03)


@pytest.mark.slow
def test_compiled_flex_equals_the_blockwise_kernel_compiling_once_per_row_length():
    """The CUDA kernel, compiled by Inductor for the CPU (forward only: torch has no flex backward on
    CPU), at three row lengths with GQA; a second tree at a length seen before compiles nothing.
    Three C++ compiles: about 50 s on one shared core with an empty Inductor cache, 3 s with it."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    for t, seed in [(256, 0), (384, 1), (640, 2), (384, 3)]:
        q, k, v, ends = flex_inputs(t, seed)
        with torch.no_grad():
            out = flex_tree_attention(q, k, v, interval_block_mask(ends), 0.25)
        torch.testing.assert_close(out, blockwise_attention(q, k, v, ends, 0.25), atol=1e-5, rtol=0)
    assert counters["stats"]["unique_graphs"] == 3


def test_flex_is_compiled_with_static_shapes_and_never_falls_back_to_the_uncompiled_kernel(monkeypatch):
    """Past the recompile limit Dynamo would run flex uncompiled (the [T, T] scores): a BfspoError
    naming the way out instead. aot_eager stands in for Inductor (the same Dynamo guards, no codegen)."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(tree_attention, "FLEX_BACKEND", "aot_eager")
    monkeypatch.setattr(tree_attention, "_compiled_flex", None)
    monkeypatch.setattr(tree_attention, "FLEX_RECOMPILE_LIMIT", 2)
    torch._dynamo.reset()
    counters.clear()
    # suppress_errors as a library may leave it: flex turns it off
    with torch.no_grad(), torch._dynamo.config.patch(suppress_errors=True):
        for t in (130, 130, 260, 260):
            q, k, v, ends = flex_inputs(t, t)
            flex_tree_attention(q, k, v, interval_block_mask(ends), 0.25)
        assert counters["stats"]["unique_graphs"] == 2  # static shapes: no dynamic-shape graph after the second length
        q, k, v, ends = flex_inputs(390, 0)
        with pytest.raises(BfspoError, match="tree_attention: blockwise"):
            flex_tree_attention(q, k, v, interval_block_mask(ends), 0.25)
    torch._dynamo.reset()


def test_flex_refuses_what_would_fail_or_take_the_scores_memory():
    assert "tree_attention: blockwise" in flex_refusal("cpu", 4, 100, True, backward=True)
    assert flex_refusal("cpu", 4, 100_000, False, backward=False) is None  # CPU checks of the mask logic
    message = flex_refusal("cuda", 28, FLEX_EAGER_MAX_TOKENS + 1, compiled=False, backward=False)
    assert "tree_attention: blockwise" in message and "materialises" in message
    assert flex_refusal("cuda", 28, FLEX_EAGER_MAX_TOKENS, compiled=False, backward=True) is None
    assert flex_refusal("cuda", 28, 32768, compiled=True, backward=True) is None
    q, k, v = qkv(8, dtype=torch.float32)
    with pytest.raises(BfspoError, match="no backward pass on CPU"):
        flex_tree_attention(q, k, v, interval_block_mask(torch.full((8,), 8)), 0.35)


def test_a_compiler_failure_names_the_way_out():
    from torch._dynamo.exc import BackendCompilerFailed

    def failing(gm, inputs):
        raise RuntimeError("ptxas fatal: unsupported GPU")

    with pytest.raises(BfspoError, match="tree_attention: blockwise.*without torch's compiler") as raised:
        with flex_errors():
            torch.compile(lambda x: x * 2, backend=failing)(torch.ones(3))
    assert isinstance(raised.value.__cause__, BackendCompilerFailed)
