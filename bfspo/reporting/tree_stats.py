"""Where the training signal of logged search trees goes: `bfspo tree stats RUN_DIR|FILE ...`.

These are the numbers to look at when BFS-PO does not shorten answers as expected (issue 6). Over
the logged trees (SearchTree.to_dict lines, as the trainer writes to trees/step_*.jsonl) that
dynamic sampling kept for training (`bfspo.algorithm.advantages.keep_tree`; `filtered` counts the others):

- `equal_children`: the share of branching nodes (the root and every w^b) whose children all have
  the same reward. Then sigma = 0 and every branch of S(b) gets advantage 0 (Eq. 9), however much
  the lengths of its correct answers differ, unless the overlong term separates them.
- `first_all_correct`: the share of trees whose G first samples (Alg. 1 line 2) were all correct.
  DAPO would have dropped them; BFS-PO keeps them when an expansion leaf failed.
- For the trees whose first samples were mixed, where DAPO and BFS-PO both train: the Eq. 9
  advantage of the root branch that leads to the final shortest correct answer, when BFS expanded
  it (`best_branch_advantage`); the Eq. 1 advantage DAPO gives that branch's first sample in the
  group of the G first samples (`best_branch_dapo_advantage`); and the Eq. 9 advantage of the
  correct root chains that were not expanded (`other_correct_advantage`). An expanded branch is
  worth the mean of its sub-tree (Eq. 8), an unexpanded correct chain its own reward.
- `initial_accuracy`, `expansion_accuracy`: the share of correct leaves among the G first samples
  and among the leaves sampled by expansions.
- `shortening`: how many tokens shorter the final best answer is than the shortest correct
  first sample (trees where both exist).
- `wb_relative_depth`: where w^b falls on the path it was chosen on (depth / path length);
  `wb_tokens`: the most frequent backtracking tokens and their shares (trees logged with text).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from statistics import mean
from typing import Iterable, Iterator

from bfspo.algorithm.advantages import group_advantages, keep_tree
from bfspo.errors import BfspoError
from bfspo.io import read_jsonl
from bfspo.algorithm.tree import SearchTree


def tree_stats(records: Iterable[tuple[dict, SearchTree]], top_tokens: int = 5) -> dict:
    """The statistics of the module doc over logged trees, each as its SearchTree.to_dict() record
    and the SearchTree parsed from it (`read_trees`); a value is None when no tree has what it
    averages."""
    n_trees, filtered, equal, nodes, all_correct = 0, 0, 0, 0, 0
    best_adv, dapo_adv, other_adv, first, expanded, shortening, rel_depth = [], [], [], [], [], [], []
    wb_tokens = Counter()
    for d, tree in records:
        if not keep_tree(tree):
            filtered += 1
            continue
        n_trees += 1
        segs = tree.segments
        for children in [tree.root_children] + [s.children for s in segs if s.ends_in_B]:
            nodes += 1
            equal += len({segs[c].reward for c in children}) == 1
        leaves = [segs[i] for i in tree.leaves()]
        initial = [s for s in leaves if s.iteration == 0]
        first += [s.leaf.correct for s in initial]
        expanded += [s.leaf.correct for s in leaves if s.iteration > 0]
        rel_depth += [b["depth"] / b["path_length"] for b in tree.backtracking]
        wb_tokens.update(d["segments"][b["segment"]]["text"][-1] for b in tree.backtracking
                         if d["segments"][b["segment"]].get("text"))
        first_correct = all(s.leaf.correct for s in initial)
        all_correct += first_correct
        best = d.get("best")
        if best is None:
            continue
        correct_initial = [s.leaf.length for s in initial if s.leaf.correct]
        if correct_initial:
            shortening.append(min(correct_initial) - best["length"])
        best_root = tree.path(best["leaf"])[0]
        if not segs[best_root].children or first_correct:
            continue
        best_adv.append(segs[best_root].advantage)
        dapo = group_advantages([s.leaf.reward for s in initial])
        dapo_adv += [a for s, a in zip(initial, dapo) if tree.path(s.id)[0] == best_root]
        other_adv += [segs[c].advantage for c in tree.root_children
                      if c != best_root and segs[c].leaf is not None and segs[c].leaf.correct]

    def avg(xs):
        return float(mean(xs)) if xs else None

    n_wb = sum(wb_tokens.values())
    return {
        "trees": n_trees,
        "filtered": filtered,
        "branching_nodes": nodes,
        "equal_children": equal / nodes if nodes else None,
        "first_all_correct": all_correct / n_trees if n_trees else None,
        "best_branch_advantage": avg(best_adv),
        "best_branch_dapo_advantage": avg(dapo_adv),
        "other_correct_advantage": avg(other_adv),
        "initial_accuracy": avg(first),
        "expansion_accuracy": avg(expanded),
        "shortening": avg(shortening),
        "wb_relative_depth": avg(rel_depth),
        "wb_tokens": [(token, n / n_wb) for token, n in wb_tokens.most_common(top_tokens)],
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


def read_trees(files: Iterable[Path]) -> Iterator[tuple[dict, SearchTree]]:
    """Every logged tree of the files, in order, as (record, SearchTree); a line that is not a
    search tree is an error naming its file and line."""
    for f in files:
        for lineno, d in read_jsonl(f):
            try:
                tree = SearchTree.from_dict(d)
            except (KeyError, TypeError, IndexError, ValueError) as e:
                raise BfspoError(f"{f}:{lineno}: not a logged search tree ({type(e).__name__}: {e})") from None
            yield d, tree


def format_stats(name: str, stats: dict) -> str:
    """One line per statistic: counts as integers, shares and means to 3 decimals."""
    lines = [name]
    for key, value in stats.items():
        if value is None or value == []:
            text = "-"
        elif key == "wb_tokens":
            text = ", ".join(f"{token!r} {share:.0%}" for token, share in value)
        elif key in ("trees", "filtered", "branching_nodes"):
            text = str(value)
        else:
            text = f"{value:.3f}"
        lines.append(f"  {key:27s} {text}")
    return "\n".join(lines)
