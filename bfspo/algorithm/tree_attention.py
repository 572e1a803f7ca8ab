"""Tree attention from DFS intervals, with memory linear in the tokens (Sec. 4.2: shared prefixes once).

A packed row (bfspo.algorithm.packing) holds tokens in depth-first order, so the subtree of token j
is the contiguous run [j, ends[j]) of the row, and

    query k may attend key j  iff  j <= k < ends[j]   (j is an ancestor of k, or k itself).

One int64 per token describes the whole mask: no [T, T] mask is ever built. Several trees (or
pieces of trees, or flat chains) share one row without padding: a token's interval never reaches
past its own tree. Two kernels compute softmax(q k^T * scale + mask) v from the intervals:

* `blockwise_attention` (CPU): queries in blocks of `QUERY_BLOCK` tokens. A block gathers only the
  keys that one of its queries can see (j < block end and ends[j] > block start: in a tree, the
  block's ancestors), builds its [block, keys] additive mask from the intervals, and runs torch's
  fused CPU attention kernel on them. A custom autograd Function saves only q, k, v, the output
  and the row log-sum-exp, and runs the kernel's backward block by block (the flash-attention
  recipe: probabilities are recomputed, never stored). Beyond the saved tensors it holds one block
  at a time: the gathered keys and values repeated per query head, [Hq, keys, d] each, the mask
  [block, keys], and the kernel's own block-sized buffers, where the keys of a block are at most the
  prompt, the depth of its deepest token and the block itself, for tree rows.
* `flex_tree_attention` (CUDA): torch's compiled `flex_attention` with a BlockMask built directly
  from the intervals (`interval_block_mask`: an O((T / 128)^2) block map, never [T, T]), so
  blocks of keys that no query of a block can see are skipped. Flex attention saves q, k, v, the
  output and the log-sum-exp, as above. (On CPU torch's flex attention has no backward pass and,
  uncompiled, materialises the scores, hence the blockwise kernel there.)

`tree_attention_forward` is registered with transformers' AttentionInterface as "bfspo_tree";
`tree_attention_mode(model)` switches a model to it, and the intervals (and on CUDA their BlockMask,
`tree_kwargs`) travel to every attention layer as keyword arguments of the model call. Under
gradient checkpointing the backward pass runs the layers again, with the same keyword arguments
but the implementation that the model's config names then: the mode must span the backward pass
(bfspo.training.accumulate holds it; `packed_logprobs` refuses a checkpointed forward without it).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from bfspo.errors import BfspoError

NAME = "bfspo_tree"
QUERY_BLOCK = 256  # queries per block of the blockwise kernel
FLEX_BLOCK = 128  # flex attention's block size (torch's default)


def visible_keys(ends: torch.Tensor, q0: int, q1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(key indices, [q1 - q0, keys] bool mask) of the keys that queries q0..q1-1 may attend."""
    keys = torch.nonzero(ends[:q1] > q0).squeeze(1)
    queries = torch.arange(q0, q1, device=ends.device).unsqueeze(1)
    return keys, (keys.unsqueeze(0) <= queries) & (queries < ends[keys].unsqueeze(0))


# torch's fused CPU attention kernels (what F.scaled_dot_product_attention runs on CPU), called per
# query block so that the log-sum-exp of the forward pass can be kept for the backward pass.
_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _block(k: torch.Tensor, v: torch.Tensor, ends: torch.Tensor, q0: int, q1: int, groups: int):
    """(key indices, their keys and values repeated for every query head, additive mask) of one query block."""
    keys, mask = visible_keys(ends, q0, q1)
    bias = torch.zeros(mask.shape, dtype=k.dtype, device=k.device).masked_fill_(~mask, float("-inf"))
    return keys, k[:, :, keys].repeat_interleave(groups, 1), v[:, :, keys].repeat_interleave(groups, 1), bias


class _BlockwiseTreeAttention(torch.autograd.Function):
    """q [1, Hq, T, d], k and v [1, Hkv, T, d] (query head h reads key/value head h // (Hq / Hkv)), ends [T]."""

    @staticmethod
    def forward(ctx, q, k, v, ends, scale, block):
        groups = q.shape[1] // k.shape[1]
        out, lse = torch.empty_like(q), None
        for q0 in range(0, q.shape[2], block):
            q1 = min(q0 + block, q.shape[2])
            _, kb, vb, bias = _block(k, v, ends, q0, q1, groups)
            o, block_lse = _FLASH_CPU(q[:, :, q0:q1], kb, vb, 0.0, False, attn_mask=bias, scale=scale)
            if lse is None:
                lse = torch.empty(q.shape[:-1], dtype=block_lse.dtype, device=q.device)
            out[:, :, q0:q1], lse[:, :, q0:q1] = o, block_lse
        ctx.save_for_backward(q, k, v, ends, out, lse)
        ctx.scale, ctx.block = scale, block
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, ends, out, lse = ctx.saved_tensors
        groups = q.shape[1] // k.shape[1]
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for q0 in range(0, q.shape[2], ctx.block):
            q1 = min(q0 + ctx.block, q.shape[2])
            keys, kb, vb, bias = _block(k, v, ends, q0, q1, groups)
            dqb, dkb, dvb = _FLASH_CPU_BACKWARD(grad_out[:, :, q0:q1].contiguous(), q[:, :, q0:q1], kb, vb,
                                               out[:, :, q0:q1], lse[:, :, q0:q1], 0.0, False, attn_mask=bias,
                                               scale=ctx.scale)
            dq[:, :, q0:q1] = dqb
            dk.index_add_(2, keys, dkb.unflatten(1, (k.shape[1], groups)).sum(2))
            dv.index_add_(2, keys, dvb.unflatten(1, (k.shape[1], groups)).sum(2))
        return dq, dk, dv, None, None, None


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ends: torch.Tensor, scale: float,
                        block: int = QUERY_BLOCK) -> torch.Tensor:
    """Tree attention of one row on CPU: q [1, Hq, T, d], k and v [1, Hkv, T, d] -> [1, Hq, T, d]."""
    return _BlockwiseTreeAttention.apply(q, k, v, ends, scale, block)


def interval_block_mask(ends: torch.Tensor, block: int = FLEX_BLOCK):
    """flex attention's BlockMask of the interval mask, built from per-block minima and maxima of `ends`.

    Keys of kv block b are seen by query blocks b .. (max ends - 1) // block (a key is seen from its
    own position to its interval's end), and fully by the complete query blocks after b that end
    before the smallest interval end of the block (as `create_block_mask` classifies them). Partial
    blocks apply the exact mask through `mask_mod`.
    """
    from torch.nn.attention.flex_attention import BlockMask

    t = ends.shape[0]
    n = -(-t // block)
    padded = torch.nn.functional.pad(ends, (0, n * block - t), value=0).view(n, block)
    last_seen = (padded.max(1).values - 1) // block  # last query block that sees some key of the block
    first_short = torch.where(torch.arange(n * block, device=ends.device).view(n, block) < t, padded,
                              torch.full_like(padded, t)).min(1).values  # smallest interval end in the block
    qb = torch.arange(n, device=ends.device).unsqueeze(1)
    kb = torch.arange(n, device=ends.device).unsqueeze(0)
    seen = (kb <= qb) & (qb <= last_seen.unsqueeze(0))
    full = (kb < qb) & ((qb + 1) * block <= first_short.unsqueeze(0))  # the last, incomplete block: partial
    partial = seen & ~full

    def to_indices(blocks: torch.Tensor):
        counts = blocks.sum(1, dtype=torch.int32)
        order = torch.argsort((~blocks).to(torch.int8), dim=1, stable=True).to(torch.int32)
        return counts[None, None], order[None, None]

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx < ends[kv_idx])

    kv_num, kv_idx = to_indices(partial)
    full_num, full_idx = to_indices(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(t, t))


_compiled_flex = None


def flex_tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, scale: float,
                        compiled: bool = True) -> torch.Tensor:
    """Tree attention of one row through flex attention: q [1, Hq, T, d], k and v [1, Hkv, T, d],
    `block_mask` from `interval_block_mask`.

    Compiled on CUDA (the fused kernel); `compiled=False` runs torch's reference implementation,
    which materialises the scores: for checking the mask logic on CPU only.
    """
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex_attention
    if compiled:
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention)
        fn = _compiled_flex
    return fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def tree_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                           tree_ends=None, tree_block_mask=None, sliding_window=None, softcap=None, **kwargs):
    """transformers' attention interface: (output [1, T, Hq, d], None) for one packed row."""
    if tree_ends is None:
        raise BfspoError("tree attention needs the row's intervals (`tree_ends`): call the model through "
                         "bfspo.algorithm.packing.packed_logprobs")
    if sliding_window is not None or softcap is not None or dropout:
        raise BfspoError("tree attention supports full attention without soft-capping or dropout; the model "
                         f"asks for sliding_window={sliding_window}, softcap={softcap}, dropout={dropout}")
    if query.shape[0] != 1:
        raise BfspoError(f"tree attention takes one packed row, got a batch of {query.shape[0]}")
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    if query.device.type == "cuda":
        mask = interval_block_mask(tree_ends) if tree_block_mask is None else tree_block_mask
        out = flex_tree_attention(query, key, value, mask, scale)
    elif query.device.type == "cpu":
        out = blockwise_attention(query, key, value, tree_ends, scale)
    else:
        raise BfspoError(f"tree attention runs on CUDA (flex attention) or CPU, not on {query.device.type}")
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, tree_attention_forward)


@contextmanager
def tree_attention_mode(model):
    """Within the block, `model`'s attention layers call `tree_attention_forward` (entered again
    inside, it changes nothing). Gradient checkpointing runs the attention layers again in the
    backward pass, so a caller that checkpoints holds the mode across forward and backward."""
    _register()
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = previous


def tree_kwargs(ends: torch.Tensor) -> dict:
    """The keyword arguments that a model call passes on to its attention layers: the row's
    intervals and, on CUDA, their BlockMask, built once per forward rather than once per layer."""
    kwargs = {"tree_ends": ends}
    if ends.device.type == "cuda":
        kwargs["tree_block_mask"] = interval_block_mask(ends)
    return kwargs
