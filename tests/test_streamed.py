"""StreamedSearch's rescoring. Where the rows are padded (issue 38), finished groups share rows:
they wait until they would hold back PENDING_SHARE of the engine's sequences, or until the engine
runs under half its capacity, and are then rescored in one call, in tree order; the trees waiting
still count as growing. Where they are not (issue 47), each group is rescored alone as soon as it
finishes, so neither the calls nor the numbers depend on the finish order. A fake engine finishes
each tree's requests after a set number of steps (the real engine's loop is
tests/test_vllm_engine.py's)."""

import itertools
import json
import math

import pytest

from bfspo.model_io import load_model
from bfspo.rollout.base import Completion, Occupancy
from bfspo.rollout.rescore import RescoredEngine
from bfspo.rollout.streamed import PENDING_SHARE, StreamedSearch, stream_trees


def three_tokens(tree: int, request: int) -> list[int]:
    return [tree + 10, tree + 11, 2]


class StepEngine:
    """The request-level engine's interface: a request of tree i finishes `durations[i]` steps after
    it was added; its answer is `answer(i, n)` for the tree's n-th request (default: 3 tokens, each
    tree's own), cut at its max_new tokens."""

    def __init__(self, capacity: int, durations: dict[int, int], answer=three_tokens):
        self.occupancy = Occupancy(capacity)
        self.durations, self.answer, self.in_flight, self.now, self.ids = durations, answer, 0, 0, 0
        self.queued: dict[str, tuple[int, list[int]]] = {}  # request id -> (finishing step, answer)
        self.asked: dict[int, int] = {}  # tree -> its requests so far

    def new_request_id(self) -> str:
        self.ids += 1
        return f"r{self.ids}"

    def sample_seed(self, seed, place):
        return None

    def add(self, rid, context, max_new, *, temperature, top_p, seed):
        tree = context[0]  # each prompt is [tree index, ...]
        n = self.asked[tree] = self.asked.get(tree, -1) + 1
        self.queued[rid] = (self.now + self.durations[tree], self.answer(tree, n)[:max_new])
        self.in_flight += 1

    def step(self):
        self.now += 1
        done = [rid for rid, (at, _) in self.queued.items() if at <= self.now]
        out = []
        for rid in done:
            ids = self.queued.pop(rid)[1]
            out.append((rid, Completion(ids, [-1.0] * len(ids), [math.nan] * len(ids), ids[-1] == 2)))
        self.in_flight -= len(out)
        return out

    def abort(self, rids):
        for rid in rids:
            self.queued.pop(rid, None)
        self.in_flight -= len(rids)
        return 0  # tokens of the aborted requests: this engine generates a request's all at its end


class Rescoring:
    """RescoredEngine's interface: records which contexts each call rescored together, and gives
    every token an entropy; its rows padded (`pads_rows`) or not."""

    def __init__(self, engine, pads_rows: bool = True):
        self.engine, self.pads_rows, self.calls = engine, pads_rows, []

    def rescore(self, contexts, groups):
        self.calls.append((self.engine.now, [c[0] for c in contexts]))
        for group in groups:
            for c in group:
                c.entropies = [math.nan] + [0.5] * (len(c.token_ids) - 1)


def test_finished_groups_wait_to_be_rescored_together():
    capacity, group = 64, 2
    assert PENDING_SHARE * capacity == 8  # four waiting groups of 2 samples
    durations = {0: 2, 1: 1, 2: 2, 3: 1} | {i: 30 for i in range(4, 20)}
    engine = StepEngine(capacity, durations)
    rescoring = Rescoring(engine)
    search = StreamedSearch(rescoring, group_size=group, k=1, budget=8, selection="bfs", filter="all_leaves")
    for i in range(20):
        search.add([i, 1, 1], lambda ids: True)
    assert engine.in_flight == 40 >= capacity / 2
    assert search.step() == [] and rescoring.calls == []  # trees 1 and 3 wait: 4 sequences held back
    assert len(search.pending) == 2 and search.growing == 20
    search.step()  # trees 0 and 2 finish too: 8 sequences held back, all four rescored at once, in tree order
    assert rescoring.calls == [(2, [0, 1, 2, 3])] and not search.pending
    while search.growing:
        search.step()
    # trees 0-3's expansions: 1 and 3 wait at step 3 (the engine still over half full), all four go at
    # step 4; the 16 others finish together at step 30, under half capacity, their expansions at 60
    rest = list(range(4, 20))
    assert rescoring.calls == [(2, [0, 1, 2, 3]), (4, [0, 1, 2, 3]), (30, rest), (60, rest)]
    assert all(len(t.leaves()) == 2 * group for t in search.trees)


def test_abort_drops_the_waiting_groups():
    engine = StepEngine(64, {i: (1 if i == 0 else 9) for i in range(20)})
    search = StreamedSearch(Rescoring(engine), group_size=2, k=1, budget=8)
    for i in range(20):
        search.add([i, 1], lambda ids: True)
    search.step()
    assert search.pending and search.growing == 20
    assert search.abort() == 2 * 3  # the waiting group's two samples of 3 tokens; the rest had none
    assert search.growing == 0 and engine.in_flight == 0


def test_expanding_trees_are_those_past_their_first_answers_waiting_or_not():
    """`expanding` (fill_streamed counts these trees' verdicts as settled): the trees whose G first
    answers are planted and whose expansion is outstanding or waiting to be rescored."""
    durations = {0: 2, 1: 1, 2: 2, 3: 1} | {i: 30 for i in range(4, 20)}
    engine = StepEngine(64, durations)
    search = StreamedSearch(Rescoring(engine), group_size=2, k=1, budget=8)
    for i in range(20):
        search.add([i, 1, 1], lambda ids: True)
    search.step()
    assert search.expanding() == []  # trees 1 and 3 wait with their first answers: not planted yet
    search.step()
    assert search.expanding() == search.trees[:4]  # planted, their expansions outstanding
    search.step()  # trees 1 and 3's expansions finish and wait to be rescored
    assert sorted(search.pending) == [1, 3] and search.expanding() == search.trees[:4]
    search.step()
    assert search.expanding() == []


def test_unpadded_rows_rescore_each_group_alone_as_it_finishes():
    """Rows not padded (the blockwise kernel): sharing them saves nothing, so no group waits and each
    is rescored alone, in the engine step that finished it."""
    durations = {0: 2, 1: 1, 2: 2, 3: 1} | {i: 30 for i in range(4, 20)}
    engine = StepEngine(64, durations)
    rescoring = Rescoring(engine, pads_rows=False)
    search = StreamedSearch(rescoring, group_size=2, k=1, budget=8)
    for i in range(20):
        search.add([i, 1, 1], lambda ids: True)
    assert search.step() == [] and rescoring.calls == [(1, [1]), (1, [3])] and not search.pending
    while search.growing:
        search.step()
    rest = [(at, [i]) for at in (30, 60) for i in range(4, 20)]
    # step 2: trees 0 and 2's first answers and 1 and 3's expansions, in tree order; step 4: 0 and 2's
    assert rescoring.calls == [(1, [1]), (1, [3]), (2, [0]), (2, [1]), (2, [2]), (2, [3]), (4, [0]), (4, [2]), *rest]


def answers(tree: int, request: int) -> list[int]:
    """Answers of 2 to 9 tokens, each request of each tree its own (ending with token 2, the end)."""
    n = 2 + (5 * tree + 3 * request) % 8
    return [20 + (7 * tree + 11 * request + 13 * t) % 250 for t in range(n - 1)] + [2]


class Recorded(RescoredEngine):
    """A RescoredEngine that records the trees (context[0]) and contexts of each call."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.calls = []

    def rescore(self, contexts, groups):
        self.calls.append(tuple((c[0], len(c)) for c in contexts))
        super().rescore(contexts, groups)


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return load_model(str(tiny_model_dir))[0].eval()


def test_the_finish_order_changes_neither_the_rescoring_calls_nor_the_numbers(tiny_model):
    """Issue 47: 6 trees (G = 3, K = 2) on the training model's rescoring (blockwise kernel, rows not
    padded), their groups finishing in 6 orders: the same calls (each group alone, as a multiset),
    and the same trees bit for bit: tokens, log-probs, entropies, and so the backtracking points.
    Rescored together by finish time, a group's numbers moved in their last bits with its
    neighbours (tests/test_rescore.py)."""
    trees, calls = [], []
    for order in list(itertools.permutations(range(3)))[:6]:
        durations = {i: 1 + order[i % 3] + 3 * (i // 3) * order[(i + 1) % 3] for i in range(6)}
        rescoring = Recorded(StepEngine(64, durations, answers), tiny_model, micro_batch_tokens=4096,
                             attention="blockwise")
        assert not rescoring.pads_rows
        grown = stream_trees(rescoring, [[i, 5, 6, 7] for i in range(6)], [lambda ids: ids[0] % 2 == 0] * 6,
                             group_size=3, k=2, budget=12, filter="all_leaves")
        trees.append([json.dumps(t.to_dict()) for t in grown])
        calls.append(rescoring.calls)
    assert len({tuple(c) for c in calls}) > 1  # the groups finished in other orders
    assert all(len(call) == 1 for call in calls[0]) and len({tuple(sorted(c)) for c in calls}) == 1
    assert len(set(map(tuple, trees))) == 1
    expanded = [json.loads(t) for t in trees[0]]
    assert sum(len(t["backtracking"]) for t in expanded) >= 6  # the entropies chose backtracking points
