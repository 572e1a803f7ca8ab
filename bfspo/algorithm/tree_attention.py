"""Tree attention from DFS intervals, with memory linear in the tokens (Sec. 4.2: shared prefixes once).

A packed row (bfspo.algorithm.packing) holds tokens in depth-first order, so the subtree of token j
is the contiguous run [j, ends[j]) of the row, and

    query k may attend key j  iff  j <= k < ends[j]   (j is an ancestor of k, or k itself).

One int64 per token describes the whole mask: no [T, T] mask is ever built. Several trees (or
pieces of trees, or flat chains) share one row without padding: a token's interval never reaches
past its own tree. Two kernels compute softmax(q k^T * scale + mask) v from the intervals:

* `blockwise_attention` (CPU and CUDA): queries in blocks of `QUERY_BLOCK` tokens. A block reads
  only the keys that one of its queries can see (j < block end and ends[j] > block start: in a
  tree, the block's ancestors; a view when they are contiguous), under its [block, keys] additive
  mask from the intervals, and attends: on CPU through torch's fused CPU attention kernel (which
  reads grouped key/value heads itself), elsewhere through plain tensor operations in float32
  (`_portable_forward`; torch has no device-independent fused kernel that returns the
  log-sum-exp). The blocks, their keys and masks (`BlockPlan`) are computed once per model call
  and shared by every layer, forward and backward (`tree_kwargs`). A custom autograd Function
  saves only q, k, v, the output and the row log-sum-exp, and runs the backward block by block
  (the flash-attention recipe: probabilities are recomputed, never stored). Beyond the saved
  tensors and the plan it holds one block at a time: the block's keys and values (gathered, and on
  the portable path repeated per query head, [Hq, keys, d] each) and its scores (float32 [Hq,
  block, keys] on the portable path; the fused kernel's own block-sized buffers on CPU), where the
  keys of a block are at most the prompt, the depth of its deepest token and the block itself, for
  tree rows. No compiler, any row length.
* `flex_tree_attention` (CUDA): torch's compiled `flex_attention` with a BlockMask built directly
  from the intervals (`interval_block_mask`: an O((T / 128)^2) block map, never [T, T]), so
  blocks of keys that no query of a block can see are skipped. Flex attention saves q, k, v, the
  output and the log-sum-exp, as above. It is compiled with static shapes, one kernel per row
  length and autograd mode: the callers pad rows to a few lengths
  (bfspo.algorithm.attention_options.bucket_lengths, bfspo.algorithm.packing.pad_row). On CPU
  torch's flex attention has no backward pass, and uncompiled it materialises the scores, hence
  the blockwise kernel there (and on CUDA if flex fails: TrainConfig `tree_attention`).

`tree_attention_forward` is registered with transformers' AttentionInterface as "bfspo_tree";
`tree_attention_mode(model)` switches a model to it, and the intervals, the kernel and (for flex)
their BlockMask (`tree_kwargs`) travel to every attention layer as keyword arguments of the model
call. Under gradient checkpointing the backward pass runs the layers again, with the same keyword
arguments but the implementation that the model's config names then: the mode must span the
backward pass (bfspo.training.accumulate holds it; `packed_logprobs` refuses a checkpointed
forward without it).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from bfspo.algorithm.attention_options import KERNELS, MAX_BUCKETS
from bfspo.errors import BfspoError

NAME = "bfspo_tree"
QUERY_BLOCK = 256  # queries per block of the blockwise kernel
FLEX_BLOCK = 128  # flex attention's block size (torch's default)
FLEX_EAGER_MAX_TOKENS = 1024  # uncompiled flex on CUDA: [Hq, T, T] scores, 4 MiB per head in float32 here
# Compiled flex kernels one process may hold: a bucket length x autograd mode (gradients or not) x
# dtype, with room to spare (Dynamo's default, 8, would be reached by 4 buckets).
FLEX_RECOMPILE_LIMIT = 4 * MAX_BUCKETS
FLEX_BACKEND = "inductor"  # torch.compile's backend for flex (the fused kernel; tests count compiles with aot_eager)


def visible_keys(ends: torch.Tensor, q0: int, q1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(key indices, [q1 - q0, keys] bool mask) of the keys that queries q0..q1-1 may attend."""
    keys = torch.nonzero(ends[:q1] > q0).squeeze(1)
    queries = torch.arange(q0, q1, device=ends.device).unsqueeze(1)
    return keys, (keys.unsqueeze(0) <= queries) & (queries < ends[keys].unsqueeze(0))


class BlockPlan:
    """The query blocks of one row and what each may see, computed once per forward pass and shared
    by every attention layer and their backward passes (`tree_kwargs`).

    blocks: (q0, q1, keys, allowed) per block of `block` queries, `keys` a slice where the visible
    keys are contiguous (the keys are then read as a view, not gathered) and an index tensor
    otherwise; `bias(i, dtype)`: block i's additive mask (0 or -inf), built on first use per dtype.
    The masks hold sum over blocks of (block x keys) elements: the row's tokens times at most the
    prompt, the depth of the deepest token and the block, for tree rows.
    """

    def __init__(self, ends: torch.Tensor, block: int = QUERY_BLOCK):
        self.ends, self.block = ends, block
        self.blocks = []
        for q0 in range(0, ends.shape[0], block):
            q1 = min(q0 + block, ends.shape[0])
            keys, allowed = visible_keys(ends, q0, q1)
            first, n = int(keys[0]), keys.numel()
            if int(keys[-1]) - first + 1 == n:
                keys = slice(first, first + n)
            self.blocks.append((q0, q1, keys, allowed))
        self._bias: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def bias(self, i: int, dtype: torch.dtype) -> torch.Tensor:
        if (i, dtype) not in self._bias:
            allowed = self.blocks[i][3]
            self._bias[i, dtype] = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
                ~allowed, float("-inf"))
        return self._bias[i, dtype]


# torch's fused CPU attention kernels (what F.scaled_dot_product_attention runs on CPU), called per
# query block so that the log-sum-exp of the forward pass can be kept for the backward pass.
_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _fused_cpu_forward(q, k, v, bias, scale):
    return _FLASH_CPU(q, k, v, 0.0, False, attn_mask=bias, scale=scale)


def _fused_cpu_backward(grad_out, q, k, v, out, lse, bias, scale):
    return _FLASH_CPU_BACKWARD(grad_out, q, k, v, out, lse, 0.0, False, attn_mask=bias, scale=scale)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32, or float64 if it is: the precision the portable kernel computes in."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _portable_forward(q, k, v, bias, scale):
    """(softmax(q k^T scale + bias) v, its row log-sum-exp) of one block [1, H, block, d] against its
    keys [1, H, keys, d], in float32 through plain tensor operations: any device."""
    scores = torch.matmul(_wide(q), _wide(k).transpose(-1, -2)) * scale + bias
    lse = torch.logsumexp(scores, -1)
    return torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), _wide(v)).to(q.dtype), lse


def _portable_backward(grad_out, q, k, v, out, lse, bias, scale):
    """The gradients of `_portable_forward`'s output with respect to q, k and v, from the saved
    log-sum-exp: P = exp(S - lse) recomputed, dV = P^T dO, dS = P (dO V^T - rowsum(dO * O)) scale,
    dQ = dS K, dK = dS^T Q (the flash-attention backward)."""
    qw, kw, go = _wide(q), _wide(k), _wide(grad_out)
    probs = torch.exp(torch.matmul(qw, kw.transpose(-1, -2)) * scale + bias - lse.unsqueeze(-1))
    dv = torch.matmul(probs.transpose(-1, -2), go)
    ds = probs * (torch.matmul(go, _wide(v).transpose(-1, -2)) - (go * _wide(out)).sum(-1, keepdim=True)) * scale
    return torch.matmul(ds, kw).to(q.dtype), torch.matmul(ds.transpose(-1, -2), qw), dv


def _take(x: torch.Tensor, keys, groups: int) -> torch.Tensor:
    """The keys or values `keys` (a slice or indices) of x [1, Hkv, T, d], repeated `groups` times per
    head (1: left as they are, for the fused CPU kernel, which reads head h // groups itself)."""
    x = x[:, :, keys]
    return x if groups == 1 else x.repeat_interleave(groups, 1)


def _add_at(acc: torch.Tensor, keys, x: torch.Tensor) -> None:
    """acc[:, :, keys] += x, for `keys` a slice or indices."""
    if isinstance(keys, slice):
        acc[:, :, keys] += x
    else:
        acc.index_add_(2, keys, x)


class _BlockwiseTreeAttention(torch.autograd.Function):
    """q [1, Hq, T, d], k and v [1, Hkv, T, d] (query head h reads key/value head h // (Hq / Hkv)), the
    row's BlockPlan; `fused`: torch's fused CPU kernel per block (grouped heads natively), else the
    portable one (keys and values repeated per query head)."""

    @staticmethod
    def forward(ctx, q, k, v, plan, scale, fused):
        attend = _fused_cpu_forward if fused else _portable_forward
        groups = 1 if fused else q.shape[1] // k.shape[1]
        bias_dtype = q.dtype if fused else torch.promote_types(q.dtype, torch.float32)
        out, lse = torch.empty_like(q), None
        for i, (q0, q1, keys, _) in enumerate(plan.blocks):
            o, block_lse = attend(q[:, :, q0:q1], _take(k, keys, groups), _take(v, keys, groups),
                                  plan.bias(i, bias_dtype), scale)
            if lse is None:
                lse = torch.empty(q.shape[:-1], dtype=block_lse.dtype, device=q.device)
            out[:, :, q0:q1], lse[:, :, q0:q1] = o, block_lse
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.scale, ctx.fused, ctx.bias_dtype = plan, scale, fused, bias_dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        attend_backward = _fused_cpu_backward if ctx.fused else _portable_backward
        heads = q.shape[1] // k.shape[1]
        groups = 1 if ctx.fused else heads
        dq = torch.empty_like(q)
        wide = torch.promote_types(k.dtype, torch.float32)
        dk, dv = torch.zeros(k.shape, dtype=wide, device=k.device), torch.zeros(v.shape, dtype=wide, device=v.device)
        for i, (q0, q1, keys, _) in enumerate(ctx.plan.blocks):
            dqb, dkb, dvb = attend_backward(grad_out[:, :, q0:q1].contiguous(), q[:, :, q0:q1], _take(k, keys, groups),
                                            _take(v, keys, groups), out[:, :, q0:q1], lse[:, :, q0:q1],
                                            ctx.plan.bias(i, ctx.bias_dtype), ctx.scale)
            dq[:, :, q0:q1] = dqb
            if groups > 1:
                dkb, dvb = (g.unflatten(1, (k.shape[1], groups)).sum(2) for g in (dkb, dvb))
            _add_at(dk, keys, dkb.to(dk.dtype))
            _add_at(dv, keys, dvb.to(dv.dtype))
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ends: torch.Tensor, scale: float,
                        block: int = QUERY_BLOCK, fused: bool | None = None, plan: BlockPlan | None = None) -> torch.Tensor:
    """Tree attention of one row on any device: q [1, Hq, T, d], k and v [1, Hkv, T, d] -> [1, Hq, T, d].

    plan: the row's BlockPlan (of `ends`, `block` queries per block), built here if None: a model
    call builds it once for all its layers (`tree_kwargs`).
    fused: torch's fused CPU kernel per block (CPU tensors only); None takes it on CPU and the
    portable float32 kernel elsewhere (the gradients of k and v accumulate in float32 either way).
    """
    if fused is None:
        fused = q.device.type == "cpu"
    elif fused and q.device.type != "cpu":
        raise BfspoError(f"the fused blockwise kernel is torch's CPU kernel; tensors on {q.device.type} take the "
                         "portable one (fused=None)")
    if plan is None:
        plan = BlockPlan(ends, block)
    return _BlockwiseTreeAttention.apply(q, k, v, plan, scale, fused)


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


@contextmanager
def flex_errors():
    """Within the block, a failure of torch's compiler (Dynamo, Inductor, the recompile limit) is a
    BfspoError that names the way out, TrainConfig `tree_attention: blockwise`. The backward pass of
    a compiled kernel is compiled when it first runs, so the caller's backward pass belongs inside too."""
    from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException
    from torch._inductor.exc import InductorError

    try:
        yield
    except (TorchDynamoException, FailOnRecompileLimitHit, InductorError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BfspoError(f"compiled flex attention failed ({type(e).__name__}: {first}); set `tree_attention: "
                         "blockwise` (--set tree_attention=blockwise) to train without torch's compiler") from e


def flex_refusal(device: str, heads: int, tokens: int, compiled: bool, backward: bool) -> str | None:
    """Why flex attention must not run on a row of `tokens` tokens and `heads` query heads on
    `device` (a device type), or None: torch has no flex backward pass on CPU, and uncompiled flex
    materialises the [heads, T, T] scores, refused on CUDA above FLEX_EAGER_MAX_TOKENS tokens."""
    if device == "cpu" and backward:
        return ("flex attention has no backward pass on CPU: set `tree_attention: blockwise` (or `auto`, which "
                "takes blockwise on CPU)")
    if device == "cuda" and not compiled and tokens > FLEX_EAGER_MAX_TOKENS:
        return (f"uncompiled flex attention materialises the [heads, T, T] scores ({heads} x {tokens} x {tokens} "
                f"here); it is refused on CUDA above {FLEX_EAGER_MAX_TOKENS} tokens. Use the compiled kernel, or "
                "set `tree_attention: blockwise`")
    return None


def flex_tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, scale: float,
                        compiled: bool = True) -> torch.Tensor:
    """Tree attention of one row through flex attention: q [1, Hq, T, d], k and v [1, Hkv, T, d],
    `block_mask` from `interval_block_mask`.

    Compiled (the fused kernel) with static shapes: one kernel per row length T and autograd mode,
    up to FLEX_RECOMPILE_LIMIT kernels (rows padded to bucket lengths keep them few); past that,
    or if compiling fails, a BfspoError naming `tree_attention: blockwise` (`flex_errors`), never a
    silent fall-back to the uncompiled kernel. `compiled=False` runs torch's reference
    implementation, which materialises the [Hq, T, T] scores: refused on CUDA above
    FLEX_EAGER_MAX_TOKENS tokens. On CPU torch has no flex backward pass: inputs that require
    gradients under autograd are refused.
    """
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    refusal = flex_refusal(q.device.type, q.shape[1], q.shape[2], compiled,
                           torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)))
    if refusal:
        raise BfspoError(refusal)
    gqa = q.shape[1] != k.shape[1]
    if not compiled:
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False, backend=FLEX_BACKEND)
    # suppress_errors (which another library may have set) would run flex uncompiled after a failed
    # compile, and Dynamo refuses it beside fail_on_recompile_limit_hit
    with flex_errors(), torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT, suppress_errors=False,
                                                   fail_on_recompile_limit_hit=True):
        return _compiled_flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)


def default_kernel(device: torch.device) -> str:
    """The kernel of `tree_attention: auto`: flex on CUDA, blockwise elsewhere."""
    return "flex" if device.type == "cuda" else "blockwise"


def tree_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                           tree_ends=None, tree_kernel=None, tree_block_mask=None, tree_blocks=None, sliding_window=None, softcap=None,
                           **kwargs):
    """transformers' attention interface: (output [1, T, Hq, d], None) for one packed row, through
    `tree_kernel` (KERNELS; None: `default_kernel` of the row's device)."""
    if tree_ends is None:
        raise BfspoError("tree attention needs the row's intervals (`tree_ends`): call the model through "
                         "bfspo.algorithm.packing.packed_logprobs")
    if sliding_window is not None or softcap is not None or dropout:
        raise BfspoError("tree attention supports full attention without soft-capping or dropout; the model "
                         f"asks for sliding_window={sliding_window}, softcap={softcap}, dropout={dropout}")
    if query.shape[0] != 1:
        raise BfspoError(f"tree attention takes one packed row, got a batch of {query.shape[0]}")
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    kernel = tree_kernel or default_kernel(query.device)
    if kernel == "flex":
        mask = interval_block_mask(tree_ends) if tree_block_mask is None else tree_block_mask
        out = flex_tree_attention(query, key, value, mask, scale)
    elif kernel == "blockwise":
        out = blockwise_attention(query, key, value, tree_ends, scale, plan=tree_blocks)
    else:
        raise BfspoError(f"unknown tree attention kernel {kernel!r}; expected one of {KERNELS}")
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


def tree_kwargs(ends: torch.Tensor, kernel: str) -> dict:
    """The keyword arguments that a model call passes on to its attention layers: the row's
    intervals, the kernel (KERNELS) and the kernel's block structure (flex: the BlockMask;
    blockwise: the BlockPlan), built once per forward rather than once per layer."""
    kwargs = {"tree_ends": ends, "tree_kernel": kernel}
    if kernel == "flex":
        kwargs["tree_block_mask"] = interval_block_mask(ends)
    elif kernel == "blockwise":
        kwargs["tree_blocks"] = BlockPlan(ends)
    return kwargs
