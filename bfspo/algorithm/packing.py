"""Tree-packed log-probs: each unique tree token's log pi_theta computed once (Sec. 4.2, Eq. 10), in
micro-batches of at most `micro_batch_tokens` tokens.

`plan_micro_batches` cuts trees into micro-batches; `pack_trees` lays one micro-batch out for one
forward pass and lists its loss entries; `packed_logprobs` runs the model and returns one log-prob
and one entropy per entry. The rest of the code only relies on what these functions return (the
tests pin it down against separate per-chain runs), so a faster layout can replace this one
without touching the trainer.

Layouts (one row: the rows of several trees are concatenated, without padding between them):

* "tree": per tree, the prompt, then every segment in depth-first order. Position ids are depths
  (prompt position + depth), and a token attends only to its tree's prompt and to its ancestors
  (itself included). In depth-first order the subtree of token j is the run [j, ends[j]), so the
  mask is one interval end per token: query k sees key j iff j <= k < ends[j]
  (bfspo.algorithm.tree_attention). Shared prefixes are computed once.
* "flat": one causal run per complete chain (prompt + root-to-leaf tokens): what DAPO computes.

Micro-batches (`plan_micro_batches`, tree layout): whole trees, first fit in order, while a
micro-batch holds at most `max_tokens` row tokens. A tree whose row is longer is cut into pieces
along its depth-first order: tokens lo..hi-1, preceded in their row by the prompt and by the
ancestors of token lo. Every ancestor of a later token of the piece that lies before lo is an
ancestor of lo (it precedes lo and its subtree reaches past lo), so each token of the piece still
sees exactly its own prompt and ancestors, and a piece of a tree costs
prompt + (depth(lo) - 1) + (hi - lo) row tokens. A piece holds the entries of its own tokens only;
the ancestors before lo are context. Splitting therefore changes no log-prob, only what one forward
pass holds; the loss keeps the global entry count as its normaliser (bfspo.training.trainer).

Entries (one log-prob each), decided by each tree's advantage kind:

* branch advantage (or none yet): one entry per unique tree token, in depth-first order;
* global advantage: one entry per token of each chain (chains in leaf order), since a shared token
  has one advantage per chain; in the tree layout the entries of a shared token read the same
  position, so it is still computed once.

A token's log-prob comes from the logits at its PARENT position (the last prompt token for the
first generated token); its entropy is the entropy AFTER it (at its own position), as stored in
the tree. Log-softmax and entropy go through the output head in chunks of `chunk_size` positions,
in the logsumexp form; with gradients on, a linear head saves only its input and the log-sum-exp and
recomputes the chunk's logits in the backward pass (`_LinearHeadChunk`; any other head runs under
activation checkpointing), so no float32 [tokens x vocab] tensor ever exists whole, in the forward
or in the backward pass. This assumes
logits = lm_head(last hidden state), true for Qwen2 and Llama (no logit soft-capping or scaling).

Padding (`pad_row`): the compiled flex kernel is compiled once per row length, so `packed_logprobs`
pads its row to the smallest of a few bucket lengths (`row_buckets`, bfspo.algorithm.attention_options)
with tokens that see only themselves and that no token sees; no entry reads them. The other
kernels take rows as they are.

What one micro-batch of T row tokens (T <= micro_batch_tokens, padding included), N needed
positions (N <= T) and E entries materialises, for a model with hidden size h, Hq query and Hkv key/value heads of size d,
vocabulary V, in the model's dtype unless said otherwise:

* inputs: input_ids, position_ids [1, T] and ends [T], int64; positions [N], parent, own,
  targets, tree_index, token_index [E], int64; old_logprobs, advantages [E], float32;
* the decoder's activations for T tokens, as for any causal LM forward of one row of T tokens
  (none of them T x T); the tree attention of each layer saves q [Hq, T, d], k and v [Hkv, T, d],
  its output [Hq, T, d] and a float32 log-sum-exp [Hq, T] for the backward pass, and holds at
  most one query block's float32 scores at a time; the blockwise kernel's masks, [block, keys] per
  query block, are built once per forward pass for all layers (bfspo.algorithm.tree_attention.BlockPlan);
* the last hidden state [T, h] and its needed rows [N, h];
* the output head, one chunk at a time: float32 logits [chunk_size, V] and the same-sized
  probabilities for the entropy (recomputed in the backward pass, one chunk at a time); per chunk
  a float32 log-sum-exp and entropy [chunk_size], kept for all N rows: [N] each;
* outputs: log-probs and entropies [E], float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from bfspo.algorithm.advantages import per_chain
from bfspo.algorithm.attention_options import ATTENTIONS, bucket_lengths, padded_length
from bfspo.algorithm.tree import SearchTree
from bfspo.algorithm.tree_attention import NAME as TREE_ATTENTION
from bfspo.algorithm.tree_attention import default_kernel, tree_attention_mode, tree_kwargs
from bfspo.errors import BfspoError

LAYOUTS = ("tree", "flat")
MASKED_ATTENTION = ("sdpa", "eager")  # implementations that apply a dense 4-D additive mask as given


@dataclass
class PackedBatch:
    """One row for one forward pass, and the loss entries read from it.

    T row tokens; N positions whose next-token distribution is needed; E entries.
    """

    input_ids: torch.Tensor  # [1, T] long
    position_ids: torch.Tensor  # [1, T] long
    ends: torch.Tensor  # [T] long: query k may attend key j iff j <= k < ends[j]
    positions: torch.Tensor  # [N] long: row index of each needed position
    parent: torch.Tensor  # [E] long: index into `positions` of the distribution the entry token was drawn from
    own: torch.Tensor  # [E] long: index into `positions` of the entry token itself (entropy after it)
    targets: torch.Tensor  # [E] long: the entry's token id
    old_logprobs: torch.Tensor  # [E] float32: log pi_old, from the tree
    advantages: torch.Tensor  # [E] float32: Eq. 9 or Eq. 1 (NaN where the tree has none yet)
    tree_index: torch.Tensor  # [E] long: which of the packed trees the entry belongs to
    token_index: torch.Tensor  # [E] long: the entry token's index in its tree's depth-first order
    layout: str
    n_unique_tokens: int  # tree tokens whose entries this batch holds (sum of |T| for whole trees)

    @property
    def n_entries(self) -> int:
        """The entries' count: |T| (branch) or sum_i |o_i| (global) over the packed tokens."""
        return int(self.targets.numel())

    def to(self, device) -> PackedBatch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return PackedBatch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in values.items()})

    @property
    def n_row_tokens(self) -> int:
        """T: the tokens of the row."""
        return int(self.input_ids.shape[1])

    def dense_mask(self) -> torch.Tensor:
        """[T, T] bool: query i may attend key j. Quadratic: the reference, for tests and benchmarks."""
        cols = torch.arange(self.ends.numel(), device=self.ends.device)
        return (cols.unsqueeze(0) <= cols.unsqueeze(1)) & (cols.unsqueeze(1) < self.ends.unsqueeze(0))


@dataclass
class TreeTokens:
    """One tree's generated tokens in depth-first order (the order of its packed row)."""

    prompt: np.ndarray  # [P] prompt ids
    ids: np.ndarray  # [n] token ids
    depth: np.ndarray  # [n] depth (1: the first generated token)
    parent: np.ndarray  # [n] index of the parent token; -1: the prompt's last token
    end: np.ndarray  # [n] end (exclusive) of the token's subtree
    logprobs: np.ndarray  # [n] log pi_old, from the tree
    advantage: np.ndarray  # [n] the segment's advantage (Eq. 9), NaN where unset
    chains: list[tuple[float, np.ndarray]]  # per leaf (leaf order): (its advantage, its path's token indices)


def _ints(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def tree_tokens(tree: SearchTree) -> TreeTokens:
    """The arrays of one tree's depth-first token order: a loop over segments, none over tokens."""
    order = tree.dfs()
    size = {}
    for s in reversed(order):  # tokens in the subtree of each segment
        seg = tree.segments[s]
        size[s] = len(seg.token_ids) + sum(size[c] for c in seg.children)
    ids, logprobs, advantage, parent, depth, end = [], [], [], [], [], []
    offset = {}
    for s in order:
        seg = tree.segments[s]
        o, m = len(ids), len(seg.token_ids)
        offset[s] = o
        ids += seg.token_ids
        logprobs += seg.logprobs
        advantage += [np.nan if seg.advantage is None else seg.advantage] * m
        parent.append(-1 if seg.parent is None else offset[seg.parent] + len(tree.segments[seg.parent].token_ids) - 1)
        parent += range(o, o + m - 1)
        depth += range(seg.start, seg.start + m)
        end += [o + size[s]] * m
    chains = []
    for leaf in tree.leaves():
        path = [np.arange(offset[s], offset[s] + len(tree.segments[s].token_ids)) for s in tree.path(leaf)]
        adv = tree.segments[leaf].leaf.advantage
        chains.append((np.nan if adv is None else adv, np.concatenate(path)))
    return TreeTokens(prompt=_ints(tree.prompt_ids), ids=_ints(ids), depth=_ints(depth), parent=_ints(parent),
                      end=_ints(end), logprobs=np.asarray(logprobs, dtype=np.float64),
                      advantage=np.asarray(advantage, dtype=np.float64), chains=chains)


def n_entries(tree: SearchTree) -> int:
    """Loss entries of a whole tree: |T| (per-segment advantages, Eq. 10) or sum_i |o_i| (per chain, Eq. 2)."""
    return tree.n_chain_tokens if per_chain(tree) else tree.n_tokens


@dataclass(frozen=True)
class Piece:
    """Tokens lo..hi-1 (depth-first order) of trees[tree], in a row after its prompt and the
    ancestors of token lo; `tokens` is that row's length. A whole tree is lo = 0, hi = |T|."""

    tree: int
    lo: int
    hi: int
    tokens: int


def plan_micro_batches(trees: Sequence[SearchTree], max_tokens: int) -> list[list[Piece]]:
    """Micro-batches of at most `max_tokens` row tokens: whole trees, first fit in order; a tree
    longer than `max_tokens` is cut into pieces along its depth-first order (see the module doc),
    each as long as the budget allows. A chain that alone exceeds the budget is an error."""
    pieces = []
    for i, tree in enumerate(trees):
        p, n = len(tree.prompt_ids), tree.n_tokens
        if p + n <= max_tokens:
            pieces.append(Piece(i, 0, n, p + n))
            continue
        depth = tree_tokens(tree).depth
        lo = 0
        while lo < n:
            context = p + int(depth[lo]) - 1
            if context >= max_tokens:
                raise BfspoError(f"micro_batch_tokens={max_tokens} cannot hold one token of a chain: its prompt "
                                 f"({p} tokens) and its {int(depth[lo]) - 1} ancestors already fill it; raise "
                                 "micro_batch_tokens above the longest prompt plus the budget")
            hi = min(n, lo + max_tokens - context)
            pieces.append(Piece(i, lo, hi, context + hi - lo))
            lo = hi
    batches: list[list[Piece]] = []
    free: list[int] = []
    for piece in pieces:
        slot = next((b for b, room in enumerate(free) if room >= piece.tokens), None)
        if slot is None:
            batches.append([])
            free.append(max_tokens)
            slot = len(batches) - 1
        batches[slot].append(piece)
        free[slot] -= piece.tokens
    return batches


def _ancestors(parent: np.ndarray, x: int) -> np.ndarray:
    """Indices of the ancestors of token x (root first)."""
    out = []
    x = int(parent[x])
    while x >= 0:
        out.append(x)
        x = int(parent[x])
    return _ints(out[::-1])


def pack_trees(trees: Sequence[SearchTree], layout: str = "tree", pieces: Sequence[Piece] | None = None) -> PackedBatch:
    """Lay out whole trees (or, in the tree layout, the given `pieces` of them) as one row for
    `packed_logprobs`, and list their loss entries (see the module doc)."""
    if layout not in LAYOUTS:
        raise BfspoError(f"unknown packing layout {layout!r}; expected one of {LAYOUTS}")
    if not trees:
        raise ValueError("pack_trees needs at least one tree")
    if pieces is not None and layout != "tree":
        raise ValueError("pieces of trees are rows of the tree layout")
    cache: dict[int, TreeTokens] = {}

    def tokens_of(i: int) -> TreeTokens:
        if i not in cache:
            cache[i] = tree_tokens(trees[i])
        return cache[i]

    rows: list[tuple] = []  # (ids, positions, ends) of each run, ends relative to the run
    entries: list[tuple] = []  # (tree, token index, own column, parent column, advantage) arrays, columns in the run
    offset = 0
    unique = 0
    if layout == "tree":
        whole = [Piece(i, 0, t.n_tokens, len(t.prompt_ids) + t.n_tokens) for i, t in enumerate(trees)]
        for piece in whole if pieces is None else pieces:
            tt, tree = tokens_of(piece.tree), trees[piece.tree]
            p = len(tt.prompt)
            sub = np.concatenate([_ancestors(tt.parent, piece.lo), np.arange(piece.lo, piece.hi)])
            n = len(sub)
            rows.append((np.concatenate([tt.prompt, tt.ids[sub]]), np.concatenate([np.arange(p), p - 1 + tt.depth[sub]]),
                         np.concatenate([np.full(p, p + n), p + np.searchsorted(sub, tt.end[sub])])))
            if per_chain(tree):
                paths = np.concatenate([c for _, c in tt.chains])
                adv = np.repeat([a for a, _ in tt.chains], [len(c) for _, c in tt.chains])
                keep = (paths >= piece.lo) & (paths < piece.hi)
                tok, adv = paths[keep], adv[keep]
            else:
                tok = np.arange(piece.lo, piece.hi)
                adv = tt.advantage[tok]
            own = p + n - (piece.hi - tok)  # the piece's tokens close the run
            par = tt.parent[tok]
            par_col = np.where(par < 0, p - 1, p + np.searchsorted(sub, np.maximum(par, 0)))
            entries.append((piece.tree, tok, offset + own, offset + par_col, adv))
            offset += p + n
            unique += piece.hi - piece.lo
    else:
        for i, tree in enumerate(trees):
            tt = tokens_of(i)
            p = len(tt.prompt)
            first = np.full(len(tt.ids), -1, dtype=np.int64)  # run start of the first chain holding each token
            for adv, path in tt.chains:
                n = len(path)
                rows.append((np.concatenate([tt.prompt, tt.ids[path]]), np.arange(p + n), np.full(p + n, p + n)))
                if per_chain(tree):
                    own = offset + p + np.arange(n)
                    entries.append((i, path, own, own - 1, np.full(n, adv)))
                fresh = path[first[path] < 0]
                first[fresh] = offset
                offset += p + n
            if not per_chain(tree):
                tok = np.arange(len(tt.ids))
                own = first + p + tt.depth - 1
                entries.append((i, tok, own, own - 1, tt.advantage))
            unique += tree.n_tokens

    run_starts = np.cumsum([0] + [len(ids) for ids, _, _ in rows[:-1]])
    ends = np.concatenate([start + e for start, (_, _, e) in zip(run_starts, rows)])
    own = np.concatenate([e[2] for e in entries])
    par = np.concatenate([e[3] for e in entries])
    needed = np.unique(np.concatenate([par, own]))
    def long(values) -> torch.Tensor:
        return torch.as_tensor(_ints(values))

    return PackedBatch(
        input_ids=long(np.concatenate([ids for ids, _, _ in rows])).unsqueeze(0),
        position_ids=long(np.concatenate([pos for _, pos, _ in rows])).unsqueeze(0),
        ends=long(ends), positions=long(needed),
        parent=long(np.searchsorted(needed, par)), own=long(np.searchsorted(needed, own)),
        targets=long(np.concatenate([tokens_of(t).ids[tok] for t, tok, *_ in entries])),
        old_logprobs=torch.as_tensor(np.concatenate([tokens_of(t).logprobs[tok] for t, tok, *_ in entries]),
                                     dtype=torch.float32),
        advantages=torch.as_tensor(np.concatenate([e[4] for e in entries]), dtype=torch.float32),
        tree_index=long(np.concatenate([np.full(len(tok), t) for t, tok, *_ in entries])),
        token_index=long(np.concatenate([tok for _, tok, *_ in entries])), layout=layout, n_unique_tokens=int(unique),
    )


PAD_ID = 0  # the token id of padding (any id of the vocabulary: nothing reads its output)


def pad_row(packed: PackedBatch, length: int) -> PackedBatch:
    """The row followed by `length - T` padding tokens, for a kernel compiled for rows of `length`
    tokens. Each padding token j is its own interval [j, j + 1): it sees itself only (a query needs
    one key: a softmax over none is undefined) and no other token sees it, since every real token's
    interval ends within the real row. No entry reads a padding position, so padding changes no
    log-prob, entropy or gradient (tests/test_packing.py)."""
    t = packed.n_row_tokens
    if length < t:
        raise ValueError(f"cannot pad a row of {t} tokens to {length}")
    extra = length - t
    device = packed.input_ids.device
    return PackedBatch(**{f.name: getattr(packed, f.name) for f in fields(packed)} | dict(
        input_ids=torch.cat([packed.input_ids, torch.full((1, extra), PAD_ID, dtype=torch.long, device=device)], 1),
        position_ids=torch.cat([packed.position_ids, torch.zeros((1, extra), dtype=torch.long, device=device)], 1),
        ends=torch.cat([packed.ends, torch.arange(t + 1, length + 1, dtype=torch.long, device=device)])))


def resolve_attention(attention: str, device: torch.device) -> str:
    """The kernel that `attention` (ATTENTIONS) names on `device`: auto is flex on CUDA, blockwise elsewhere."""
    if attention not in ATTENTIONS:
        raise BfspoError(f"unknown tree attention {attention!r}; expected one of {ATTENTIONS}")
    return default_kernel(device) if attention == "auto" else attention


def attention_mode(model: torch.nn.Module, attention: str):
    """A context that holds `model`'s attention for `attention` (ATTENTIONS) across a forward and a
    backward pass (gradient checkpointing recomputes the attention in the backward pass): the tree
    kernels' `tree_attention_mode`, or the model's own attention for the dense reference."""
    if resolve_attention(attention, next(model.parameters()).device) == "dense":
        return nullcontext()
    return tree_attention_mode(model)


def row_buckets(attention: str, device: torch.device, max_tokens: int, step: int) -> tuple[int, ...]:
    """The lengths that rows of at most `max_tokens` tokens are padded to (`pad_row`): the bucket
    lengths of bfspo.algorithm.attention_options where `attention` runs the compiled flex kernel,
    which compiles once per row length; none (rows as they are) for the other kernels."""
    return bucket_lengths(max_tokens, step) if resolve_attention(attention, device) == "flex" else ()


def _head_chunk(head, hidden: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor):
    """Log-sum-exp and entropy of every row of head(hidden), and the target logits of the given rows."""
    logits = head(hidden).float()
    lse = torch.logsumexp(logits, dim=-1)
    with torch.no_grad():
        probs = torch.exp(logits - lse.unsqueeze(-1))
        entropy = lse - (probs * logits).sum(-1)
    return lse, entropy, logits[rows, targets]


class _LinearHeadChunk(torch.autograd.Function):
    """`_head_chunk` of a linear head (an nn.Linear: weight [V, h], bias [V] or None, passed again as
    inputs so that their gradients flow) that saves only its inputs and
    the log-sum-exp, and recomputes the logits once in the backward pass: with S = logits,
    d lse / dS = softmax(S) = exp(S - lse) and d S[row, target] / dS is one-hot, so
    dS = g_lse exp(S - lse) + scatter(g_target), dhidden = dS W, dW = dS^T hidden, dbias = sum dS.
    The entropy carries no gradient. (Activation checkpointing computes the same, but runs the
    entropy again and builds the gradients of the logits through two autograd nodes.)"""

    @staticmethod
    def forward(ctx, hidden, weight, bias, head, rows, targets):
        lse, entropy, target = _head_chunk(head, hidden, rows, targets)
        ctx.save_for_backward(hidden, weight, bias, rows, targets, lse)
        ctx.head = head
        ctx.mark_non_differentiable(entropy)
        return lse, entropy, target

    @staticmethod
    def backward(ctx, grad_lse, _grad_entropy, grad_target):
        hidden, weight, bias, rows, targets, lse = ctx.saved_tensors
        logits = ctx.head(hidden).float()
        grad = torch.exp(logits - lse.unsqueeze(-1)).mul_(grad_lse.unsqueeze(-1))
        grad.index_put_((rows, targets), grad_target, accumulate=True)
        grad = grad.to(hidden.dtype)
        grad_hidden = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad.t() @ hidden if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if bias is not None and ctx.needs_input_grad[2] else None
        return grad_hidden, grad_weight, grad_bias, None, None, None


def _head_chunk_with_grad(head: torch.nn.Module, hidden: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor):
    """`_head_chunk` under autograd without keeping the [chunk, V] logits: `_LinearHeadChunk` for a
    plain linear head, activation checkpointing for any other (a LoRA-wrapped head)."""
    if type(head) is torch.nn.Linear:
        return _LinearHeadChunk.apply(hidden, head.weight, head.bias, head, rows, targets)
    return checkpoint(_head_chunk, head, hidden, rows, targets, use_reentrant=False)


def packed_logprobs(model: torch.nn.Module, packed: PackedBatch, chunk_size: int = 1024, attention: str = "auto",
                    buckets: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [E], entropies [E]) of the packed entries under `model` (float32).

    log-probs carry gradients when autograd is on; entropies (after each entry token) never do.
    `model` is a causal LM (or a peft wrapper of one) with get_decoder() and get_output_embeddings().
    attention (ATTENTIONS): "flex" or "blockwise", the interval kernels of
    bfspo.algorithm.tree_attention (memory linear in the tokens), "auto" (flex on CUDA, blockwise
    elsewhere), or "dense", the model's own sdpa or eager attention under a [T, T] additive mask (the
    reference: quadratic memory). buckets: lengths the row is padded to (the smallest that holds it,
    `pad_row`) before the model runs; `row_buckets` gives those of the compiled flex kernel.
    """
    kernel = resolve_attention(attention, packed.input_ids.device)
    body, head = model.get_decoder(), model.get_output_embeddings()
    device = packed.input_ids.device
    row = pad_row(packed, padded_length(packed.n_row_tokens, buckets)) if buckets else packed
    if kernel != "dense":
        if (torch.is_grad_enabled() and getattr(model, "is_gradient_checkpointing", False)
                and model.config._attn_implementation != TREE_ATTENTION):
            raise BfspoError("gradient checkpointing recomputes the attention in the backward pass: run the forward "
                             "and the backward pass inside bfspo.algorithm.tree_attention.tree_attention_mode(model)")
        with tree_attention_mode(model):
            hidden = body(input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False,
                          **tree_kwargs(row.ends, kernel)).last_hidden_state
    else:
        attn = model.config._attn_implementation
        if attn not in MASKED_ATTENTION:
            raise BfspoError(f"the dense reference needs an attention implementation that takes a 4-D mask "
                             f"{MASKED_ATTENTION}, the model uses {attn!r}")
        dtype = model.get_input_embeddings().weight.dtype
        allowed = row.dense_mask()
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
        hidden = body(input_ids=row.input_ids, attention_mask=mask[None, None], position_ids=row.position_ids,
                      use_cache=False).last_hidden_state
    hidden = hidden[0][packed.positions]

    order = torch.argsort(packed.parent, stable=True)  # entries grouped by the chunk of their parent
    sorted_parent = packed.parent[order]
    bounds = torch.searchsorted(sorted_parent, torch.arange(0, hidden.shape[0] + chunk_size, chunk_size, device=device))
    lse_parts, entropy_parts, target_parts = [], [], []
    for c, start in enumerate(range(0, hidden.shape[0], chunk_size)):
        lo, hi = int(bounds[c]), int(bounds[c + 1])
        rows = sorted_parent[lo:hi] - start
        targets = packed.targets[order[lo:hi]]
        args = (head, hidden[start:start + chunk_size], rows, targets)
        if torch.is_grad_enabled() and hidden.requires_grad:
            lse, entropy, target = _head_chunk_with_grad(*args)
        else:
            lse, entropy, target = _head_chunk(*args)
        lse_parts.append(lse)
        entropy_parts.append(entropy)
        target_parts.append(target)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=device)
    target_logits = torch.cat(target_parts)[inverse]
    return target_logits - torch.cat(lse_parts)[packed.parent], torch.cat(entropy_parts)[packed.own]
