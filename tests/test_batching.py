"""Batch assembly (bfspo/training/batching.py): dynamic sampling fills the batch for DAPO and BFS-PO
alike, first-fit selection of whole trees, the batch statistics and the mini-batch plan."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from bfspo.algorithm.advantages import assign_advantages, assign_rewards, keep_tree
from bfspo.algorithm.search import build_trees
from bfspo.rollout.base import Completion
from bfspo.training import batching
from bfspo.training.batching import minibatch_plan

ANSWER = 7  # a path is correct iff its last token is the answer


class BetaEngine:
    """Per-question accuracy p ~ Beta(mean * c, (1 - mean) * c); each completion (initial or
    expansion) is correct with probability p, of random length (10 to 40 tokens, so every path has
    backtracking candidates) and entropies."""

    def __init__(self, mean: float, concentration: float = 4.0, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.a, self.b = mean * concentration, (1 - mean) * concentration
        self.accuracy: dict[int, float] = {}

    def question(self) -> list[int]:
        qid = 1000 + len(self.accuracy)
        self.accuracy[qid] = float(self.rng.beta(self.a, self.b))
        return [qid]

    def generate(self, contexts, n, max_new_tokens, *, temperature=1.0, top_p=1.0, seed=None, keys=None):
        budgets = [max_new_tokens] * len(contexts) if isinstance(max_new_tokens, int) else max_new_tokens
        out = []
        for context, budget in zip(contexts, budgets):
            p = self.accuracy[context[0]]
            comps = []
            for _ in range(n):
                length = int(self.rng.integers(min(budget, 10), min(budget, 40) + 1))
                tokens = [int(t) for t in self.rng.integers(10, 50, size=length)]
                if self.rng.random() < p:
                    tokens[-1] = ANSWER
                comps.append(Completion(tokens, [-0.1] * length, list(self.rng.uniform(0.1, 2.0, size=length)), True))
            out.append(comps)
        return out


def rollout(engine: BetaEngine, k: int, group_size: int = 8, budget: int = 64, filter: str = "all_leaves"):
    """What Trainer.rollout hands to `batching.fill`: Algorithm 1, rewards, advantages."""
    def generate(n, round_):
        prompts = [engine.question() for _ in range(n)]
        trees = build_trees(engine, prompts, [lambda ids: ids[-1] == ANSWER] * n, group_size=group_size, k=k,
                            budget=budget, seed=round_, filter=filter)
        for tree in trees:
            assign_rewards(tree)
            assign_advantages(tree, "branch")
        return trees
    return generate


@pytest.mark.parametrize("mean", [0.84, 0.5])
@pytest.mark.parametrize("k", [0, 3])
def test_both_methods_fill_512_chains_and_take_16_steps(mean, k):
    engine = BetaEngine(mean, seed=k)
    filled = batching.fill(rollout(engine, k), keep_tree, target=512, chains_per_question=8 * (k + 1),
                           rate=3.0, max_rounds=10)
    batch = batching.select(filled.kept, 512)
    stats = batching.batch_stats(filled, batch, 512)
    assert stats["chains"] == 512 and stats["batch_full"] is True
    assert len(minibatch_plan([[batching.tree_chains(t) for t in batch]], 32)) == 16
    assert stats["questions_generated"] == len(engine.accuracy) >= stats["questions_kept"] >= stats["trees"]


def test_first_samples_filter_fills_the_batch_with_mixed_first_groups_only():
    """The batch filter is the search's: under 'first_samples' every kept tree has a mixed first group,
    every dropped one holds its G first answers only (no expansion spent), and the batch still fills."""
    kept = {}
    for filter in ("all_leaves", "first_samples"):
        engine = BetaEngine(0.84, seed=1)
        filled = batching.fill(rollout(engine, 3, filter=filter), lambda t: keep_tree(t, filter), target=512,
                               chains_per_question=32, rate=3.0, max_rounds=10)
        batch = batching.select(filled.kept, 512)
        assert batching.batch_stats(filled, batch, 512)["batch_full"] is True
        kept[filter] = filled.kept
        if filter == "first_samples":
            assert all(keep_tree(t, "first_samples") for t in filled.kept)
            dropped = [t for t in filled.generated if not keep_tree(t, "first_samples")]
            assert dropped and all(len(t.leaves()) == 8 and not t.backtracking for t in dropped)
    # 'all_leaves' keeps trees whose first answers were all correct (at 84% accuracy, many)
    assert any(not keep_tree(t, "first_samples") for t in kept["all_leaves"])


def study_arms(config: str) -> list[tuple[str, dict]]:
    """(method, its TrainConfig batch settings) of each arm of a study config: `train`, then the method's."""
    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / config).read_text())
    return [(name, dict(cfg["train"], k=m["k"], **m.get("train", {}))) for name, m in cfg["methods"].items()]


@pytest.mark.parametrize("config, mean", [("config/toy-breakdown.yaml", 0.745), ("config/toy-breakdown-hard.yaml", 0.63)])
def test_every_arm_of_the_breakdown_study_fills_its_batches(config, mean):
    """Issue 25: each arm's oversample and max_gen_rounds fill every batch at the toy's first-sample
    accuracy (74.5% in the current regime, 63-64.5% in the harder one, at T = 1), with questions as
    uneven as Beta(4 mean, 4 (1 - mean)) (a quarter of G = 8 groups all correct at 74.5%); five
    batches per arm."""
    for name, arm in study_arms(config):
        engine = BetaEngine(mean, seed=len(name))
        target = arm["train_batch"]
        for _ in range(5):
            filled = batching.fill(rollout(engine, arm["k"], group_size=arm["group_size"], filter=arm["filter"]),
                                   lambda t: keep_tree(t, arm["filter"]), target=target,
                                   chains_per_question=arm["group_size"] * (arm["k"] + 1),
                                   rate=arm["oversample"], max_rounds=arm["max_gen_rounds"])
            stats = batching.batch_stats(filled, batching.select(filled.kept, target), target)
            assert stats["batch_full"] and stats["gen_rounds"] <= 4, (name, stats)


def test_the_old_sampling_leaves_dapo_short_at_84_percent():
    # issue 14: no oversampling and 3 rounds left DAPO's batches short where the model is good
    engine = BetaEngine(0.84, seed=0)
    filled = batching.fill(rollout(engine, 0), keep_tree, target=512, chains_per_question=8, rate=1.0,
                           max_rounds=3)
    stats = batching.batch_stats(filled, batching.select(filled.kept, 512), 512)
    assert stats["chains"] < 512 and stats["batch_full"] is False and stats["gen_rounds"] == 3


class Tree:
    def __init__(self, chains, keep=True):
        self.chains, self.keep, self.n_tokens = chains, keep, 10 * chains

    def leaves(self):
        return list(range(self.chains))


@pytest.mark.parametrize("missing, per_question, oversample, n", [
    (512, 8, 3.0, 192),  # DAPO: 64 groups needed, 3x asked for
    (512, 32, 3.0, 48),  # BFS-PO K=3: 16 trees needed
    (20, 8, 1.0, 3),  # ceil(2.5)
    (20, 8, 1.5, 4),  # ceil(3.75)
    (0, 8, 3.0, 0),
])
def test_questions_to_ask(missing, per_question, oversample, n):
    assert batching.questions_to_ask(missing, per_question, oversample) == n


def test_fill_stops_when_full_or_out_of_rounds():
    asked = []

    def generate(n, round_):
        asked.append((n, round_))
        return [Tree(8, keep=i % 2 == 0) for i in range(n)]  # half the groups have signal

    filled = batching.fill(generate, lambda t: t.keep, target=64, chains_per_question=8, rate=1.0, max_rounds=10)
    # round 0: 8 asked, 4 kept (32 chains); round 1: 4 asked, 2 kept; round 2: 2 asked, 1 kept; round 3: 1 asked, 1 kept
    assert asked == [(8, 0), (4, 1), (2, 2), (1, 3)]
    assert filled.rounds == 4 and len(filled.kept) == 8 and len(filled.generated) == 15
    short = batching.fill(lambda n, r: [Tree(8, keep=False)] * n, lambda t: t.keep, 64, 8, 3.0, max_rounds=2)
    assert short.rounds == 2 and short.kept == [] and len(short.generated) == 48


def test_select_is_first_fit_of_whole_trees():
    trees = [Tree(c) for c in (20, 20, 16, 8, 4)]
    assert [t.chains for t in batching.select(trees, 32)] == [20, 8, 4]  # the second 20 and the 16 overflow
    assert [t.chains for t in batching.select(trees, 64)] == [20, 20, 16, 8]
    assert [t.chains for t in batching.select([Tree(40), Tree(8)], 32)] == [40]  # larger than the batch: alone
    assert batching.select([], 32) == []


def test_a_lockstep_fill_is_cut_to_its_batch_prefix():
    """Issue 47: the trees drawn after the one that fills the batch are dropped (their questions go
    back to the data order), the batch unchanged; a short batch keeps every tree."""
    trees = [Tree(16), Tree(16, keep=False), Tree(20), Tree(16), Tree(8), Tree(16), Tree(16, keep=False)]
    kept = [t for t in trees if t.keep]
    filled = batching.Filled(kept=kept, generated=trees, rounds=2)
    cut = batching.prefix(filled, 32)  # 16, then 20 overflows, then 16: full at the fourth tree
    assert cut.generated == trees[:4] and cut.kept == [trees[0], trees[2], trees[3]] and cut.rounds == 2
    assert cut.aborted == 3 and cut.aborted_tokens == 10 * (8 + 16 + 16)
    assert batching.select(cut.kept, 32) == batching.select(kept, 32) == [trees[0], trees[3]]
    assert batching.prefix(filled, 200) is filled
    stats = batching.batch_stats(cut, batching.select(cut.kept, 32), 32)
    assert stats["questions_asked"] == 7 and stats["questions_generated"] == 4


def test_batch_stats_and_merge_over_ranks():
    filled = batching.Filled(kept=[Tree(20), Tree(8), Tree(4)], generated=[Tree(20)] * 5, rounds=2)
    a = batching.batch_stats(filled, [Tree(20), Tree(8), Tree(4)], 32)
    assert a == {"questions_asked": 5, "questions_generated": 5, "questions_kept": 3, "chains_kept": 32, "trees": 3,
                 "chains": 32, "chains_target": 32, "gen_rounds": 2, "batch_full": True}
    b = batching.batch_stats(batching.Filled(kept=[Tree(8)] * 2, generated=[Tree(8)] * 9, rounds=10, aborted=3),
                             [Tree(8)], 32)
    assert b["batch_full"] is False and b["questions_asked"] == 12 and b["chains_kept"] == 16
    assert batching.merge_ranks([a, b]) == {"questions_asked": 17, "questions_generated": 14, "questions_kept": 5,
                                            "chains_kept": 48, "trees": 4, "chains": 40, "chains_target": 64,
                                            "gen_rounds": 10, "batch_full": False}


class StreamedFake:
    """A stand-in for bfspo.rollout.streamed.StreamedSearch: tree i finishes after a set number of
    engine steps with a set verdict and size (G leaves unless `sizes` says otherwise) and
    10 (i + 1) tokens; the engine holds `capacity` sequences, and a tree still growing when it is
    aborted has generated 1 token per engine step it ran. With `planted`, a tree has its first answers
    (and its verdict) after that many steps, and is `expanding` from then until it finishes; without,
    no tree expands (K = 0)."""

    group_size = 4

    def __init__(self, capacity: int, durations: list[int], kept: list[bool], sizes: list[int] | None = None,
                 planted: list[int] | None = None):
        self.capacity, self.durations, self.kept, self.sizes = capacity, durations, kept, sizes or [self.group_size]
        self.planted = planted
        self.trees, self.ends, self.starts, self.steps, self.peak = [], {}, {}, 0, 0
        self.finish_order, self.aborted = [], None

    @property
    def growing(self) -> int:
        return len(self.ends)

    def room(self) -> int:
        return self.capacity - self.group_size * self.growing

    def expanding(self) -> list:
        if self.planted is None:
            return []
        return [self.trees[i] for i in self.ends if self.steps - self.starts[i] >= self.planted[i % len(self.planted)]]

    def add(self) -> None:
        i = len(self.trees)
        chains = self.sizes[i % len(self.sizes)]
        self.trees.append(type("Tree", (), {"i": i, "keep": self.kept[i % len(self.kept)], "n_tokens": 10 * (i + 1),
                                            "leaves": lambda self, n=chains: [0] * n})())
        self.ends[i], self.starts[i] = self.steps + self.durations[i % len(self.durations)], self.steps
        self.peak = max(self.peak, self.group_size * self.growing)

    def step(self) -> list[int]:
        self.steps += 1
        done = sorted(i for i, end in self.ends.items() if end <= self.steps)
        for i in done:
            del self.ends[i]
        self.finish_order += done
        return done

    def abort(self) -> int:
        self.aborted = sorted(self.ends)
        tokens = sum(self.steps - self.starts[i] for i in self.ends)
        self.ends.clear()
        return tokens


def fill_streamed(search: StreamedFake, target: int = 16, oversample: float = 1.5, max_rounds: int = 4,
                  chains_per_question: int = StreamedFake.group_size):
    return batching.fill_streamed(search, search.add, lambda t: t.keep, target=target,
                                  chains_per_question=chains_per_question, oversample=oversample,
                                  max_rounds=max_rounds)


def test_streamed_filling_adds_questions_as_the_engine_has_room_and_keeps_their_order():
    """Trees finish out of order (later questions are quicker); a question joins whenever the engine
    has room for its G samples and the missing chains call for it; the batch is full, its trees in
    the order they were added, and the trees after its prefix are dropped."""
    search = StreamedFake(capacity=12, durations=[9, 2, 5, 1], kept=[True, False, True])
    filled = fill_streamed(search)
    assert search.finish_order != sorted(search.finish_order)
    assert [t.i for t in filled.generated] == list(range(len(filled.generated)))  # a prefix of the draw order
    assert [t.i for t in filled.kept] == [t.i for t in filled.generated if t.keep]
    assert sum(len(t.leaves()) for t in batching.select(filled.kept, 16)) == 16
    assert search.peak <= search.capacity and search.aborted is not None and filled.rounds == 1
    assert filled.aborted == len(search.trees) - len(filled.generated)  # those started after the prefix


def test_a_streamed_batch_is_taken_in_draw_order_never_by_finish_time():
    """Issue 36: tree 0 takes longest, its successors finish first. The batch waits for it: trees 0-3
    (16 chains), as a lockstep round over the same questions takes them; the quick later trees that
    finished first are dropped, their tokens counted with the partial ones of the trees still growing."""
    search = StreamedFake(capacity=40, durations=[12, 2, 2, 3, 1, 1, 1, 20, 20, 20], kept=[True])
    filled = fill_streamed(search, oversample=2.5)
    assert search.finish_order[:4] == [4, 5, 6, 1]  # trees 4-6 finished before trees 0-3
    assert [t.i for t in batching.select(filled.kept, 16)] == [0, 1, 2, 3]
    assert [t.i for t in filled.generated] == [0, 1, 2, 3]
    dropped = [t for t in search.trees if t.i >= 4]
    assert filled.aborted == len(dropped) == 6 and search.aborted == [7, 8, 9]
    finished = sum(t.n_tokens for t in dropped if t.i not in search.aborted)
    assert filled.aborted_tokens == finished + 3 * 12  # trees 7-9 ran 12 engine steps each


@pytest.mark.parametrize("seed", range(6))
def test_a_streamed_batch_does_not_depend_on_the_finish_order(seed):
    """Trees of 4, 8 and 12 chains, kept or not, finishing after random numbers of engine steps (and
    known kept at a random step before, in half the cases), in engines of several sizes: the batch,
    the trees generated and the questions consumed are those of the same questions in one lockstep
    round (`fill`, first round), whatever the timing and however many questions were started."""
    rng = np.random.default_rng(seed)
    kept, sizes = [bool(k) for k in rng.integers(0, 2, 30)] + [True], [int(c) for c in rng.choice([4, 8, 12], 31)]
    durations = [int(d) for d in rng.integers(1, 20, 31)]
    planted = [int(rng.integers(1, d + 1)) for d in durations] if seed % 2 else None
    search = StreamedFake(capacity=int(rng.choice([8, 16, 64])), durations=durations, kept=kept, sizes=sizes,
                          planted=planted)
    filled = fill_streamed(search, target=24, oversample=3.0, max_rounds=10)
    lockstep = batching.fill(lambda n, r: search.trees[:n] if r == 0 else [], lambda t: t.keep, target=24,
                             chains_per_question=4, rate=3.0, max_rounds=1)
    expected = batching.select(lockstep.kept, 24)
    assert sum(len(t.leaves()) for t in expected) == 24, "the lockstep round must fill the batch for this test"
    assert [t.i for t in batching.select(filled.kept, 24)] == [t.i for t in expected]
    last = expected[-1].i
    assert [t.i for t in filled.generated] == list(range(last + 1))  # the prefix up to the batch's last tree


@pytest.mark.parametrize("missing, sure, pending, n", [
    (64, 0, 0, 12),  # nothing in flight: a lockstep round's ceil(3 * 64 / 16) questions
    (64, 0, 12, 0),  # a round's questions in flight, none with a verdict yet
    (64, 0, 8, 4),  # 4 of them filtered out on their first answers: 4 more
    (64, 2, 6, 0),  # 2 kept bring 32 chains: the 32 left call for 6 questions, 6 are pending
    (64, 2, 4, 2),
    (64, 4, 3, 0),  # the kept trees bring the batch: nothing more, however many are pending
    (64, 5, 0, 0),
    (16, 0, 0, 3),  # the finished kept trees left 16 chains: ceil(3 * 16 / 16)
    (0, 0, 0, 0),
])
def test_questions_to_add_counts_kept_growing_trees_as_their_chains(missing, sure, pending, n):
    """paper.yaml's trees (K = 3, G = 4: 16 chains) at oversample 3: a growing tree past the filter counts
    as 16 chains, one still open as 16 / 3."""
    assert batching.questions_to_add(missing, sure, pending, chains_per_question=16, rate=3.0) == n


def test_a_streamed_rollout_does_not_add_questions_for_trees_already_kept():
    """BFS-PO's trees (16 chains) with `filter: first_samples`: a tree filtered on its first answers
    finishes after 2 engine steps, one that passes grows its expansions for 8 more. One in three passes:
    a lockstep round's 12 questions bring the 4 trees of the batch. The streamed loop starts those 12
    and no more: the trees that passed count as their 16 chains, not as questions in flight. Counting
    them as questions, it would have replaced each of the 8 filtered trees as it finished."""
    search = StreamedFake(capacity=64, durations=[2, 10, 2], kept=[False, True, False], sizes=[16], planted=[2])
    filled = fill_streamed(search, target=64, oversample=3.0, max_rounds=10, chains_per_question=16)
    assert len(search.trees) == 12 == batching.questions_to_ask(64, 16, 3.0)
    assert [t.i for t in batching.select(filled.kept, 64)] == [1, 4, 7, 10]
    assert [t.i for t in filled.generated] == list(range(11)) and filled.aborted == 1  # tree 11, filtered


def test_streamed_filling_stops_after_max_rounds_worth_of_questions():
    """Nothing is kept: questions are asked until max_rounds lockstep rounds' worth have finished."""
    search = StreamedFake(capacity=8, durations=[3, 1], kept=[False])
    filled = fill_streamed(search, oversample=2.0, max_rounds=3)
    assert filled.kept == [] and len(filled.generated) == len(search.trees) == 3 * 8
    assert filled.aborted == filled.aborted_tokens == 0


def test_no_filter_keeps_every_group_and_generates_only_the_batch():
    """`filter: none` with oversample 1 (bench/bench_peer_trl.py's all-groups arms, as TRL): one round of
    exactly the batch's questions, every group kept, those without signal (all right or all wrong)
    included; the filtered reading drops them and generates more."""
    generated = {}
    for filter in ("none", "all_leaves"):
        engine = BetaEngine(0.84, seed=2)
        filled = batching.fill(rollout(engine, 0, filter=filter), lambda t: keep_tree(t, filter), target=64,
                               chains_per_question=8, rate=1.0, max_rounds=10)
        batch = batching.select(filled.kept, 64)
        assert batching.batch_stats(filled, batch, 64)["batch_full"] is True
        generated[filter] = len(filled.generated)
        if filter == "none":
            assert len(filled.generated) == len(filled.kept) == len(batch) == 8
            assert any(not keep_tree(t, "all_leaves") for t in batch), "groups without signal are trained too"
    assert generated["all_leaves"] > generated["none"]


def test_the_keep_rate_estimate_weighs_each_step_by_its_volume_and_decays():
    """KeepRate: chains kept over the chains the generated questions would hold fully expanded, the
    earlier steps' counts weighted by KEEP_RATE_DECAY at each step."""
    estimate = batching.KeepRate()
    assert np.isnan(estimate.value)
    estimate = estimate.update(kept_chains=16, questions=8, chains_per_question=4)
    assert estimate.value == 0.5
    estimate = estimate.update(kept_chains=32, questions=8, chains_per_question=4)
    d = batching.KEEP_RATE_DECAY
    assert estimate.value == pytest.approx((16 * d + 32) / (32 * d + 32))
    assert estimate.update(0, 0, 4).value == estimate.value  # a step that generated nothing changes nothing


@pytest.mark.parametrize("sampling, kept, asked, floor, rate", [
    ("fixed", 16, 32, 1.0, 3.0),  # verl's rule whatever the keep rate
    ("keep_rate", 0, 0, 1.0, 3.0),  # no step yet: as the fixed rule
    ("keep_rate", 0, 32, 1.0, 3.0),  # nothing kept: at most oversample
    ("keep_rate", 16, 32, 1.0, 2.0),  # half kept: twice the need
    ("keep_rate", 4, 32, 1.0, 3.0),  # an eighth kept: bounded by oversample
    ("keep_rate", 30, 32, 1.0, 32 / 30),
    ("keep_rate", 32, 32, 1.0, 1.0),
    ("keep_rate", 32, 32, 1.25, 1.25),  # bounded by the floor
])
def test_ask_rate_is_one_over_the_keep_rate_between_the_floor_and_oversample(sampling, kept, asked, floor, rate):
    assert batching.ask_rate(sampling, batching.KeepRate(kept, asked), 3.0, floor) == pytest.approx(rate)


def test_ask_rate_names_an_unknown_rule():
    with pytest.raises(ValueError, match="unknown sampling 'verl'"):
        batching.ask_rate("verl", batching.KeepRate(), 3.0)


def test_later_rounds_ask_for_the_shortfall_at_the_same_rate():
    asked = []

    def generate(n, round_):
        asked.append(n)
        return [Tree(8, keep=i % 2 == 0) for i in range(n)]  # half the groups have signal

    filled = batching.fill(generate, lambda t: t.keep, target=64, chains_per_question=8, rate=2.0, max_rounds=10)
    # 16 asked, 8 kept: full in one round; at 1.5x: 12 asked, 6 kept (48 chains), then ceil(1.5 * 16 / 8) = 3,
    # of which 2 kept fill the batch
    assert asked == [16] and filled.rounds == 1
    asked.clear()
    filled = batching.fill(generate, lambda t: t.keep, target=64, chains_per_question=8, rate=1.5, max_rounds=10)
    assert asked == [12, 3] and len(filled.kept) == 6 + 2 and filled.rounds == 2


@pytest.mark.parametrize("seed", range(8))
def test_a_streamed_step_trains_the_same_trees_under_both_sampling_rules(seed):
    """Issue 47: the rate sets only how far past the batch's prefix the engine works. Trees of random
    sizes, verdicts and durations: at every rate between 1x and oversample the batch, the trees
    generated and the questions consumed are the fixed rule's (rate = oversample), and the lower
    rates start fewer questions in all."""
    rng = np.random.default_rng(seed)
    kept, sizes = [bool(k) for k in rng.integers(0, 2, 40)] + [True], [int(c) for c in rng.choice([4, 8, 12], 41)]
    durations = [int(d) for d in rng.integers(1, 20, 41)]
    planted = [int(rng.integers(1, d + 1)) for d in durations] if seed % 2 else None
    capacity = int(rng.choice([16, 64, 256]))
    runs, started = {}, {}
    for rate in (None, 2.0, 1.4, 1.0):
        search = StreamedFake(capacity=capacity, durations=durations, kept=kept, sizes=sizes, planted=planted)
        filled = batching.fill_streamed(search, search.add, lambda t: t.keep, target=24, chains_per_question=4,
                                        oversample=3.0, max_rounds=10, rate=rate)
        runs[rate] = ([t.i for t in filled.generated], [t.i for t in batching.select(filled.kept, 24)])
        started[rate] = len(search.trees)
    assert runs[None][1] and all(run == runs[None] for run in runs.values())
    assert started[1.0] <= started[1.4] <= started[2.0] <= started[None] and started[1.0] < started[None]


def test_a_lockstep_step_trains_the_same_trees_under_both_sampling_rules():
    """Issue 47, lockstep: a tree is the data order's (its question, and its samples' seeds, follow
    its place in the step's draw order, whatever round draws it), and a step consumes its batch's
    prefix only (`prefix`). So at every rate between 1x and oversample the batch and the questions
    consumed are the fixed rule's, whether the smaller first round fills the batch or later rounds
    do; the lower rates draw fewer questions in all."""
    rounds, drawn_fixed, drawn_1x = set(), 0, 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        verdicts = [bool(v) for v in rng.random(200) < rng.uniform(0.3, 0.9)]

        def rollout(rate, verdicts=verdicts):
            drawn = []

            def generate(n, round_):
                out = [Tree(8, keep=verdicts[len(drawn) + i]) for i in range(n)]
                for i, tree in enumerate(out):
                    tree.place = len(drawn) + i
                drawn.extend(out)
                return out
            filled = batching.prefix(batching.fill(generate, lambda t: t.keep, target=64, chains_per_question=8,
                                                   rate=rate, max_rounds=10), 64)
            rounds.add(filled.rounds)
            return ([t.place for t in filled.generated], [t.place for t in batching.select(filled.kept, 64)]), len(drawn)
        fixed, most = rollout(3.0)
        assert len(fixed[1]) == 8
        for rate in (2.0, 1.4, 1.0):
            same, _ = rollout(rate)
            assert same == fixed
        drawn_fixed += most
        drawn_1x += rollout(1.0)[1]
    assert 1 in rounds and max(rounds) > 1 and drawn_1x < drawn_fixed
