"""Rewards and advantages on the search tree (Sec. 4.1, Appendix B) and the dynamic-sampling filter
(Eq. 2's constraint, on all leaves or on the G first answers: `keep_tree`, `FILTERS`).

* Leaf reward, Eq. 4 (with the soft overlong punishment of Eq. 3 unless `overlong=False`, the
  w/o R_l ablation): bfspo.algorithm.rewards.sequence_reward.
* Internal nodes, Eq. 8: the mean of the children's rewards. Inside a segment every token has one
  child, so the whole segment carries the reward of its last token.
* Branch advantage, Eq. 9: for every branching node b (the root and each w^b in B), every token of
  S(b) gets (R(token) - R(b)) / sigma(b). S(b) (Algorithm 2) is the union of the branches from a
  child of b down to the next leaf or branching node, inclusive: exactly the child segments of b,
  each of which has a constant reward. Since R(b) is the mean of the children's rewards (Eq. 8),
  Eq. 9 on b's children is Eq. 1 on the group of their rewards: both use `group_advantages`.
* Global variant (ablation "Global Adv."): the tree's M complete chains are one GRPO group, Eq. 1
  on the leaf rewards; each chain's tokens get its advantage, so a token shared by several chains
  has one advantage per chain and the loss runs over the flattened chains.

Normalisation convention, shared by DAPO (K = 0), the branch and the global advantage:
std is the unbiased sample standard deviation (ddof = 1, torch.std's default, as in TRL's and
verl's GRPO) and the denominator is std + EPS with EPS = 1e-6. When all rewards of a group are
equal (sigma = 0), or the group has a single member, every advantage is exactly 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bfspo.algorithm.rewards import sequence_reward
from bfspo.algorithm.tree import SearchTree
from bfspo.errors import BfspoError

EPS = 1e-6
# Readings of the dynamic-sampling filter (docs/algorithm.md, "Dynamic sampling"); the first is the default.
# "none" keeps every tree, as TRL's GRPOTrainer does (bench/bench_peer_trl.py's all-groups arms).
FILTERS = ("all_leaves", "first_samples", "none")


def group_advantages(rewards: Sequence[float], eps: float = EPS) -> list[float]:
    """Eq. 1: (R_i - mean(R)) / (std(R) + eps), unbiased std; all zeros when the rewards are equal."""
    n = len(rewards)
    if n < 2 or max(rewards) == min(rewards):
        return [0.0] * n
    mean = math.fsum(rewards) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (n - 1))
    return [(r - mean) / (std + eps) for r in rewards]


def assign_rewards(tree: SearchTree, overlong: bool = True, window: str = "paper",
                   extra: dict[int, float] | None = None) -> None:
    """Eq. 4 on every leaf, then Eq. 8 bottom-up on every segment and at the root (in place).

    The overlong punishment uses the tree's budget (Eq. 3 with L_cache = budget / 5) and the
    window's L_max (bfspo.algorithm.rewards.overlong_window). `extra` (leaf segment id -> a term
    added to that leaf's Eq. 4 reward) carries rewards beyond the paper's, such as the TRL trainer's
    other reward functions (docs/trl.md); absent, the reward is Eq. 4's.
    """
    extra = extra or {}
    for seg_id in reversed(tree.dfs()):  # children before parents
        seg = tree.segments[seg_id]
        if seg.leaf is not None:
            seg.leaf.reward = float(sequence_reward(seg.leaf.correct, seg.leaf.length, tree.budget,
                                                    overlong, window)) + extra.get(seg_id, 0.0)
            seg.reward = seg.leaf.reward
        else:
            seg.reward = math.fsum(tree.segments[c].reward for c in seg.children) / len(seg.children)
    tops = [tree.segments[c].reward for c in tree.root_children]
    tree.root_reward = math.fsum(tops) / len(tops) if tops else None


def branch_advantages(tree: SearchTree, eps: float = EPS) -> None:
    """Eq. 9: at every branching node (the root and each segment with children), Eq. 1 on the
    rewards of its child segments; each segment gets one advantage."""
    for b in [None] + [s.id for s in tree.segments if s.children]:
        children = tree.children_of(b)
        for c, a in zip(children, group_advantages([tree.segments[c].reward for c in children], eps)):
            tree.segments[c].advantage = a


def global_advantages(tree: SearchTree, eps: float = EPS) -> None:
    """The "Global Adv." ablation: Eq. 1 on the leaf rewards of the tree's M chains, one advantage per leaf."""
    leaves = tree.leaves()
    for i, a in zip(leaves, group_advantages([tree.segments[i].leaf.reward for i in leaves], eps)):
        tree.segments[i].leaf.advantage = a


@dataclass(frozen=True)
class AdvantageKind:
    """One advantage variant: `assign(tree, eps)` sets the advantages in place, and `per_chain` says
    where they live and what the loss runs over. False: one per segment (`Segment.advantage`), the
    loss over the tree's unique tokens (Eq. 10); True: one per leaf (`Leaf.advantage`), the loss over
    the flattened chains, a shared token once per chain holding it (Eq. 2)."""

    assign: Callable[[SearchTree, float], None]
    per_chain: bool


# Every advantage variant, by the name that `TrainConfig.advantage` and the configs' methods use;
# the first is the default. A new variant is one function and one entry (docs/workflow.md).
ADVANTAGES: dict[str, AdvantageKind] = {
    "branch": AdvantageKind(branch_advantages, per_chain=False),
    "global": AdvantageKind(global_advantages, per_chain=True),
}


def advantage_kind(name: str | None) -> AdvantageKind:
    """The variant called `name`; an unknown name is an error naming the known ones."""
    try:
        return ADVANTAGES[name]
    except KeyError:
        raise BfspoError(f"unknown advantage {name!r}; known: {', '.join(ADVANTAGES)}") from None


def per_chain(tree: SearchTree) -> bool:
    """Whether the tree's advantages are one per chain (its loss runs over the flattened chains);
    False before any are assigned (log-probs alone are computed over the tree's unique tokens)."""
    return tree.advantage_kind is not None and advantage_kind(tree.advantage_kind).per_chain


def assign_advantages(tree: SearchTree, kind: str = "branch", eps: float = EPS) -> None:
    """The advantages of variant `kind` (ADVANTAGES): Eq. 9 ("branch": one advantage per segment)
    or Eq. 1 over chains ("global": one per leaf), or a variant added to the table.

    Needs `assign_rewards` first. Clears every advantage, then sets the variant's and
    `tree.advantage_kind`, which tells packing which tokens the loss runs over (`per_chain`).
    """
    variant = advantage_kind(kind)
    if any(s.reward is None for s in tree.segments):
        raise ValueError("assign_rewards must run before assign_advantages")
    for s in tree.segments:
        s.advantage = None
        if s.leaf is not None:
            s.leaf.advantage = None
    variant.assign(tree, eps)
    tree.advantage_kind = kind


def first_samples(tree: SearchTree) -> list[int]:
    """Leaf ids of the G first answers (Alg. 1 line 2: the initial group, iteration 0)."""
    return [i for i in tree.leaves() if tree.segments[i].iteration == 0]


def keep_tree(tree: SearchTree, filter: str = "all_leaves") -> bool:
    """Dynamic sampling (Eq. 2's constraint 0 < |{o_i : v(o_i, a*) = 1}| < G), in one of two readings:

    * "all_leaves": keep iff 0 < #correct leaves < #leaves, over every leaf of the tree;
    * "first_samples": keep iff 0 < #correct < G over the G first answers only (DAPO's group, before
      any expansion). `build_trees(..., filter="first_samples")` applies the same test after line 2
      and does not expand a tree that fails it;
    * "none": keep every tree (no dynamic sampling: a tree without signal is trained with zero
      advantages, its tokens still counted in the token-mean, as TRL's GRPOTrainer does).

    At K = 0 both are exactly DAPO's constraint. With +-1 rewards (no overlong term) "all_leaves" is
    the same as "the leaf rewards are not all equal", i.e. the tree carries a signal.
    """
    if filter not in FILTERS:
        raise BfspoError(f"unknown filter {filter!r}; expected one of {FILTERS}")
    if filter == "none":
        return True
    leaves = tree.leaves() if filter == "all_leaves" else first_samples(tree)
    correct = sum(tree.segments[i].leaf.correct for i in leaves)
    return 0 < correct < len(leaves)
