"""Where the training signal of logged search trees goes: `bfspo tree stats RUN_DIR|FILE ...`.

These are the numbers to look at when BFS-PO does not shorten answers as expected (issue 6) or
loses accuracy (issue 25). Over the logged trees (SearchTree.to_dict lines, as the trainer writes
to trees/step_*.jsonl) that dynamic sampling kept for training (`keep_tree` on all leaves;
`filtered` counts the others). A run trained with `filter: first_samples` never expands a tree whose
first answers fail the filter, so its trees are kept or dropped alike by both readings.

Every kept tree counts, whatever its first group (the G first samples, Alg. 1 line 2) was: the
kinds of tree are `TREE_KINDS`. What each statistic means is `MEANINGS`, which `bfspo tree stats`
prints as its legend (and in its --help).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from statistics import mean

from bfspo.algorithm.advantages import first_samples, group_advantages, keep_tree
from bfspo.algorithm.tree import SearchTree
from bfspo.errors import BfspoError
from bfspo.io import read_jsonl

# The kinds of kept tree, by their G first samples, and what each means
TREE_KINDS = {
    "mixed": "some first samples right, some wrong: DAPO trains on the group too",
    "all_correct": "every first sample right: DAPO drops the group; the all-leaves filter keeps the tree "
                   "when an expansion answer failed",
    "all_wrong": "every first sample wrong: DAPO drops the group; kept only when an expansion rescued it, "
                 "which needs a correct path to expand from, so only without BFS selection",
}
KINDS = tuple(TREE_KINDS)

# What each statistic means: the legend of `bfspo tree stats` and of its --help. KIND is a kind of
# tree (TREE_KINDS) or `all` (every kept tree).
MEANINGS = {
    "trees": "trees kept for training (keep_tree on all leaves)",
    "filtered": "trees that dynamic sampling dropped (not counted below)",
    "trees_KIND": "kept trees of each kind of first group (KIND below)",
    "first_all_correct": "share of kept trees whose G first samples were all correct",
    "branching_nodes": "branching nodes: the root and every w^b",
    "equal_children": "share of branching nodes whose children all have the same reward: sigma = 0, so every "
                      "branch of S(b) gets advantage 0 (Eq. 9), however much the lengths of its correct answers "
                      "differ, unless the overlong term separates them",
    "best_branch_advantage_KIND": "Eq. 9 advantage of the root branch that leads to the final shortest correct "
                                  "answer, when the search expanded it (the best answer's prefix). An expanded "
                                  "branch is worth the mean of its sub-tree (Eq. 8), so every failed continuation "
                                  "below it lowers it: with all G first answers correct and +-1 rewards it is "
                                  "-(G - 1) / sqrt(G) (-2.47 at G = 8) as soon as one expansion answer fails, "
                                  "whatever the rest (the siblings tie at 1, the branch is below them)",
    "best_branch_dapo_advantage_KIND": "what DAPO trains the same first sample with: Eq. 1 in the group of the G "
                                       "first samples when DAPO's constraint keeps that group (mixed), 0 when it "
                                       "drops it (all correct, all wrong)",
    "best_branch_negative_KIND": "share of those best branches with a negative Eq. 9 advantage",
    "other_correct_advantage_KIND": "Eq. 9 advantage of the correct root chains that were not expanded "
                                    "(worth their own reward)",
    "initial_accuracy": "share of correct leaves among the G first samples",
    "expansion_accuracy": "share of correct leaves among the leaves sampled by expansions",
    "shortening": "tokens by which the final best answer is shorter than the shortest correct first sample "
                  "(trees where both exist)",
    "wb_relative_depth": "where w^b falls on the path it was chosen on (depth / path length)",
    "wb_tokens": "the most frequent backtracking tokens and their shares (trees logged with text)",
}


def legend(width: int = 100) -> str:
    """MEANINGS and TREE_KINDS as text, one wrapped entry per key."""
    import textwrap

    def entry(key: str, meaning: str) -> str:
        return textwrap.fill(meaning, width, initial_indent=f"  {key}: ", subsequent_indent="      ")

    kinds = {**TREE_KINDS, "all": "every kept tree"}
    return "\n".join(["legend (KIND: " + ", ".join(kinds) + "):"]
                     + [entry(k, m) for k, m in MEANINGS.items()]
                     + [entry(f"KIND {k}", m) for k, m in kinds.items()])


def first_group_kind(tree: SearchTree) -> str:
    """'mixed', 'all_correct' or 'all_wrong': the G first samples of the tree (Alg. 1 line 2)."""
    correct = [tree.segments[i].leaf.correct for i in first_samples(tree)]
    return "mixed" if keep_tree(tree, "first_samples") else "all_correct" if all(correct) else "all_wrong"


def best_branch(tree: SearchTree, best_leaf: int) -> dict | None:
    """The root branch that leads to the best answer, if the search expanded it: its Eq. 9 advantage,
    what DAPO gives the same first sample (Eq. 1 in the first group where DAPO keeps the group, else
    0), and the Eq. 9 advantages of the correct root chains that were not expanded."""
    segs = tree.segments
    root = tree.path(best_leaf)[0]
    if not segs[root].children:
        return None
    initial = first_samples(tree)
    dapo = ([0.0] * len(initial) if not keep_tree(tree, "first_samples")
            else group_advantages([segs[i].leaf.reward for i in initial]))
    return {"advantage": segs[root].advantage,
            "dapo": next(a for i, a in zip(initial, dapo) if tree.path(i)[0] == root),
            "others": [segs[c].advantage for c in tree.root_children
                       if c != root and segs[c].leaf is not None and segs[c].leaf.correct]}


def tree_stats(records: Iterable[tuple[dict, SearchTree]], top_tokens: int = 5) -> dict:
    """The statistics of the module doc over logged trees, each as its SearchTree.to_dict() record
    and the SearchTree parsed from it (`read_trees`); a value is None when no tree has what it
    averages."""
    n_trees, filtered, equal, nodes = 0, 0, 0, 0
    kinds = Counter()
    branches = {kind: [] for kind in KINDS}
    first, expanded, shortening, rel_depth = [], [], [], []
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
        kind = first_group_kind(tree)
        kinds[kind] += 1
        best = d.get("best")
        if best is None:
            continue
        correct_initial = [s.leaf.length for s in initial if s.leaf.correct]
        if correct_initial:
            shortening.append(min(correct_initial) - best["length"])
        branch = best_branch(tree, best["leaf"])
        if branch is not None:
            branches[kind].append(branch)

    def avg(xs):
        return float(mean(xs)) if xs else None

    def branch_stats(found: list[dict], suffix: str) -> dict:
        return {f"best_branch_advantage_{suffix}": avg([b["advantage"] for b in found]),
                f"best_branch_dapo_advantage_{suffix}": avg([b["dapo"] for b in found]),
                f"best_branch_negative_{suffix}": avg([b["advantage"] < 0 for b in found]),
                f"other_correct_advantage_{suffix}": avg([a for b in found for a in b["others"]])}

    n_wb = sum(wb_tokens.values())
    return {
        "trees": n_trees,
        "filtered": filtered,
        **{f"trees_{kind}": kinds[kind] for kind in KINDS},
        "first_all_correct": kinds["all_correct"] / n_trees if n_trees else None,
        "branching_nodes": nodes,
        "equal_children": equal / nodes if nodes else None,
        **{k: v for kind in KINDS for k, v in branch_stats(branches[kind], kind).items()},
        **branch_stats([b for kind in KINDS for b in branches[kind]], "all"),
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


COUNTS = ("trees", "filtered", "branching_nodes") + tuple(f"trees_{kind}" for kind in KINDS)


def format_stats(name: str, stats: dict) -> str:
    """One line per statistic: counts as integers, shares and means to 3 decimals."""
    lines = [name]
    for key, value in stats.items():
        if value is None or value == []:
            text = "-"
        elif key == "wb_tokens":
            text = ", ".join(f"{token!r} {share:.0%}" for token, share in value)
        elif key in COUNTS:
            text = str(value)
        else:
            text = f"{value:.3f}"
        lines.append(f"  {key:40s} {text}")
    return "\n".join(lines)
