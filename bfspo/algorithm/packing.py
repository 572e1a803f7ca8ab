"""Tree-packed log-probs: each unique tree token's log pi_theta computed once (Sec. 4.2, Eq. 10).

`pack_trees` lays trees out as rows for one forward pass and lists the loss entries;
`packed_logprobs` runs the model and returns one log-prob and one entropy per entry. The rest of
the code only relies on what these two functions return (the tests pin it down against separate
per-chain runs), so a faster layout can replace this one without touching the trainer.

Layouts:

* "tree": one row per tree: the prompt, then every segment in depth-first order. Position ids are
  depths (prompt position + depth), and a token attends only to the prompt and to its ancestors
  (itself included), through a 4-D additive attention mask that transformers passes to the
  attention kernel unchanged (sdpa and eager both accept it). Shared prefixes are computed once.
* "flat": one row per complete chain (prompt + root-to-leaf tokens), causal: what DAPO computes.

Entries (one log-prob each), decided by each tree's advantage kind:

* branch advantage (or none yet): one entry per unique tree token, in depth-first order;
* global advantage: one entry per token of each chain (chains in leaf order), since a shared token
  has one advantage per chain; in the tree layout the entries of a shared token read the same
  position, so it is still computed once.

A token's log-prob comes from the logits at its PARENT position (the last prompt token for the
first generated token); its entropy is the entropy AFTER it (at its own position), as stored in
the tree. Log-softmax and entropy go through the output head in chunks of rows, in the logsumexp
form, and under activation checkpointing when gradients are on, so no float32 [tokens x vocab]
tensor ever exists whole, in the forward or in the backward pass. This assumes
logits = lm_head(last hidden state), true for Qwen2 and Llama (no logit soft-capping or scaling).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch
from torch.utils.checkpoint import checkpoint

from bfspo.errors import BfspoError
from bfspo.algorithm.tree import SearchTree

LAYOUTS = ("tree", "flat")
MASKED_ATTENTION = ("sdpa", "eager")  # implementations that apply a dense 4-D additive mask as given
NAN = float("nan")


@dataclass
class PackedBatch:
    """Rows for one forward pass, and the loss entries read from it.

    R rows of length L; N positions whose next-token distribution is needed; E entries.
    """

    input_ids: torch.Tensor  # [R, L] long (padding: token 0, never read)
    position_ids: torch.Tensor  # [R, L] long
    allowed: torch.Tensor  # [R, L, L] bool: query i may attend key j
    positions: torch.Tensor  # [N] long: flat index row * L + col of each needed position
    parent: torch.Tensor  # [E] long: index into `positions` of the distribution the entry token was drawn from
    own: torch.Tensor  # [E] long: index into `positions` of the entry token itself (entropy after it)
    targets: torch.Tensor  # [E] long: the entry's token id
    old_logprobs: torch.Tensor  # [E] float32: log pi_old, from the tree
    advantages: torch.Tensor  # [E] float32: Eq. 9 or Eq. 1 (NaN where the tree has none yet)
    tree_index: torch.Tensor  # [E] long: which of the packed trees the entry belongs to
    layout: str
    n_unique_tokens: int  # sum of |T| over the packed trees

    @property
    def n_entries(self) -> int:
        """The normaliser of the loss: |T| (branch) or sum_i |o_i| (global) over the packed trees."""
        return int(self.targets.numel())

    def to(self, device) -> "PackedBatch":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return PackedBatch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in values.items()})


Row = tuple[list[int], list[int]]  # token ids, parent column of each


def _rows(tree: SearchTree, layout: str) -> tuple[list[Row], dict[tuple[int, int], dict[int, int]]]:
    """The rows of one tree as (token ids, parent column of each), and where each token sits.

    `where[(s, j)]` maps row -> column of token j of segment s in every row that holds it; the key
    (-1, -1) stands for the last prompt token. The prompt's first token has parent column -1.
    """
    prompt = list(tree.prompt_ids)
    where: dict[tuple[int, int], dict[int, int]] = {(-1, -1): {}}
    if layout == "tree":
        ids, parents, last_col = list(prompt), list(range(-1, len(prompt) - 1)), {}
        for s in tree.dfs():
            seg = tree.segments[s]
            col = len(prompt) - 1 if seg.parent is None else last_col[seg.parent]
            for j, t in enumerate(seg.token_ids):
                ids.append(t)
                parents.append(col)
                col = len(ids) - 1
                where[(s, j)] = {0: col}
            last_col[s] = col
        where[(-1, -1)][0] = len(prompt) - 1
        return [(ids, parents)], where
    rows = []
    for r, leaf in enumerate(tree.leaves()):
        ids = list(prompt)
        for s in tree.path(leaf):
            for j, t in enumerate(tree.segments[s].token_ids):
                ids.append(t)
                where.setdefault((s, j), {})[r] = len(ids) - 1
        where[(-1, -1)][r] = len(prompt) - 1
        rows.append((ids, list(range(-1, len(ids) - 1))))
    return rows, where


def pack_trees(trees: Sequence[SearchTree], layout: str = "tree") -> PackedBatch:
    """Lay out whole trees for `packed_logprobs` and list their loss entries (see the module doc)."""
    if layout not in LAYOUTS:
        raise BfspoError(f"unknown packing layout {layout!r}; expected one of {LAYOUTS}")
    if not trees:
        raise ValueError("pack_trees needs at least one tree")
    all_rows: list[Row] = []
    entries: list[tuple] = []  # (tree, row, parent column, own column, token id, old log-prob, advantage)
    for ti, tree in enumerate(trees):
        rows, where = _rows(tree, layout)

        def entry(s: int, j: int, row: int, adv: float | None) -> None:
            seg = tree.segments[s]
            if j > 0:
                prev = (s, j - 1)
            else:
                prev = (-1, -1) if seg.parent is None else (seg.parent, len(tree.segments[seg.parent].token_ids) - 1)
            entries.append((ti, len(all_rows) + row, where[prev][row], where[(s, j)][row], seg.token_ids[j],
                            seg.logprobs[j], NAN if adv is None else adv))

        if tree.advantage_kind == "global":  # one entry per token of each chain
            for r, leaf in enumerate(tree.leaves()):
                for s in tree.path(leaf):
                    for j in range(len(tree.segments[s].token_ids)):
                        entry(s, j, 0 if layout == "tree" else r, tree.segments[leaf].leaf.advantage)
        else:  # one entry per unique token (in the flat layout: read from the first chain holding it)
            for s in tree.dfs():
                for j in range(len(tree.segments[s].token_ids)):
                    entry(s, j, min(where[(s, j)]), tree.segments[s].advantage)
        all_rows.extend(rows)

    length = max(len(ids) for ids, _ in all_rows)
    n_rows = len(all_rows)
    input_ids = torch.zeros(n_rows, length, dtype=torch.long)
    position_ids = torch.zeros(n_rows, length, dtype=torch.long)
    allowed = torch.zeros(n_rows, length, length, dtype=torch.bool)
    for r, (ids, parents) in enumerate(all_rows):
        input_ids[r, :len(ids)] = torch.tensor(ids)
        for i, p in enumerate(parents):  # parents come before children
            if p >= 0:
                allowed[r, i] = allowed[r, p]
                position_ids[r, i] = position_ids[r, p] + 1
            allowed[r, i, i] = True
        allowed[r, range(len(ids), length), range(len(ids), length)] = True  # padding sees itself only

    flat = [(row * length + pc, row * length + oc) for _, row, pc, oc, *_ in entries]
    needed = sorted({x for pair in flat for x in pair})
    index = {x: i for i, x in enumerate(needed)}
    return PackedBatch(
        input_ids=input_ids, position_ids=position_ids, allowed=allowed,
        positions=torch.tensor(needed, dtype=torch.long),
        parent=torch.tensor([index[p] for p, _ in flat], dtype=torch.long),
        own=torch.tensor([index[o] for _, o in flat], dtype=torch.long),
        targets=torch.tensor([e[4] for e in entries], dtype=torch.long),
        old_logprobs=torch.tensor([e[5] for e in entries], dtype=torch.float32),
        advantages=torch.tensor([e[6] for e in entries], dtype=torch.float32),
        tree_index=torch.tensor([e[0] for e in entries], dtype=torch.long),
        layout=layout, n_unique_tokens=sum(t.n_tokens for t in trees),
    )


def _head_chunk(head: torch.nn.Module, hidden: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor):
    """Log-sum-exp and entropy of every row of head(hidden), and the target logits of the given rows."""
    logits = head(hidden).float()
    lse = torch.logsumexp(logits, dim=-1)
    with torch.no_grad():
        probs = torch.exp(logits - lse.unsqueeze(-1))
        entropy = lse - (probs * logits).sum(-1)
    return lse, entropy, logits[rows, targets]


def packed_logprobs(model: torch.nn.Module, packed: PackedBatch,
                    chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [E], entropies [E]) of the packed entries under `model` (float32).

    log-probs carry gradients when autograd is on; entropies (after each entry token) never do.
    `model` is a causal LM (or a peft wrapper of one) with get_decoder() and get_output_embeddings().
    """
    attn = model.config._attn_implementation
    if attn not in MASKED_ATTENTION:
        raise BfspoError(f"tree packing needs an attention implementation that takes a 4-D mask "
                         f"{MASKED_ATTENTION}, the model uses {attn!r}")
    body, head = model.get_decoder(), model.get_output_embeddings()
    device = packed.input_ids.device
    dtype = model.get_input_embeddings().weight.dtype
    mask = torch.zeros(packed.allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~packed.allowed, torch.finfo(dtype).min)
    hidden = body(input_ids=packed.input_ids, attention_mask=mask.unsqueeze(1),
                  position_ids=packed.position_ids, use_cache=False).last_hidden_state
    hidden = hidden.reshape(-1, hidden.shape[-1])[packed.positions]

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
            lse, entropy, target = checkpoint(_head_chunk, *args, use_reentrant=False)
        else:
            lse, entropy, target = _head_chunk(*args)
        lse_parts.append(lse)
        entropy_parts.append(entropy)
        target_parts.append(target)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=device)
    target_logits = torch.cat(target_parts)[inverse]
    return target_logits - torch.cat(lse_parts)[packed.parent], torch.cat(entropy_parts)[packed.own]
