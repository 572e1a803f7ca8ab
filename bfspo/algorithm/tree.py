"""The search tree T of Algorithm 1, stored as segments.

The paper's tree has one node per generated token (Sec. 4.1). A token's children are the tokens
that follow it: one child for an ordinary token, none for a leaf (the last token of a complete
path), G+1 for a backtracking token w^b in B. The root is the question q (the prompt): the G initial
samples (line 2) are its children, so it is the first branching node.

Storing one object per token would be wasteful, so a `Segment` holds a maximal run of tokens with
no branching inside. The invariants are:

* a segment ends either in a leaf (`leaf` is set, no children) or in a backtracking token
  (`ends_in_B`, at least 2 children);
* every other token of a segment has exactly one child, the next token of the segment.

Sampled continuations are never merged, even when their tokens coincide: the tree is exactly the
paper's, and its tokens are the "unique tokens" of Eq. 10.

Node identities are stable. Splitting a segment at a new backtracking token creates a NEW segment
for the upper part (which ends in the new w^b); the lower part keeps its id, its children, its leaf
and its `ends_in_B` flag. Hence a leaf is always the same segment id (ids of leaves grow with their
creation time), and so is the segment ending in a given backtracking token.

Per token the tree keeps the sampled id, the old-policy log-prob log pi_old(token | context) and
the entropy AFTER it: H(o_{j,t}) of Eq. 7 conditions on o_{j,<=t}, i.e. it is the entropy of the
distribution that token t+1 is drawn from. The engine reports the entropy of the distribution each
token was drawn from, so entropy_after[t] = step_entropy[t+1]; the last token of a completion has
no next distribution and gets NaN (it is never a backtracking point). Depths count generated
tokens: the first token after the prompt has depth 1, a leaf's depth is the length |o| of its path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

NAN = float("nan")
DECODE_CONTEXT = 8  # tokens of its path that a segment's decoding sees before it (segment_texts)


@dataclass
class Leaf:
    """A complete root-to-leaf path o (Appendix B: its reward needs only v(o, a*) and |o|)."""

    correct: bool  # v(o, a*) = 1; always False for a chain cut by the budget (search.add_completions)
    length: int  # |o|: generated tokens of the whole path, EOS included
    finished: bool  # ended with EOS (False: cut by the token budget, so never correct)
    reward: float | None = None  # Eq. 4 (set by bfspo.algorithm.advantages.assign_rewards)
    advantage: float | None = None  # Eq. 1 over the tree's chains (global variant only)


@dataclass
class Segment:
    """A run of tokens without branching; tokens[j] has depth start + j."""

    id: int
    parent: int | None  # None: a child of the root (the prompt)
    start: int  # depth of the first token (1 for a child of the root)
    token_ids: list[int]
    logprobs: list[float]  # log pi_old of each token
    entropy_after: list[float]  # Eq. 7: entropy of the next-token distribution after each token
    iteration: int  # 0: initial group (Alg. 1 line 2); l: expansion l (line 7)
    children: list[int] = field(default_factory=list)
    ends_in_B: bool = False  # the last token is a backtracking token (in B)
    leaf: Leaf | None = None  # set iff the segment ends a complete path
    reward: float | None = None  # Eq. 8: R of every token of the segment (= R of its last token)
    advantage: float | None = None  # Eq. 9: branch advantage of every token of the segment

    @property
    def end(self) -> int:
        """Depth of the last token."""
        return self.start + len(self.token_ids) - 1


@dataclass
class SearchTree:
    """The tree T of one question (Algorithm 1) plus what the search logged while building it."""

    prompt_ids: list[int]
    budget: int  # L_budget: no path may hold more generated tokens
    segments: list[Segment] = field(default_factory=list)  # segments[i].id == i
    root_children: list[int] = field(default_factory=list)
    root_reward: float | None = None  # Eq. 8 at the root
    backtracking: list[dict] = field(default_factory=list)  # one record per expansion
    selected: list[dict] = field(default_factory=list)  # the path selected at each iteration (Eq. 5)
    stopped: dict | None = None  # why expansion ended before K iterations, if it did
    advantage_kind: str | None = None  # a key of advantages.ADVANTAGES once advantages are assigned
    meta: dict = field(default_factory=dict)  # free-form (question id, step, ...), set by the caller

    # --- building -----------------------------------------------------------------------------

    def add_completion(self, parent: int | None, token_ids: Sequence[int], logprobs: Sequence[float],
                       step_entropies: Sequence[float], finished: bool, iteration: int) -> int:
        """Attach one sampled continuation below `parent` (None: the root) as a new leaf segment.

        `step_entropies[t]` is the entropy of the distribution token t was drawn from (the engine's
        convention); it is shifted by one to the entropy after each token.
        """
        n = len(token_ids)
        if n == 0 or len(logprobs) != n or len(step_entropies) != n:
            raise ValueError(f"a completion needs as many tokens, log-probs and entropies (>0), got "
                             f"{n}, {len(logprobs)}, {len(step_entropies)}")
        start = 1 if parent is None else self.segments[parent].end + 1
        if start + n - 1 > self.budget:
            raise ValueError(f"completion of {n} tokens from depth {start} exceeds the budget {self.budget}")
        seg = Segment(id=len(self.segments), parent=parent, start=start, token_ids=list(token_ids),
                      logprobs=[float(x) for x in logprobs],
                      entropy_after=[float(x) for x in step_entropies[1:]] + [NAN], iteration=iteration,
                      leaf=Leaf(correct=False, length=start + n - 1, finished=bool(finished)))
        self.segments.append(seg)
        (self.root_children if parent is None else self.segments[parent].children).append(seg.id)
        return seg.id

    def split(self, seg_id: int, offset: int) -> int:
        """Make token `offset` of segment `seg_id` the last token of a segment; return that segment.

        The upper part tokens[:offset+1] becomes a new segment (same parent, same iteration); the
        lower part keeps the id `seg_id`, its children, leaf and ends_in_B flag.
        """
        seg = self.segments[seg_id]
        if not 0 <= offset < len(seg.token_ids) - 1:
            raise ValueError(f"cannot split segment {seg_id} of {len(seg.token_ids)} tokens after token {offset}")
        cut = offset + 1
        upper = Segment(id=len(self.segments), parent=seg.parent, start=seg.start, token_ids=seg.token_ids[:cut],
                        logprobs=seg.logprobs[:cut], entropy_after=seg.entropy_after[:cut],
                        iteration=seg.iteration, children=[seg_id])
        self.segments.append(upper)
        siblings = self.root_children if seg.parent is None else self.segments[seg.parent].children
        siblings[siblings.index(seg_id)] = upper.id
        seg.parent, seg.start = upper.id, seg.start + cut
        seg.token_ids, seg.logprobs = seg.token_ids[cut:], seg.logprobs[cut:]
        seg.entropy_after = seg.entropy_after[cut:]
        return upper.id

    # --- structure ----------------------------------------------------------------------------

    def children_of(self, seg_id: int | None) -> list[int]:
        """Child segments of a segment, or of the root for None."""
        return self.root_children if seg_id is None else self.segments[seg_id].children

    def dfs(self) -> list[int]:
        """Segment ids in depth-first pre-order, children in insertion order (parents before children)."""
        order, stack = [], list(reversed(self.root_children))
        while stack:
            s = stack.pop()
            order.append(s)
            stack.extend(reversed(self.segments[s].children))
        return order

    def leaves(self) -> list[int]:
        """Leaf segment ids in creation order (Alg. 1: the complete paths of T)."""
        return [s.id for s in self.segments if s.leaf is not None]

    def path(self, seg_id: int) -> list[int]:
        """Segment ids from the root down to `seg_id` inclusive."""
        out = []
        cur: int | None = seg_id
        while cur is not None:
            out.append(cur)
            cur = self.segments[cur].parent
        return out[::-1]

    def path_tokens(self, seg_id: int, upto: int | None = None) -> list[int]:
        """Generated token ids from the root to segment `seg_id` (through its token `upto`, default all)."""
        ids: list[int] = []
        for s in self.path(seg_id):
            ids.extend(self.segments[s].token_ids)
        if upto is not None:
            del ids[self.segments[seg_id].start + upto:]
        return ids

    def leaves_below(self, seg_id: int) -> list[int]:
        """Leaf ids under a segment (itself included), in creation order."""
        below, stack = [], [seg_id]
        while stack:
            s = stack.pop()
            if self.segments[s].leaf is not None:
                below.append(s)
            stack.extend(self.segments[s].children)
        return sorted(below)

    @property
    def n_tokens(self) -> int:
        """|T|: unique generated tokens of the tree (the normaliser of Eq. 10)."""
        return sum(len(s.token_ids) for s in self.segments)

    @property
    def n_chain_tokens(self) -> int:
        """sum_i |o_i| over the tree's complete chains (what flat DAPO-style training would process)."""
        return sum(self.segments[i].leaf.length for i in self.leaves())

    @property
    def n_correct(self) -> int:
        return sum(self.segments[i].leaf.correct for i in self.leaves())

    # --- serialisation ------------------------------------------------------------------------

    def segment_texts(self, decode: Callable[[list[int]], list[str]]) -> list[list[str]]:
        """One string per token of each segment. `decode(ids)` gives one string per id (e.g.
        bfspo.detokenize.token_texts); it sees each segment after the last DECODE_CONTEXT tokens of
        the path above it, so a character or a space that depends on them comes out right."""
        texts = []
        for s in self.segments:
            context = [] if s.parent is None else self.path_tokens(s.parent)[-DECODE_CONTEXT:]
            texts.append(list(decode(context + s.token_ids))[len(context):])
        return texts

    def to_dict(self, decode: Callable[[list[int]], list[str]] | None = None) -> dict:
        """A JSON-ready dict (NaN -> null). With `decode` (ids -> one string per token), each segment
        also carries its token strings under "text" (`segment_texts`), so `bfspo tree show` needs no
        tokenizer."""
        texts = self.segment_texts(decode) if decode is not None else None
        segments = []
        for s in self.segments:
            d = {"id": s.id, "parent": s.parent, "start": s.start, "iteration": s.iteration,
                 "token_ids": s.token_ids, "logprobs": s.logprobs,
                 "entropy_after": [None if math.isnan(h) else h for h in s.entropy_after],
                 "children": s.children, "ends_in_B": s.ends_in_B, "reward": s.reward, "advantage": s.advantage}
            if texts is not None:
                d["text"] = texts[s.id]
            segments.append(d)
        leaves = [{"segment": i, "correct": self.segments[i].leaf.correct, "length": self.segments[i].leaf.length,
                   "finished": self.segments[i].leaf.finished, "reward": self.segments[i].leaf.reward,
                   "advantage": self.segments[i].leaf.advantage} for i in self.leaves()]
        best = best_leaf(self)
        return {"prompt_ids": self.prompt_ids, "budget": self.budget, "root_children": self.root_children,
                "root_reward": self.root_reward, "advantage_kind": self.advantage_kind, "segments": segments,
                "leaves": leaves, "backtracking": self.backtracking, "selected": self.selected,
                "best": None if best is None else {"leaf": best, "length": self.segments[best].leaf.length},
                "stopped": self.stopped, "meta": self.meta,
                "n_tokens": self.n_tokens, "n_chain_tokens": self.n_chain_tokens}

    @classmethod
    def from_dict(cls, d: dict) -> SearchTree:
        """Inverse of `to_dict` (token strings and derived counts are dropped)."""
        leaves = {x["segment"]: Leaf(correct=x["correct"], length=x["length"], finished=x["finished"],
                                     reward=x["reward"], advantage=x["advantage"]) for x in d["leaves"]}
        segments = [Segment(id=s["id"], parent=s["parent"], start=s["start"], token_ids=list(s["token_ids"]),
                            logprobs=list(s["logprobs"]),
                            entropy_after=[NAN if h is None else h for h in s["entropy_after"]],
                            iteration=s["iteration"], children=list(s["children"]), ends_in_B=s["ends_in_B"],
                            leaf=leaves.get(s["id"]), reward=s["reward"], advantage=s["advantage"])
                    for s in d["segments"]]
        tree = cls(prompt_ids=list(d["prompt_ids"]), budget=d["budget"], segments=segments,
                   root_children=list(d["root_children"]), root_reward=d["root_reward"],
                   backtracking=list(d["backtracking"]), selected=list(d["selected"]), stopped=d["stopped"],
                   advantage_kind=d["advantage_kind"], meta=dict(d["meta"]))
        check_structure(tree)
        return tree


def check_structure(tree: SearchTree) -> None:
    """ValueError unless the segments form one tree below the root, as `add_completion` and `split`
    build it: segments[i].id == i, every child an index of `segments` whose `parent` names the segment
    (None below the root) listing it, and every segment reached exactly once from the root. A tree
    read from a file could otherwise hold a cycle, on which `dfs` and `path` never end."""
    n = len(tree.segments)
    for i, s in enumerate(tree.segments):
        if s.id != i:
            raise ValueError(f"segment {i} has id {s.id!r}")
    seen = [False] * n
    stack = [(None, c) for c in reversed(tree.root_children)]
    while stack:
        parent, c = stack.pop()
        where = "the root" if parent is None else f"segment {parent}"
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < n:
            raise ValueError(f"{where} lists child {c!r}, not a segment of the {n}")
        if seen[c]:
            raise ValueError(f"{where} lists segment {c} again: the segments hold a cycle or a shared child")
        if tree.segments[c].parent != parent:
            raise ValueError(f"{where} lists segment {c}, whose parent is {tree.segments[c].parent!r}")
        seen[c] = True
        stack.extend((c, g) for g in reversed(tree.segments[c].children))
    if not all(seen):
        raise ValueError(f"segment {seen.index(False)} is not reached from the root")


def best_leaf(tree: SearchTree) -> int | None:
    """Eq. 5 (Alg. 1 line 5): the shortest correct complete path, as its leaf id.

    Ties go to the earliest created leaf; None when no path is correct.
    """
    correct = [i for i in tree.leaves() if tree.segments[i].leaf.correct]
    return min(correct, key=lambda i: (tree.segments[i].leaf.length, i), default=None)
