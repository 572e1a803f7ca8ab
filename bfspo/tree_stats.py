"""Where the training signal of logged search trees goes: `bfspo tree stats RUN_DIR|FILE ...`.

These are the numbers to look at when BFS-PO does not shorten answers as expected (issue 6). Over
the logged trees (SearchTree.to_dict lines, as the trainer writes to trees/step_*.jsonl) that
dynamic sampling kept for training (`bfspo.advantages.keep_tree`; `filtered` counts the others):

- `equal_children`: the share of branching nodes (the root and every w^b) whose children all have
  the same reward. Then sigma = 0 and the whole sub-tree S(b) gets advantage 0 (Eq. 9), however
  much the lengths of its correct answers differ, unless the overlong term separates them.
- `best_branch_advantage` against `other_correct_advantage`: the Eq. 9 advantage of the root
  branch that leads to the final shortest correct answer, when BFS expanded it, against that of
  the correct root chains that were not expanded. An expanded branch is worth the average of its
  sub-tree (Eq. 8), an unexpanded correct chain its own reward, so a failed continuation of the
  shortest answer lowers the credit of the very prefix the search chose.
- `initial_accuracy`, `expansion_accuracy`: the share of correct leaves among the G initial
  samples and among the leaves sampled by expansions.
- `shortening`: how many tokens shorter the final best answer is than the shortest correct
  initial sample (trees where both exist).
- `wb_relative_depth`: where w^b falls on the path it was chosen on (depth / path length).
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Iterable

from bfspo.advantages import keep_tree
from bfspo.errors import BfspoError
from bfspo.io import read_jsonl
from bfspo.tree import SearchTree


def _root_branch(tree: SearchTree, seg: int) -> int:
    return tree.path(seg)[0]


def tree_stats(trees: Iterable[dict]) -> dict:
    """The statistics of the module doc over SearchTree.to_dict() records; a value is None when
    no tree has what it averages."""
    n_trees, filtered, equal, nodes = 0, 0, 0, 0
    best_adv, other_adv, first, expanded, shortening, rel_depth = [], [], [], [], [], []
    for d in trees:
        tree = SearchTree.from_dict(d)
        if not keep_tree(tree):
            filtered += 1
            continue
        n_trees += 1
        segs = tree.segments
        for children in [tree.root_children] + [s.children for s in segs if s.ends_in_B]:
            nodes += 1
            equal += len({segs[c].reward for c in children}) == 1
        leaves = [segs[i] for i in tree.leaves()]
        first += [s.leaf.correct for s in leaves if s.iteration == 0]
        expanded += [s.leaf.correct for s in leaves if s.iteration > 0]
        rel_depth += [b["depth"] / b["path_length"] for b in tree.backtracking]
        best = d.get("best")
        if best is None:
            continue
        best_root = _root_branch(tree, best["leaf"])
        if segs[best_root].children and segs[best_root].advantage is not None:
            best_adv.append(segs[best_root].advantage)
            other_adv += [segs[c].advantage for c in tree.root_children
                          if c != best_root and segs[c].leaf is not None and segs[c].leaf.correct
                          and segs[c].advantage is not None]
        initial = [s.leaf.length for s in leaves if s.iteration == 0 and s.leaf.correct]
        if initial:
            shortening.append(min(initial) - best["length"])

    def avg(xs):
        return mean(xs) if xs else None

    return {
        "trees": n_trees,
        "filtered": filtered,
        "branching_nodes": nodes,
        "equal_children": equal / nodes if nodes else None,
        "best_branch_advantage": avg(best_adv),
        "other_correct_advantage": avg(other_adv),
        "initial_accuracy": avg(first),
        "expansion_accuracy": avg(expanded),
        "shortening": avg(shortening),
        "wb_relative_depth": avg(rel_depth),
    }


def tree_files(paths: Iterable[str | Path]) -> list[Path]:
    """The JSONL files named, with a run directory standing for its trees/step_*.jsonl."""
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted((p / "trees").glob("step_*.jsonl"))
            if not found:
                raise BfspoError(f"{p}: no trees/step_*.jsonl (was the run trained with log_trees?)")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise BfspoError(f"{p}: no such run directory or tree file")
    return files


def read_trees(files: Iterable[Path]) -> Iterable[dict]:
    for f in files:
        for _, d in read_jsonl(f):
            yield d


def format_stats(name: str, stats: dict) -> str:
    """One line per statistic, values to 3 decimals."""
    lines = [name]
    for key, value in stats.items():
        text = "-" if value is None else (f"{value}" if isinstance(value, int) else f"{value:.3f}")
        lines.append(f"  {key:24s} {text}")
    return "\n".join(lines)
