"""`bfspo tree show FILE [--index N]`: render logged search trees (SearchTree.to_dict lines) as text.
`bfspo tree stats RUN_DIR|FILE ...`: where their training signal goes (bfspo/reporting/tree_stats.py).

Backtracking tokens w^b are marked [[like this]], as the highlighted tokens of the paper's Fig. 5.
The output has three parts per tree: a summary with every expansion, the path selected at each
iteration (and the final best path) as full text, and the tree as an indented outline of segments.
Token text comes from the "text" the trainer logged with each segment, else from --tokenizer,
else token ids are shown as <id>.
"""

from __future__ import annotations

import argparse
from typing import Callable

from bfspo.errors import BfspoError
from bfspo.io import read_jsonl
from bfspo.algorithm.tree import SearchTree


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    show = sub.add_parser("show", help="render the trees of a trees/step_*.jsonl file as text")
    show.add_argument("file", help="JSONL file with one SearchTree.to_dict() per line")
    show.add_argument("--index", type=int, default=None, help="render only the tree on this line (0-based)")
    show.add_argument("--tokenizer", default=None, help="tokenizer (model dir) to decode trees logged without text")
    stats = sub.add_parser("stats", help="signal statistics of logged trees, one block per run directory or file")
    stats.add_argument("paths", nargs="+", help="run directories (their trees/step_*.jsonl) or tree files")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3f}"


def render_tree(d: dict, decode: Callable[[list[int]], list[str]] | None = None, title: str = "tree") -> str:
    """The text rendering of one SearchTree.to_dict() (see the module doc)."""
    tree = SearchTree.from_dict(d)
    texts = {}
    for s, raw in zip(tree.segments, d["segments"]):
        pieces = raw.get("text") or (decode(s.token_ids) if decode else [f"<{t}>" for t in s.token_ids])
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


def run(args: argparse.Namespace) -> int:
    return _show(args) if args.action == "show" else _stats(args)


def _stats(args: argparse.Namespace) -> int:
    from bfspo.reporting.tree_stats import format_stats, read_trees, tree_files, tree_stats

    for n, path in enumerate(args.paths):
        print(("\n" if n else "") + format_stats(path, tree_stats(read_trees(tree_files([path])))))
    return 0


def _show(args: argparse.Namespace) -> int:
    rows = list(read_jsonl(args.file))
    if args.index is not None and not 0 <= args.index < len(rows):
        raise BfspoError(f"{args.file}: --index {args.index} out of range (the file holds {len(rows)} trees)")
    picked = list(enumerate(rows)) if args.index is None else [(args.index, rows[args.index])]
    decode = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(args.tokenizer)
        except (OSError, ValueError) as e:
            raise BfspoError(f"cannot load tokenizer {args.tokenizer!r}: {e}") from None

        def decode(ids: list[int]) -> list[str]:
            return [tok.decode([i]) for i in ids]

    for n, (i, (lineno, d)) in enumerate(picked):
        try:
            text = render_tree(d, decode, title=f"tree {i}")
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise BfspoError(f"{args.file}:{lineno}: not a logged search tree ({type(e).__name__}: {e})") from None
        print(("\n" if n else "") + text)
    return 0
