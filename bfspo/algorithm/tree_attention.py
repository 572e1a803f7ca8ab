"""Tree attention from DFS intervals, with memory linear in the tokens (Sec. 4.2: shared prefixes once).

A packed row (bfspo.algorithm.packing) holds tokens in depth-first order, so the subtree of token j
is the contiguous run [j, ends[j]) of the row, and

    query k may attend key j  iff  j <= k < ends[j]   (j is an ancestor of k, or k itself).

One int64 per token describes the whole mask: no [T, T] mask is ever built. Several trees (or
pieces of trees, or flat chains) share one row without padding: a token's interval never reaches
past its own tree. Two kernels compute softmax(q k^T * scale + mask) v from the intervals:

* `blockwise_attention` (CPU, and any device without flex attention): queries in blocks of
  `QUERY_BLOCK` tokens. A block gathers only the keys that one of its queries can see
  (j < block end and ends[j] > block start: in a tree, the block's ancestors) and builds its
  [block, keys] mask from the intervals. A custom autograd Function saves only q, k, v, the output
  and the row log-sum-exp, and recomputes each block's probabilities in the backward pass (the
  flash-attention recipe). Beyond those saved tensors it holds one block at a time: about four
  float32 [query heads, QUERY_BLOCK, keys of the block] tensors in the backward pass (scores,
  probabilities, their gradient), where the keys of a block are at most the prompt, the depth of
  its deepest token and the block itself, for tree rows.
* `flex_tree_attention` (CUDA): torch's compiled `flex_attention` with a BlockMask built directly
  from the intervals (`interval_block_mask`: an O((T / 128)^2) block map, never [T, T]), so
  blocks of keys that no query of a block can see are skipped. Flex attention saves q, k, v, the
  output and the log-sum-exp, as above. (On CPU torch's flex attention has no backward pass and,
  uncompiled, materialises the scores, hence the blockwise kernel there.)

`tree_attention_forward` is registered with transformers' AttentionInterface as "bfspo_tree";
`use_tree_attention(model)` switches a model to it for one packed forward, and the intervals
travel to every attention layer as the keyword argument `tree_ends`.
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


def _block_scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Masked scores of one query block: q [Hkv, g, B, d], k [Hkv, n, d] -> [Hkv, g, B, n]."""
    scores = torch.matmul(q, k.unsqueeze(1).transpose(-1, -2)).mul_(scale)
    return scores.masked_fill_(~mask, float("-inf"))


class _BlockwiseTreeAttention(torch.autograd.Function):
    """q [Hkv, g, T, d] (g query heads per key/value head), k and v [Hkv, T, d], ends [T]."""

    @staticmethod
    def forward(ctx, q, k, v, ends, scale, block):
        acc = torch.promote_types(q.dtype, torch.float32)  # scores and softmax in float32 at least
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=acc, device=q.device)
        for q0 in range(0, q.shape[2], block):
            q1 = min(q0 + block, q.shape[2])
            keys, mask = visible_keys(ends, q0, q1)
            scores = _block_scores(q[:, :, q0:q1].to(acc), k[:, keys].to(acc), mask, scale)
            block_lse = torch.logsumexp(scores, dim=-1)
            probs = scores.sub_(block_lse.unsqueeze(-1)).exp_()
            out[:, :, q0:q1] = torch.matmul(probs, v[:, keys].to(acc).unsqueeze(1)).to(q.dtype)
            lse[:, :, q0:q1] = block_lse
        ctx.save_for_backward(q, k, v, ends, out, lse)
        ctx.scale, ctx.block = scale, block
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, ends, out, lse = ctx.saved_tensors
        scale, block = ctx.scale, ctx.block
        acc = lse.dtype
        dq = torch.empty(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        delta = (grad_out.to(acc) * out.to(acc)).sum(-1)  # rowsum(dO * O) = rowsum(P * dP)
        for q0 in range(0, q.shape[2], block):
            q1 = min(q0 + block, q.shape[2])
            keys, mask = visible_keys(ends, q0, q1)
            qb, kb, vb = q[:, :, q0:q1].to(acc), k[:, keys].to(acc), v[:, keys].to(acc)
            dob = grad_out[:, :, q0:q1].to(acc)
            probs = _block_scores(qb, kb, mask, scale).sub_(lse[:, :, q0:q1].unsqueeze(-1)).exp_()
            dv.index_add_(1, keys, torch.matmul(probs.transpose(-1, -2), dob).sum(1))
            dscores = torch.matmul(dob, vb.unsqueeze(1).transpose(-1, -2)).sub_(delta[:, :, q0:q1].unsqueeze(-1))
            dscores.mul_(probs).mul_(scale)
            dq[:, :, q0:q1] = torch.matmul(dscores, kb.unsqueeze(1))
            dk.index_add_(1, keys, torch.matmul(dscores.transpose(-1, -2), qb).sum(1))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ends: torch.Tensor, scale: float,
                        block: int = QUERY_BLOCK) -> torch.Tensor:
    """Tree attention of one row: q [1, Hq, T, d], k and v [1, Hkv, T, d] -> [1, Hq, T, d]."""
    hq, hkv = q.shape[1], k.shape[1]
    grouped = q[0].reshape(hkv, hq // hkv, q.shape[2], q.shape[3])  # query head h uses key head h // (hq / hkv)
    out = _BlockwiseTreeAttention.apply(grouped, k[0], v[0], ends, scale, block)
    return out.reshape(1, hq, q.shape[2], q.shape[3])


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


def flex_tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ends: torch.Tensor, scale: float,
                        compiled: bool = True) -> torch.Tensor:
    """Tree attention of one row through flex attention: q [1, Hq, T, d], k and v [1, Hkv, T, d].

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
    return fn(q, k, v, block_mask=interval_block_mask(ends), scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def tree_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                           tree_ends=None, sliding_window=None, softcap=None, **kwargs):
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
    if query.is_cuda:
        out = flex_tree_attention(query, key, value, tree_ends, scale)
    else:
        out = blockwise_attention(query, key, value, tree_ends, scale)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, tree_attention_forward)


@contextmanager
def use_tree_attention(model):
    """Within the block, `model`'s attention layers call `tree_attention_forward`."""
    _register()
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
