"""Batch assembly: dynamic sampling fills a training batch with whole trees, then cuts it into
optimizer steps.

A batch holds `target` complete chains, for DAPO (K = 0: a tree is a group of G) and BFS-PO alike
(Sec. 4.2: "the same number of total sequences used in DAPO, obtained using multiple questions and
trees"). Trees without signal are dropped (DAPO's constraint 0 < |{o_i correct}| < G, Eq. 2;
`keep_tree`). Each generation round asks for more questions than the missing chains need, and rounds
repeat until the batch is full or `max_rounds` are spent. How many more is the sampling rule
(`SAMPLINGS`, `ask_rate`): "fixed" asks `oversample` times the need, as verl's DAPO recipe does;
"keep_rate" asks for the questions the batch will keep, at the keep rate seen so far in the run
(`KeepRate`), between 1x the need and `oversample`. Which questions are drawn, in which order, is
the data order under either rule: the rule sets only how many. The batch is taken in the order
the questions were drawn; the trees drawn after the last one it takes are dropped and their
questions go back to the data order (`prefix`), so that the next step starts where this one's
batch ended, whatever the rule asked for. On one streamed engine loop (`fill_streamed`) there are
no rounds, and the batch is taken in draw order whatever order the trees finish in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def tree_chains(tree) -> int:
    """Complete chains of a tree (its leaves): what a batch counts."""
    return len(tree.leaves())


def questions_to_ask(missing: int, chains_per_question: int, rate: float) -> int:
    """Questions one generation round asks for: ceil(rate * missing / chains_per_question).

    `chains_per_question` is G (K + 1), the chains of a fully expanded tree; a tree that stopped
    early, or is filtered out, brings fewer, which `rate` (`ask_rate`: `oversample`, or 1 / the keep
    rate seen so far) and the further rounds make up for.
    """
    if missing <= 0:
        return 0
    return math.ceil(rate * missing / chains_per_question - 1e-9)


SAMPLINGS = ("fixed", "keep_rate")  # TrainConfig `sampling`
KEEP_RATE_DECAY = 0.5  # weight of the counts of the steps before, at each step (`KeepRate.update`)


@dataclass(frozen=True)
class KeepRate:
    """The keep rate observed so far in a run: chains that the filter kept over the chains the questions
    generated would hold fully expanded (G (K + 1) each), both summed over the steps with each earlier
    step's counts weighted down by KEEP_RATE_DECAY per step (an exponential moving average weighted by
    each step's volume, so a step that generated little moves it little). `asked` 0: no step yet."""

    kept: float = 0.0
    asked: float = 0.0

    def update(self, kept_chains: int, questions: int, chains_per_question: int) -> KeepRate:
        """The estimate after a step whose `questions` generated trees kept `kept_chains` chains."""
        return KeepRate(KEEP_RATE_DECAY * self.kept + kept_chains,
                        KEEP_RATE_DECAY * self.asked + questions * chains_per_question)

    @property
    def value(self) -> float:
        """The estimated keep rate; NaN before the first step."""
        return self.kept / self.asked if self.asked else float("nan")


def ask_rate(sampling: str, estimate: KeepRate, oversample: float, floor: float = 1.0) -> float:
    """Questions asked per question the missing chains need (`questions_to_ask`'s factor): `oversample`
    under "fixed", and also under "keep_rate" before any step has been seen or when nothing was kept;
    otherwise 1 / the estimated keep rate, bounded by `floor` below (a keep rate overestimated by
    chance must not starve the batch: 1x asks at least what a batch kept whole would need) and by
    `oversample` above."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; expected one of {SAMPLINGS}")
    rate = estimate.value
    if sampling == "fixed" or not rate > 0:
        return oversample
    return min(oversample, max(floor, 1.0 / rate))


def questions_to_add(missing: int, sure: int, pending: int, chains_per_question: int, rate: float) -> int:
    """Questions a streamed rollout adds now (`fill_streamed`): those a lockstep round would ask for
    the chains that neither the finished kept trees (`missing` is what they leave of the batch) nor
    the growing trees already known to be kept (`sure`, each counted at its full G (K + 1) chains)
    will bring, less the growing trees whose verdict is still open (`pending`).

    A pending tree is expected to bring G (K + 1) / rate chains, the keep rate `rate` assumes in a
    lockstep round (`questions_to_ask`, `ask_rate`): with nothing sure, the pending trees are the
    questions in flight that a round would ask. Under `filter: first_samples` a tree is sure once its
    G first answers pass the filter, so the K expansions it still has to grow are not taken for a
    question in flight that the batch still needs.
    """
    return max(0, questions_to_ask(missing - sure * chains_per_question, chains_per_question, rate) - pending)


@dataclass
class Filled:
    """What dynamic sampling produced for one batch (on one rank)."""

    kept: list = field(default_factory=list)  # trees with signal, in generation order
    generated: list = field(default_factory=list)  # the generated trees (after `prefix`: those of the batch's prefix)
    rounds: int = 0
    aborted: int = 0  # trees started and dropped unused, after the batch's prefix
    aborted_tokens: int = 0  # the tokens generated for them


def fill(generate: Callable[[int, int], list], keep: Callable[[object], bool], target: int,
         chains_per_question: int, rate: float, max_rounds: int,
         agree: Callable[[bool], bool] = bool) -> Filled:
    """Generation rounds until `select` can fill `target` chains from the kept trees, or
    `max_rounds` rounds are spent.

    `generate(n_questions, round)` builds (and scores) the trees of the next n questions; `keep`
    is the dynamic-sampling filter. Each round asks for the chains that `select` still lacks (trees
    come in sizes that need not add up to the target, so kept chains alone are not the measure),
    `rate` times the questions they need (`ask_rate`: the first round and every later one alike).

    `agree(short)` turns this rank's "my batch is short" into the decision of all ranks
    (bfspo.training.dist.any_rank: another round while any rank is short and rounds remain), so that
    every rank runs the same rounds and meets the others in the same collectives; a rank whose batch
    is full generates nothing in the rounds it runs for the others. Alone, `agree` is the identity.
    """
    out = Filled()
    have = 0
    while out.rounds < max_rounds and agree(have < target):
        n = questions_to_ask(target - have, chains_per_question, rate)
        trees = generate(n, out.rounds) if n else []
        out.generated.extend(trees)
        out.kept.extend(t for t in trees if keep(t))
        have = sum(tree_chains(t) for t in select(out.kept, target))
        out.rounds += 1
    return out


def prefix(filled: Filled, target: int) -> Filled:
    """A lockstep `fill` cut to its batch's prefix, as `fill_streamed` cuts its own: the trees up to
    the one with which `select` fills `target` chains, in draw order; the trees after it are counted
    in `aborted` and `aborted_tokens`, for the caller to give their questions back to the data
    order. `select` over the prefix's kept trees is the batch itself. A batch left short keeps
    every tree."""
    batch = select(filled.kept, target)
    if sum(tree_chains(t) for t in batch) < target:
        return filled
    last = next(i for i, t in enumerate(filled.generated) if t is batch[-1])
    last_kept = next(i for i, t in enumerate(filled.kept) if t is batch[-1])  # kept: in draw order too
    dropped = filled.generated[last + 1:]
    return Filled(kept=filled.kept[:last_kept + 1], generated=filled.generated[:last + 1], rounds=filled.rounds,
                  aborted=len(dropped), aborted_tokens=sum(t.n_tokens for t in dropped))


def fill_streamed(search, add: Callable[[], None], keep: Callable[[object], bool], target: int,
                  chains_per_question: int, oversample: float, max_rounds: int, rate: float | None = None) -> Filled:
    """Dynamic sampling on one engine loop (bfspo.rollout.streamed.StreamedSearch), the batch taken
    in draw order.

    Trees are numbered in the order their questions were added, which is the data order. The batch
    is `select` over the kept trees of the shortest prefix of that order whose trees have all
    finished and fill `target` chains. A tree enters by its place in the draw order, never by when
    it finished: a later tree that finished first waits for the trees before it, while the engine
    keeps running them. So the batch does not depend on the engine's timing, and it is the batch
    that `fill` makes of the same trees when it fills in its first round.

    `add()` plants the next question's tree in `search`. Questions are added while the engine has
    room for their G samples and the chains the trees will bring fall short of the batch
    (`questions_to_add`): the finished kept trees count as present (`select` over the prefix's batch
    and the later finished kept trees), a growing tree that `keep` already keeps (past line 2:
    `search.expanding()`) as its full G (K + 1) chains, and any other growing tree at the keep rate
    1 / `rate` (`ask_rate`; `oversample` when None), so that the questions in flight are those a
    lockstep round would ask at that rate. `keep` must be settled once true: a tree it keeps while
    growing it keeps finished (keep_tree's filters are: the first answers do not change, and a mix of
    right and wrong leaves stays mixed). At most `max_rounds` times the questions of a lockstep round
    that misses the whole batch at `oversample` are asked, whatever `rate`: the bound on the work,
    not its pace. Which questions are added, in which order, is the data order whatever
    this rule decides; the rule sets only how far past the batch's prefix the engine works.

    When the batch is full, the trees after its prefix are dropped: those still growing are aborted,
    the finished ones discarded. `generated` and `kept` hold the prefix's trees, in draw order;
    `aborted` counts the dropped trees and `aborted_tokens` the tokens generated for them, partial
    samples included (`search.abort()`), so that the caller can give their questions back to the
    data order and count the work. `rounds` is 1: there are no rounds.
    """
    done: dict[int, object] = {}
    kept: dict[int, bool] = {}
    batch, chains, prefix = [], 0, 0  # `select` over the kept trees of trees 0 .. prefix - 1
    asked, most = 0, max_rounds * questions_to_ask(target, chains_per_question, oversample)
    while True:
        while prefix in done and chains < target:
            if kept[prefix]:
                batch = select(batch + [done[prefix]], target)  # first fit goes on where it stopped
                chains = sum(tree_chains(t) for t in batch)
            prefix += 1
        if chains >= target:
            break
        later = [done[i] for i in sorted(done) if i >= prefix and kept[i]]
        have = sum(tree_chains(t) for t in select(batch + later, target))
        sure = sum(1 for t in search.expanding() if keep(t))
        wanted = questions_to_add(target - have, sure, search.growing - sure, chains_per_question,
                                  oversample if rate is None else rate)
        while asked < most and wanted > 0 and (search.growing == 0 or search.room() >= search.group_size):
            add()
            asked += 1
            wanted -= 1
        if not search.growing:
            break
        for i in search.step():
            done[i] = search.trees[i]
            kept[i] = keep(done[i])
    aborted_tokens = search.abort() + sum(done[i].n_tokens for i in done if i >= prefix)
    generated = [done[i] for i in range(prefix)]
    return Filled(kept=[t for i, t in enumerate(generated) if kept[i]], generated=generated, rounds=1,
                  aborted=asked - prefix, aborted_tokens=aborted_tokens)


def select(kept: Sequence, target: int) -> list:
    """Whole trees, first fit in generation order, holding at most `target` chains: a tree that
    would overflow the batch is skipped for a later, smaller one. A single tree larger than the
    whole batch is taken alone (and only when nothing was taken before it)."""
    batch, chains = [], 0
    for tree in kept:
        n = tree_chains(tree)
        if chains + n <= target or not batch and n > target:
            batch.append(tree)
            chains += n
        if chains >= target:
            break
    return batch


def batch_stats(filled: Filled, batch: Sequence, target: int) -> dict:
    """One rank's batch statistics: questions asked (those dropped after the batch's prefix too),
    generated and kept, the chains of the kept trees, trees and chains trained on, the chains
    asked for, generation rounds, and whether the batch reached its `target` chains."""
    chains = sum(tree_chains(t) for t in batch)
    return {"questions_asked": len(filled.generated) + filled.aborted, "questions_generated": len(filled.generated),
            "questions_kept": len(filled.kept), "chains_kept": sum(tree_chains(t) for t in filled.kept),
            "trees": len(batch), "chains": chains, "chains_target": target, "gen_rounds": filled.rounds,
            "batch_full": chains >= target}


def merge_ranks(ranks: Sequence[dict]) -> dict:
    """The global batch statistics from every rank's `batch_stats`: counts summed, the most rounds
    any rank spent, and full only when every rank's share is full."""
    total = {k: sum(r[k] for r in ranks) for k in ("questions_asked", "questions_generated", "questions_kept",
                                                    "chains_kept", "trees", "chains", "chains_target")}
    return total | {"gen_rounds": max(r["gen_rounds"] for r in ranks), "batch_full": all(r["batch_full"] for r in ranks)}


def minibatch_plan(chains: list[list[int]], size: int) -> list[list[tuple[int, int]]]:
    """Global mini-batches of whole trees, each (rank, tree index) pairs, from every rank's chain counts.

    Trees are taken in an order that interleaves the ranks (rank 0's first tree, rank 1's first
    tree, ..., rank 0's second tree, ...) and cut into mini-batches of at most `size` chains (a tree
    larger than `size` is a mini-batch of its own). Every rank computes the same plan, so all take
    the same optimizer steps, and a batch split over ranks is trained exactly as one process
    would train it (App. C: 512 chains in mini-batches of 32 = 16 steps; fewer when dynamic
    sampling could not fill the batch).
    """
    order = [(r, i) for i in range(max(map(len, chains), default=0)) for r in range(len(chains)) if i < len(chains[r])]
    plan, current, n = [], [], 0
    for r, i in order:
        if current and n + chains[r][i] > size:
            plan.append(current)
            current, n = [], 0
        current.append((r, i))
        n += chains[r][i]
    return plan + [current] if current else plan
