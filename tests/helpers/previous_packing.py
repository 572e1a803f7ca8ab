"""The tree packer that bfspo.algorithm.packing replaced (issue 21), frozen as the reference of
the vectorised one: tests/test_packing.py checks that both give the same rows and entries, and
bench/bench_packing.py times both. It builds one right-padded row per tree (tree layout) or per
chain (flat) with a per-position Python loop, and a dense [rows, L, L] bool mask."""

from types import SimpleNamespace

import torch


def previous_pack_trees(trees, layout="tree"):
    """Rows, mask and entries as the previous `pack_trees` made them (its fields, plus each row's
    real length in `lengths`)."""
    all_rows, entries = [], []
    for ti, tree in enumerate(trees):
        prompt = list(tree.prompt_ids)
        where = {(-1, -1): {}}
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
            rows = [(ids, parents)]
        else:
            rows = []
            for r, leaf in enumerate(tree.leaves()):
                ids = list(prompt)
                for s in tree.path(leaf):
                    for j, t in enumerate(tree.segments[s].token_ids):
                        ids.append(t)
                        where.setdefault((s, j), {})[r] = len(ids) - 1
                where[(-1, -1)][r] = len(prompt) - 1
                rows.append((ids, list(range(-1, len(ids) - 1))))

        def entry(s, j, row, adv):
            seg = tree.segments[s]
            if j > 0:
                prev = (s, j - 1)
            else:
                prev = (-1, -1) if seg.parent is None else (seg.parent, len(tree.segments[seg.parent].token_ids) - 1)
            entries.append((ti, len(all_rows) + row, where[prev][row], where[(s, j)][row], seg.token_ids[j],
                            seg.logprobs[j], float("nan") if adv is None else adv))

        if tree.advantage_kind == "global":
            for r, leaf in enumerate(tree.leaves()):
                for s in tree.path(leaf):
                    for j in range(len(tree.segments[s].token_ids)):
                        entry(s, j, 0 if layout == "tree" else r, tree.segments[leaf].leaf.advantage)
        else:
            for s in tree.dfs():
                for j in range(len(tree.segments[s].token_ids)):
                    entry(s, j, min(where[(s, j)]), tree.segments[s].advantage)
        all_rows.extend(rows)

    length = max(len(ids) for ids, _ in all_rows)
    input_ids = torch.zeros(len(all_rows), length, dtype=torch.long)
    position_ids = torch.zeros(len(all_rows), length, dtype=torch.long)
    allowed = torch.zeros(len(all_rows), length, length, dtype=torch.bool)
    for r, (ids, parents) in enumerate(all_rows):
        input_ids[r, :len(ids)] = torch.tensor(ids)
        for i, p in enumerate(parents):
            if p >= 0:
                allowed[r, i] = allowed[r, p]
                position_ids[r, i] = position_ids[r, p] + 1
            allowed[r, i, i] = True
        allowed[r, range(len(ids), length), range(len(ids), length)] = True
    flat = [(row * length + pc, row * length + oc) for _, row, pc, oc, *_ in entries]
    needed = sorted({x for pair in flat for x in pair})
    index = {x: i for i, x in enumerate(needed)}
    return SimpleNamespace(
        lengths=[len(ids) for ids, _ in all_rows], input_ids=input_ids, position_ids=position_ids, allowed=allowed,
        positions=torch.tensor(needed), parent=torch.tensor([index[p] for p, _ in flat]),
        own=torch.tensor([index[o] for _, o in flat]), targets=torch.tensor([e[4] for e in entries]),
        old_logprobs=torch.tensor([e[5] for e in entries], dtype=torch.float32),
        advantages=torch.tensor([e[6] for e in entries], dtype=torch.float32),
        tree_index=torch.tensor([e[0] for e in entries]), n_unique_tokens=sum(t.n_tokens for t in trees))
