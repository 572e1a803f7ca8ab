"""One logged search tree (SearchTree.to_dict) as text: what `bfspo tree show` prints and what the
trainer's W&B table of sample trees holds.

Backtracking tokens w^b are marked [[like this]], as the highlighted tokens of the paper's Fig. 5.
The text has three parts: a summary with every expansion, the path selected at each iteration (and
the final best path) as full text, and the tree as an indented outline of segments.
"""

from __future__ import annotations

from collections.abc import Callable

from bfspo.algorithm.tree import SearchTree


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3f}"


def render_tree(d: dict, decode: Callable[[list[int]], list[str]] | None = None, title: str = "tree") -> str:
    """The text rendering of one SearchTree.to_dict() (see the module doc)."""
    tree = SearchTree.from_dict(d)
    decoded = tree.segment_texts(decode) if decode else None
    texts = {}
    for s, raw in zip(tree.segments, d["segments"]):
        pieces = raw.get("text") or (decoded[s.id] if decoded else [f"<{t}>" for t in s.token_ids])
        if s.ends_in_B:
            pieces = pieces[:-1] + [f"[[{pieces[-1]}]]"]
        texts[s.id] = "".join(pieces)

    def path_text(leaf: int) -> str:
        return "".join(texts[s] for s in tree.path(leaf))

    leaves = tree.leaves()
    lines = [f"{title}: prompt {len(tree.prompt_ids)} tokens, budget {tree.budget}, {len(leaves)} leaves "
             f"({tree.n_correct} correct), {tree.n_tokens} unique tokens, {tree.n_chain_tokens} chain tokens, "
             f"advantage {tree.advantage_kind or '-'}, root reward {_fmt(tree.root_reward)}"]
    if tree.meta:
        lines.append(f"meta: {tree.meta}")
    for b in tree.backtracking:
        lines.append(f"expansion {b['iteration']}: w^b at depth {b['depth']} on a path of {b['path_length']} tokens "
                     f"(leaf {b['leaf']}), entropy {b['entropy']:.3f}")
    if tree.stopped:
        lines.append(f"stopped at iteration {tree.stopped['iteration']}: {tree.stopped['reason']}")
    lines += ["", "selected paths (backtracking tokens in [[...]]):"]
    picks = [(f"o_{x['iteration']}", x["leaf"]) for x in tree.selected]
    if d.get("best"):
        picks.append(("best", d["best"]["leaf"]))
    for name, leaf in picks:
        lines.append(f"{name} (leaf {leaf}, {tree.segments[leaf].leaf.length} tokens): {path_text(leaf)!r}")
    if not picks:
        lines.append("(none: no correct path)")
    lines += ["", "tree (one line per segment):"]
    depth = {None: -1}
    for s in tree.dfs():
        seg = tree.segments[s]
        depth[s] = depth[seg.parent] + 1
        info = (f"seg {s} [iteration {seg.iteration}, depth {seg.start}-{seg.end}] "
                f"R {_fmt(seg.reward)} A {_fmt(seg.advantage)}")
        if seg.leaf is not None:
            info += (f" | leaf {'correct' if seg.leaf.correct else 'wrong'}, {seg.leaf.length} tokens"
                     f"{'' if seg.leaf.finished else ' (truncated)'}, reward {_fmt(seg.leaf.reward)}")
            if seg.leaf.advantage is not None:
                info += f", chain advantage {_fmt(seg.leaf.advantage)}"
        lines.append(f"{'  ' * depth[s]}- {info}: {texts[s]!r}")
    return "\n".join(lines)
