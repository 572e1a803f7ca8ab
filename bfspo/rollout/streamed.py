"""Streamed tree expansion: Algorithm 1 on one vLLM engine loop, each tree at its own pace.

The lockstep rollout (bfspo.algorithm.search.build_trees) makes K+1 engine calls, and each call
waits for its longest chain: the engine runs its tail half-empty. Here every tree's requests go
into one engine loop (vLLM's request-level engine, bfspo.rollout.vllm_engine.VLLMEngine `add` /
`step`): when a tree's G samples have all finished, they are rescored (the entropies backtracking
needs, bfspo.rollout.rescore), the tree takes the same per-tree step the lockstep rollout takes
(`plant` or `grow`, then `next_expansion`) and its next G requests are added at once. New trees can
be added while others grow (dynamic sampling, bfspo.training.batching.fill_streamed).

Which groups are rescored together depends on the rescoring's rows (`RescoredEngine.pads_rows`):

- Rows padded to bucket lengths (the compiled flex kernel, on CUDA): finished groups wait to be
  rescored together, in shared rows (padded once per row, not once per group): they are rescored
  once the trees waiting would hold back PENDING_SHARE of the engine's sequences (their next G
  samples each), or once the engine runs under half its capacity (the drain, and a tail in which
  waiting would idle it), so at most that share of the engine waits. Which groups share a call
  then depends on when they finish, and so do the last bits of their numbers.
- Rows as they are (the blockwise kernel: CPU): sharing saves no padding, so each group is rescored alone as soon as it
  finishes, in rows of its own (`plan_micro_batches` of its tree alone). Its log-probs and
  entropies depend on its own tokens only, not on when it finished, and no group waits: a
  streamed run replays bit for bit (tests/test_streamed.py, tests/test_streamed_batches.py).

Batches fixed by the draw (trees i..i+n-1's groups of one iteration rescored together) would make
shared rows timing-free too, but each group would wait for its batch's slowest group (the share
rule bounds what waits, this would not), and a step's last batch for trees that dynamic sampling
may never add, so that when to give up on them would again be timing. On CUDA, where vLLM does not
replay its samples anyway (docs/algorithm.md, "Seeds and reproducibility"), the share rule costs less.

Sample j of tree i's iteration r (0: line 2) is seeded by (seed + r, i, r, j), as the lockstep
rollout seeds it (`keys`), so with per-request seeds both give the same samples, backtracking points
and rewards (tests/test_vllm_engine.py): a sample depends on its place in its tree, not on its place
in a call. Their log-probs and entropies agree to float rounding: a lockstep call rescores its
groups in shared rows. At temperature 0 a group is one request whose answer is repeated G times, as
`VLLMEngine.generate` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bfspo.algorithm.search import Expansion, Scorer, check_search_args, grow, next_expansion, plant
from bfspo.algorithm.tree import SearchTree

# TrainConfig `rollout`: "auto" is streamed on vLLM and lockstep on transformers
ROLLOUTS = ("auto", "lockstep", "streamed")
PENDING_SHARE = 1 / 8  # most of the engine's sequences that finished groups hold back while they wait


def resolve_rollout(rollout: str, engine: str) -> str:
    """The rollout a run uses: "lockstep" or "streamed" (which needs the vLLM engine)."""
    if rollout == "auto":
        return "streamed" if engine == "vllm" else "lockstep"
    return rollout


@dataclass
class _Group:
    """A tree's outstanding G samples: line 2 (`expansion` None) or one expansion; `requests` of
    them go to the engine (1 at temperature 0: the answer is repeated)."""

    iteration: int
    context: list[int]
    expansion: Expansion | None
    requests: int
    done: dict = field(default_factory=dict)  # request -> Completion


class StreamedSearch:
    """Search trees grown on one engine loop. `add` plants a tree (its G first samples are queued);
    `step` runs one engine step and returns the trees that finished with it; `abort` drops the
    trees still growing and says how many tokens they had cost.

    engine: a RescoredEngine around a VLLMEngine (its `engine`): the requests go to the latter,
    each finished group is rescored by the former (with others where its rows are padded).
    """

    def __init__(self, engine, *, group_size: int, k: int, budget: int, selection: str = "bfs",
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None, filter: str = "all_leaves"):
        check_search_args(group_size, k, budget, selection, filter)
        self.rescored, self.engine = engine, engine.engine
        self.together = engine.pads_rows  # finished groups wait to share rows, or go alone at once
        self.group_size, self.k, self.budget, self.selection, self.filter = group_size, k, budget, selection, filter
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.trees: list[SearchTree] = []
        self.scorers: list[Scorer] = []
        self.groups: dict[int, _Group] = {}  # tree -> its outstanding group
        self.pending: dict[int, _Group] = {}  # tree -> its finished group, waiting to be rescored
        self.requests: dict[str, tuple[int, int]] = {}  # request id -> (tree, child)

    @property
    def growing(self) -> int:
        """Trees not finished: with samples outstanding, or waiting to be rescored."""
        return len(self.groups) + len(self.pending)

    def expanding(self) -> list[SearchTree]:
        """The trees still growing past Alg. 1 line 2: their G first answers are in, an expansion
        is outstanding or waiting to be rescored; in tree order."""
        groups = self.groups | self.pending
        return [self.trees[i] for i in sorted(groups) if groups[i].expansion is not None]

    def room(self) -> int:
        """Sequences the engine can start now (its `max_num_seqs` less those in it)."""
        return self.engine.occupancy.capacity - self.engine.in_flight

    def add(self, prompt, score: Scorer) -> int:
        """Plant a tree for `prompt` (verifier `score`) and queue its G first samples; its index."""
        i = len(self.trees)
        self.trees.append(SearchTree(prompt_ids=list(prompt), budget=self.budget))
        self.scorers.append(score)
        self._queue(i, 0, list(prompt), None, self.budget)
        return i

    def _queue(self, i: int, iteration: int, context: list[int], expansion: Expansion | None, max_new: int) -> None:
        greedy = self.temperature == 0
        group = self.groups[i] = _Group(iteration, context, expansion, 1 if greedy else self.group_size)
        seed = None if self.seed is None or greedy else self.seed + group.iteration
        for j in range(group.requests):
            rid = self.engine.new_request_id()
            self.requests[rid] = (i, j)
            self.engine.add(rid, group.context, max_new, temperature=self.temperature, top_p=self.top_p,
                            seed=self.engine.sample_seed(seed, (i, group.iteration, j)))

    def step(self) -> list[int]:
        """One engine step; the indices of the trees it finished (K expansions done, or stopped)."""
        for rid, completion in self.engine.step():
            i, j = self.requests.pop(rid)
            group = self.groups[i]
            group.done[j] = completion
            if len(group.done) == group.requests:
                self.pending[i] = self.groups.pop(i)
        capacity = self.engine.occupancy.capacity
        if self.pending and (not self.together or self.group_size * len(self.pending) >= PENDING_SHARE * capacity
                             or 2 * self.engine.in_flight < capacity):
            return self._advance()
        return []

    def _advance(self) -> list[int]:
        """Rescore the waiting groups (together, or each alone: the module doc), then take each tree's
        step; the trees that finished."""
        waiting = {i: self.pending[i] for i in sorted(self.pending)}  # in tree order, whatever their finish order
        self.pending = {}
        samples = {i: [replace(group.done[c % group.requests]) for c in range(self.group_size)]
                   for i, group in waiting.items()}
        for call in ([[*waiting]] if self.together else [[i] for i in waiting]):
            self.rescored.rescore([waiting[i].context for i in call], [samples[i] for i in call])
        finished = []
        for i, group in waiting.items():
            tree, score = self.trees[i], self.scorers[i]
            if group.expansion is None:
                plant(tree, samples[i], score, self.k, self.filter)
            else:
                grow(tree, group.expansion, samples[i], score)
            e = next_expansion(tree, group.iteration + 1, self.k, self.selection)
            if e is None:
                finished.append(i)
            else:
                self._queue(i, e.iteration, e.context, e, e.max_new)
        return finished

    def abort(self) -> int:
        """Drop every outstanding request and waiting group; the trees still growing stay unfinished.
        Returns the tokens generated for them: their planted groups, the finished samples of their
        open and waiting groups, and what the engine had generated of the aborted requests
        (`VLLMEngine.abort`)."""
        tokens = sum(self.trees[i].n_tokens + sum(len(c.token_ids) for c in g.done.values())
                     for i, g in (*self.groups.items(), *self.pending.items()))
        tokens += self.engine.abort(list(self.requests))
        self.requests.clear()
        self.groups.clear()
        self.pending.clear()
        return tokens


def stream_trees(engine, prompts, scorers, **search) -> list[SearchTree]:
    """`build_trees`'s trees for these prompts, grown on one engine loop (`StreamedSearch`'s options)."""
    if len(scorers) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(scorers)} scorers")
    run = StreamedSearch(engine, **search)
    for prompt, score in zip(prompts, scorers):
        run.add(prompt, score)
    while run.growing:
        run.step()
    return run.trees
