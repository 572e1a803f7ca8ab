"""StreamedSearch's rescoring in shared rows (issue 38): finished groups wait until they would hold
back PENDING_SHARE of the engine's sequences, or until the engine runs under half its capacity,
and are then rescored in one call, in tree order; the trees waiting still count as growing. A fake
engine finishes each tree's requests after a set number of steps (the real engine's loop is
tests/test_vllm_engine.py's)."""

import math

from bfspo.rollout.base import Completion, Occupancy
from bfspo.rollout.streamed import PENDING_SHARE, StreamedSearch


class StepEngine:
    """The request-level engine's interface: a request of tree i finishes `durations[i]` steps after
    it was added (its answer: 3 tokens, each tree's own)."""

    def __init__(self, capacity: int, durations: dict[int, int]):
        self.occupancy = Occupancy(capacity)
        self.durations, self.in_flight, self.now, self.ids = durations, 0, 0, 0
        self.queued: dict[str, tuple[int, int]] = {}  # request id -> (finishing step, tree)

    def new_request_id(self) -> str:
        self.ids += 1
        return f"r{self.ids}"

    def sample_seed(self, seed, place):
        return None

    def add(self, rid, context, max_new, *, temperature, top_p, seed):
        tree = context[0]  # each prompt is [tree index, ...]
        self.queued[rid] = (self.now + self.durations[tree], tree)
        self.in_flight += 1

    def step(self):
        self.now += 1
        done = [rid for rid, (at, _) in self.queued.items() if at <= self.now]
        out = []
        for rid in done:
            tree = self.queued.pop(rid)[1]
            out.append((rid, Completion([tree + 10, tree + 11, 2], [-1.0] * 3, [math.nan] * 3, True)))
        self.in_flight -= len(out)
        return out

    def abort(self, rids):
        for rid in rids:
            self.queued.pop(rid, None)
        self.in_flight -= len(rids)
        return 0  # tokens of the aborted requests: this engine generates a request's all at its end


class Rescoring:
    """RescoredEngine's interface: records which contexts each call rescored together, and gives
    every token an entropy."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

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
