"""`bfspo tree show FILE [--index N]`: render logged search trees (SearchTree.to_dict lines) as text.
`bfspo tree stats RUN_DIR|FILE ...`: where their training signal goes (bfspo/reporting/tree_stats.py).

Each tree is rendered by bfspo/algorithm/tree_text.py (backtracking tokens w^b marked [[like this]]).
Token text comes from the "text" the trainer logged with each segment, else from --tokenizer,
else token ids are shown as <id>.
"""

from __future__ import annotations

import argparse

from bfspo.algorithm.tree_text import render_tree
from bfspo.errors import BfspoError
from bfspo.io import read_jsonl


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    show = sub.add_parser("show", help="render the trees of a trees/step_*.jsonl file as text")
    show.add_argument("file", help="JSONL file with one SearchTree.to_dict() per line")
    show.add_argument("--index", type=int, default=None, help="render only the tree on this line (0-based)")
    show.add_argument("--tokenizer", default=None, help="tokenizer (model dir) to decode trees logged without text")
    from bfspo.reporting.tree_stats import legend

    stats = sub.add_parser("stats", help="signal statistics of logged trees, one block per run directory or file",
                           description="Signal statistics of logged trees, one block per run directory or file, "
                                       "then the legend.", epilog=legend(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    stats.add_argument("paths", nargs="+", help="run directories (their trees/step_*.jsonl) or tree files")


def run(args: argparse.Namespace) -> int:
    return _show(args) if args.action == "show" else _stats(args)


def _stats(args: argparse.Namespace) -> int:
    from bfspo.reporting.tree_stats import format_stats, legend, read_trees, tree_files, tree_stats

    for path in args.paths:
        print(format_stats(path, tree_stats(read_trees(tree_files([path])))) + "\n")
    print(legend())
    return 0


def _show(args: argparse.Namespace) -> int:
    rows = list(read_jsonl(args.file))
    if args.index is not None and not 0 <= args.index < len(rows):
        raise BfspoError(f"{args.file}: --index {args.index} out of range (the file holds {len(rows)} trees)")
    picked = list(enumerate(rows)) if args.index is None else [(args.index, rows[args.index])]
    decode = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        from bfspo.detokenize import token_texts

        try:
            tok = AutoTokenizer.from_pretrained(args.tokenizer, trust_remote_code=False)  # never a folder's code
        except (OSError, ValueError) as e:
            raise BfspoError(f"cannot load tokenizer {args.tokenizer!r}: {e}") from None

        def decode(ids: list[int]) -> list[str]:
            return token_texts(tok, ids)

    for n, (i, (lineno, d)) in enumerate(picked):
        try:
            text = render_tree(d, decode, title=f"tree {i}")
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise BfspoError(f"{args.file}:{lineno}: not a logged search tree ({type(e).__name__}: {e})") from None
        print(("\n" if n else "") + text)
    return 0
