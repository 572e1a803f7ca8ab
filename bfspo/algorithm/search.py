"""Algorithm 1 (tree construction), batched over many questions.

Each question grows its own `SearchTree`. Line 2 samples G answers per question; then each of the
K iterations selects a path (line 5, Eq. 5), picks its backtracking token (line 6, Eq. 6-7) and
samples G new continuations from it (line 7). K = 0 is exactly DAPO's group of G.

The per-tree steps are `plant` (line 2), `next_expansion` (lines 4-6) and `grow` (lines 7-8).
`build_trees` runs them in lockstep: every round makes ONE engine call for all trees that are
still expanding, so the sampler sees a large batch; bfspo.rollout.streamed runs the same steps on
one engine loop, each tree as soon as its samples finish (docs/algorithm.md, "Streamed rollout").

Conventions (docs/algorithm.md):

* Correctness: a leaf is correct iff its chain finished with EOS and the verifier accepts it; a
  chain cut off by the budget is wrong (`add_completions`).
* Selection, "bfs": the shortest correct complete path, ties to the earliest created leaf. A tree
  with no correct path stops expanding (there is no best solution to refine; such a tree is
  dropped later by the dynamic-sampling filter anyway, unless an earlier expansion made it useful).
* The dynamic-sampling filter read on the first samples (`filter="first_samples"`): a tree whose G
  first answers are all correct or all wrong fails DAPO's constraint before any expansion
  (`keep_tree(tree, "first_samples")`) and is not expanded; no engine call is spent on it.
* Selection, "entropy" (the no_bfs ablation, Eq. 11): line 5 is removed; the backtracking token is
  the highest-entropy unused token of the whole tree.
* Candidates for w^b: tokens not in B (tree nodes, not token ids), with a known entropy after them
  (so never the last token of a path) and with room to generate (depth < budget). Ties go to the
  first candidate in depth-first order (on a path: the shallowest). A tree without a candidate
  stops expanding.
* Expansion: G continuations of q + o_{1..t*} with max_new_tokens = budget - depth(t*), so every
  path stays within the budget; w^b then has G+1 children.
* Round r uses seed + r when a seed is given (round 0 is line 2); the context of tree i in round r
  has the place (first_place + i, r), from which the engines derive each sample's seed, so a tree's
  samples depend on its place, not on the other trees of the call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bfspo.algorithm.advantages import FILTERS, keep_tree
from bfspo.algorithm.tree import SearchTree, best_leaf
from bfspo.errors import BfspoError

SELECTIONS = ("bfs", "entropy")

Scorer = Callable[[list[int]], bool]


def candidate_tokens(tree: SearchTree, seg_ids: Sequence[int]) -> list[tuple[int, int]]:
    """(segment, offset) of every token of these segments that may become w^b, in the given order.

    The last token of a segment is either the end of a complete path (no next distribution, and
    the only kind of token that can sit at depth = budget, leaving no room to generate) or a token
    already in B. So the candidates are the other tokens with a known entropy after them; each has
    depth <= budget - 1, which leaves room for at least one new token.
    """
    return [(s, j) for s in seg_ids for j, h in enumerate(tree.segments[s].entropy_after[:-1]) if not math.isnan(h)]


def backtracking_point(tree: SearchTree, selection: str = "bfs") -> tuple[tuple[int, int] | None, int | None, str]:
    """Alg. 1 lines 5-6: ((segment, offset) of w^b or None, the path's leaf, reason when None).

    "bfs": Eq. 6 over the path chosen by Eq. 5. "entropy": Eq. 11 over the whole tree; the returned
    leaf is then the earliest created leaf below w^b, i.e. the chain in which w^b was sampled.
    """
    if selection == "bfs":
        leaf = best_leaf(tree)
        if leaf is None:
            return None, None, "no correct path"
        candidates = candidate_tokens(tree, tree.path(leaf))
    elif selection == "entropy":
        leaf, candidates = None, candidate_tokens(tree, tree.dfs())
    else:
        raise BfspoError(f"unknown selection {selection!r}; expected one of {SELECTIONS}")
    if not candidates:
        return None, leaf, "no backtracking token left"
    # max() keeps the first of equal maxima, i.e. the first candidate in path / depth-first order.
    point = max(candidates, key=lambda c: tree.segments[c[0]].entropy_after[c[1]])
    if leaf is None:
        leaf = tree.leaves_below(point[0])[0]
    return point, leaf, ""


def expand(tree: SearchTree, point: tuple[int, int], completions: Sequence, iteration: int, score: Scorer) -> int:
    """Alg. 1 lines 7-8: split at w^b, mark it in B, attach the new continuations; returns w^b's segment."""
    b = tree.split(*point)
    tree.segments[b].ends_in_B = True
    add_completions(tree, b, completions, iteration, score)
    return b


def add_completions(tree: SearchTree, parent: int | None, completions: Sequence, iteration: int, score: Scorer) -> None:
    """Attach engine completions below `parent` and score each new leaf with the verifier.

    A chain cut off by the budget (not finished with EOS) is wrong whatever its text: its answer
    was never given, and the verifier's fallbacks (the last number of the text) would read one into
    a half-written list. This is the only place a leaf gets its verdict, so the reward (Eq. 4,
    v = 0), the selection (Eq. 5) and dynamic sampling (Eq. 2's constraint) all follow from it.
    """
    for c in completions:
        leaf = tree.add_completion(parent, c.token_ids, c.logprobs, c.entropies, c.finished, iteration)
        verdict = bool(score(tree.path_tokens(leaf)))  # called for every chain: its statistics (timeouts) count all
        tree.segments[leaf].leaf.correct = verdict and bool(c.finished)


@dataclass
class Expansion:
    """One planned expansion (Alg. 1 line 7): w^b at (segment, offset), the selected path's leaf,
    the context q + o_{1..t*} and the tokens left to generate, budget - depth(t*)."""

    iteration: int
    point: tuple[int, int]
    leaf: int
    context: list[int]
    max_new: int


def check_search_args(group_size: int, k: int, budget: int, selection: str, filter: str) -> None:
    if group_size < 1 or k < 0 or budget < 1:
        raise BfspoError(f"need group_size >= 1, k >= 0 and budget >= 1, got {group_size}, {k}, {budget}")
    if selection not in SELECTIONS:
        raise BfspoError(f"unknown selection {selection!r}; expected one of {SELECTIONS}")
    if filter not in FILTERS:
        raise BfspoError(f"unknown filter {filter!r}; expected one of {FILTERS}")


def plant(tree: SearchTree, completions: Sequence, score: Scorer, k: int, filter: str) -> None:
    """Alg. 1 line 2 for one tree: its G first answers, scored; with `filter="first_samples"` a tree
    whose first answers fail DAPO's constraint stops here (`stopped` names the filter)."""
    add_completions(tree, None, completions, 0, score)
    if k > 0 and filter == "first_samples" and not keep_tree(tree, filter):
        tree.stopped = {"iteration": 1, "reason": "first samples all " + ("correct" if tree.n_correct else "wrong")}


def next_expansion(tree: SearchTree, iteration: int, k: int, selection: str) -> Expansion | None:
    """Alg. 1 lines 4-6 for one tree: the expansion of iteration `iteration` (1..K), or None when the
    tree is done (K iterations spent, stopped before, or no backtracking point: `stopped` says why)."""
    if iteration > k or tree.stopped is not None:
        return None
    point, leaf, reason = backtracking_point(tree, selection)
    if point is None:
        tree.stopped = {"iteration": iteration, "reason": reason}
        return None
    if selection == "bfs":
        tree.selected.append({"iteration": iteration, "leaf": leaf, "length": tree.segments[leaf].leaf.length})
    s, j = point
    return Expansion(iteration, point, leaf, tree.prompt_ids + tree.path_tokens(s, upto=j),
                     tree.budget - (tree.segments[s].start + j))


def grow(tree: SearchTree, expansion: Expansion, completions: Sequence, score: Scorer) -> None:
    """Alg. 1 lines 7-8 for one tree: attach an expansion's G continuations and record it."""
    s, j = expansion.point
    seg = tree.segments[s]
    record = {"iteration": expansion.iteration, "depth": seg.start + j,
              "path_length": tree.segments[expansion.leaf].leaf.length, "entropy": seg.entropy_after[j],
              "leaf": expansion.leaf}
    record["segment"] = expand(tree, expansion.point, completions, expansion.iteration, score)
    tree.backtracking.append(record)


def build_trees(engine, prompts: Sequence[Sequence[int]], scorers: Sequence[Scorer], *, group_size: int, k: int,
                budget: int, selection: str = "bfs", temperature: float = 1.0, top_p: float = 1.0,
                seed: int | None = None, filter: str = "all_leaves", first_place: int = 0) -> list[SearchTree]:
    """Algorithm 1 for every prompt at once, in lockstep: one tree per prompt, K+1 batched engine
    calls at most (bfspo.rollout.streamed runs the same per-tree steps without the lockstep).

    `scorers[i](path_token_ids) -> bool` is the verifier v(o, a*) of question i, called with the
    generated tokens of each new complete path. `engine` follows bfspo.rollout.base.RolloutEngine;
    the context of tree i at iteration `it` has the place (first_place + i, it) (`keys`), from which
    the engines seed its samples: the trainer numbers a step's trees in draw order across its
    generation rounds, as the streamed search does. With `filter="first_samples"`, a tree that fails
    the filter on its G first answers is not expanded (`stopped` names the filter); "all_leaves"
    expands every tree and filters afterwards.
    """
    check_search_args(group_size, k, budget, selection, filter)
    if len(scorers) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(scorers)} scorers")
    trees = [SearchTree(prompt_ids=list(p), budget=budget) for p in prompts]
    if not trees:
        return trees

    def sample(contexts, max_new, round_, keys):
        out = engine.generate(contexts, group_size, max_new, temperature=temperature, top_p=top_p,
                              seed=None if seed is None else seed + round_, keys=keys)
        if len(out) != len(contexts) or any(len(c) != group_size for c in out):
            raise ValueError("the engine must return group_size completions per context")
        return out

    first = sample([t.prompt_ids for t in trees], budget, 0, [(first_place + i, 0) for i in range(len(trees))])
    for tree, score, comps in zip(trees, scorers, first):
        plant(tree, comps, score, k, filter)
    for it in range(1, k + 1):
        todo = [(i, e) for i, tree in enumerate(trees) if (e := next_expansion(tree, it, k, selection)) is not None]
        if not todo:
            break
        out = sample([e.context for _, e in todo], [e.max_new for _, e in todo], it,
                     [(first_place + i, it) for i, _ in todo])
        for (i, e), comps in zip(todo, out):
            grow(trees[i], e, comps, scorers[i])
    return trees
