"""`bfspo train` end to end on CPU with a tiny model: outputs, resume after a kill, bad input,
and data parallelism under torchrun (2 processes, gloo)."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bfspo.algorithm.tree import SearchTree
from tests.helpers import process

HELPERS = Path(__file__).parent / "helpers"
ENV = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def train_args(model_dir, data, out, **overrides):
    values = dict(model=model_dir, train_data=data, benchmark="gsm8k_train", k=2, group_size=4, budget=24, steps=2,
                  train_batch=16, mini_batch=8, lr=1e-2, save_every=1, max_empty_steps=50, threads=1)
    values.update(overrides)
    return [sys.executable, "-m", "bfspo.cli", "train", "--output-dir", str(out),
            "--set", *[f"{k}={v}" for k, v in values.items()]]


def run_train(*args, env=ENV, **overrides):
    return process.run(train_args(*args, **overrides), env=env, capture_output=True, text=True, timeout=300)


def test_train_writes_a_complete_run(tiny_model_dir, train_data, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    proc = run_train(tiny_model_dir, train_data, out, steps=2, log_trees=3, val_every=2, val_data=train_data,
                     val_questions=4)
    assert proc.returncode == 0, proc.stderr
    done = json.loads((out / "done.json").read_text())
    assert done["steps"] == 2 and done["method"] == "bfspo"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("train/loss", "train/grad_norm", "train/lr", "train/clip_frac", "train/approx_kl",
                "train/skipped_steps", "rollout/reward_mean", "rollout/reward_std", "rollout/accuracy",
                "rollout/len_mean", "rollout/len_std", "rollout/cutoff_frac", "rollout/tokens_unique",
                "rollout/groups_kept", "tree/depth_max", "tree/backtracks", "tree/tied_branching_nodes",
                "advantage/mean", "advantage/std", "advantage/zero_frac", "timing/rollout_s",
                "timing/old_logprobs_s", "timing/update_s", "timing/train_tok_s", "timing/peak_mem_gb",
                "rollout/len_min", "rollout/len_finished_mean", "rollout/overlong_mean", "rollout/filtered_frac",
                "advantage/min", "advantage/max", "train/questions_seen", "train/tokens_seen", "train/epoch",
                "timing/step_s"):
        assert all(key in r for r in rows), key
    assert all(r["rollout/tokens_total"] >= r["rollout/tokens_unique"] for r in rows)
    # issue 32: the transformers engine's occupancy (sequences per decode step over rollout_batch_size)
    assert all(0 < r["rollout/occupancy"] <= 1 and r["rollout/engine_steps"] > 0 for r in rows)
    # issue 26: cumulative counts, validation at step 2 only, a plain line per step and no tqdm stream
    assert rows[1]["train/questions_seen"] == rows[0]["train/questions_seen"] + rows[1]["rollout/questions_generated"]
    assert rows[1]["train/tokens_seen"] == rows[0]["train/tokens_seen"] + rows[1]["rollout/tokens_generated"]
    assert "val-core/accuracy" not in rows[0] and rows[1]["val-core/questions"] == 4
    assert re.search(r"^step 2/2 \| loss .* \| val acc [0-9.]+ len [0-9.]+ \| [0-9.]+ s$", proc.stdout, re.M), proc.stdout
    assert "\r" not in proc.stdout + proc.stderr
    # the engine's log-probs serve as the old ones: the trainer's first forward agrees to rounding
    gaps = [(r["rollout/logprob_gap_mean"], r["rollout/logprob_gap_max"]) for r in rows if "rollout/logprob_gap_max" in r]
    assert gaps and all(0 <= mean <= top < 1e-4 for mean, top in gaps)
    for r in rows:  # issue 14: the batch statistics of every step
        assert r["rollout/questions_generated"] >= r["rollout/questions_kept"] >= r["rollout/trees"]
        assert r["rollout/chains_target"] == 16 and 1 <= r["rollout/gen_rounds"] <= 10
        assert r["rollout/batch_full"] == float(r["rollout/chains"] >= 16)
        assert r["rollout/chains_generated"] >= r["rollout/chains"]  # issue 32: the filter's cost
    trees = [SearchTree.from_dict(json.loads(line)) for line in (out / "trees" / "step_00001.jsonl").read_text().splitlines()]
    assert len(trees) == 3 and all(len(t.segments[i].token_ids) > 0 for t in trees for i in t.leaves())
    assert all(t.n_tokens <= t.n_chain_tokens for t in trees)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, out / "adapter")
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b), "no optimizer step changed the adapter"
    rerun = run_train(tiny_model_dir, train_data, out, steps=2)
    assert rerun.returncode == 0 and "already finished" in rerun.stdout
    # issue 31, finding 9: done.json names the adapter within the run, so that a copy names its own
    copy = shutil.copytree(out, tmp_path / "copy")
    shutil.rmtree(out)
    assert done["adapter"] == "adapter"
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), copy / done["adapter"])


def test_dapo_is_k0_groups_of_g(tiny_model_dir, train_data, tmp_path):
    out = tmp_path / "dapo"
    proc = run_train(tiny_model_dir, train_data, out, k=0, steps=1)
    assert proc.returncode == 0, proc.stderr
    trees = [json.loads(line) for line in (out / "trees" / "step_00001.jsonl").read_text().splitlines()]
    assert all(len(t["leaves"]) == 4 and not t["backtracking"] for t in trees)
    assert json.loads((out / "done.json").read_text())["method"] == "dapo"


def test_gradient_checkpointing_trains(tiny_model_dir, train_data, tmp_path):
    """paper.yaml checkpoints: the trainer's update recomputes tree attention in the backward pass
    (micro-batches of 256 tokens, about one tree each)."""
    out = tmp_path / "ckpt"
    proc = run_train(tiny_model_dir, train_data, out, steps=1, gradient_checkpointing="true", micro_batch_tokens=256)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["train/optimizer_steps"] >= 1 and row["train/grad_norm"] > 0


def test_resume_after_kill(tiny_model_dir, train_data, tmp_path):
    """Interrupted after step 3 (checkpoint at step 2), resumed: metrics.jsonl and the W&B run (read
    back with wandb's reader, over every offline fragment of the run's id) hold each step exactly once:
    the first fragment holds steps 1-3, sent as they ended, the second the steps after 3.

    SIGINT (Ctrl-C, or Slurm's signal before the kill) lets wandb close its file. A SIGKILL cannot:
    wandb writes its offline file in 32 KiB blocks, so the killed fragment loses its unwritten tail,
    and the next attempt sends those steps (tests/test_wandb_resume.py)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from bfspo import tracking
    from bfspo.reporting.sync import offline_runs

    env = {**ENV, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    out = tmp_path / "resume"
    # Ctrl-C's default action, even where the test itself runs in the background of a
    # non-interactive shell, which starts it (and would start the trainer) with SIGINT ignored.
    metrics = out / "metrics.jsonl"
    with process.started(train_args(tiny_model_dir, train_data, out, steps=5, save_every=2), env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as proc:
        deadline = time.time() + 240
        while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)  # step 3 logged, its checkpoint not due: steps 3-5 are redone
        proc.wait(timeout=240)
    assert not (out / "done.json").exists(), "the run finished before it could be killed"
    resumed = run_train(tiny_model_dir, train_data, out, env=env, steps=5, save_every=2)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "done.json").read_text())["steps"] == 5
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]
    resumed_from = re.search(r"resuming .* from step (\d+)", resumed.stdout)
    assert resumed_from and int(resumed_from.group(1)) == 2
    fragments = [tracking.read_run(p) for p in offline_runs(out)]
    assert len(fragments) == 2 and len({f["run"]["run_id"] for f in fragments}) == 1
    logged = [h["step"] for f in fragments for h in f["history"]]
    assert logged == [1, 2, 3, 4, 5]
    assert all(k in h for f in fragments for h in f["history"] for k in ("train/loss", "rollout/accuracy", "timing/rollout_s"))
    times = [h["_timestamp"] for h in fragments[1]["history"]]  # sent as each step ended, not at the checkpoint
    assert times[1] - times[0] > 0.5 * fragments[1]["history"][1]["timing/step_s"]
    # each checkpoint's last row carries a table of sample trees
    assert [h["step"] for f in fragments for h in f["history"] if "rollout/samples._type" in h] == [2, 4, 5]
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out / "adapter")


@pytest.mark.parametrize("attention", ["blockwise", "dense", "auto"])
def test_each_tree_attention_trains(tiny_model_dir, train_data, tmp_path, attention):
    """`tree_attention`, the way out if flex fails on a cluster: one step through the trainer each."""
    out = tmp_path / attention
    proc = run_train(tiny_model_dir, train_data, out, steps=1, tree_attention=attention, micro_batch_tokens=256)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["train/optimizer_steps"] >= 1 and row["train/grad_norm"] > 0
    assert json.loads((out / "config.json").read_text())["tree_attention"] == attention


def test_flex_on_cpu_is_refused_before_the_rollout(tiny_model_dir, train_data, tmp_path):
    proc = run_train(tiny_model_dir, train_data, tmp_path / "flex", tree_attention="flex")
    assert proc.returncode == 2 and "set tree_attention: blockwise" in proc.stderr
    assert not (tmp_path / "flex" / "metrics.jsonl").exists()


@pytest.mark.parametrize("overrides, message", [
    ({"model": "/nonexistent/model"}, "no such model directory"),
    ({"train_data": "/nonexistent.jsonl"}, "no such file"),
    ({"benchmark": "nope"}, "unknown benchmark"),
    ({"budget": 4000}, "exceed the model's"),
])
def test_bad_input_fails_clearly(tiny_model_dir, train_data, tmp_path, overrides, message):
    out = tmp_path / "bad"
    proc = run_train(tiny_model_dir, train_data, out, **overrides)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not (out / "done.json").exists()


def test_empty_dataset(tiny_model_dir, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = run_train(tiny_model_dir, empty, tmp_path / "run")
    assert proc.returncode == 2 and "no training questions" in proc.stderr


def test_a_run_resumes_when_only_how_it_is_observed_changed(tiny_model_dir, train_data, tmp_path):
    """The same run planned by a second config names another W&B group: Snakemake reruns the job
    (its params changed), and the run resumes from its final checkpoint without training again."""
    out = tmp_path / "run"
    assert run_train(tiny_model_dir, train_data, out, steps=1, wandb_group="table-a").returncode == 0
    (out / "done.json").unlink()
    # ... also with another tree attention or device setting (how and where, not what, it computes)
    proc = run_train(tiny_model_dir, train_data, out, steps=1, wandb_group="table-b", save_every=5,
                     tree_attention="blockwise", attention_bucket=1024, device="cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "done.json").read_text())["steps"] == 1
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
    assert json.loads((out / "config.json").read_text())["wandb_group"] == "table-b"
    (out / "done.json").unlink()
    proc = run_train(tiny_model_dir, train_data, out, steps=1, lr=1e-3)
    assert proc.returncode == 2 and "different config (lr)" in proc.stderr


def test_resuming_with_another_config_is_refused(tiny_model_dir, train_data, tmp_path):
    out = tmp_path / "run"
    (out).mkdir()
    (out / "config.json").write_text(json.dumps({"model": "other"}))
    proc = run_train(tiny_model_dir, train_data, out)
    assert proc.returncode == 2 and "different config" in proc.stderr


@pytest.mark.parametrize("change, finished", [("data", False), ("model", True)],
                         ids=["data, done.json deleted as Snakemake does", "model, done.json kept"])
def test_a_rerun_on_changed_inputs_trains_afresh_and_sets_the_old_run_aside(tiny_model_dir, train_data, tmp_path,
                                                                            change, finished):
    """Issue 31, finding 1: the data file or the model rebuilt at the same path (Snakemake reruns the
    job after an input changed, deleting done.json) is a new run: the old one moves to previous/, and
    the rerun neither resumes its checkpoint nor publishes its adapter again."""
    from bfspo.model_io import load_tokenizer
    from bfspo.toy.model import new_model, save_model_dir
    from tests.helpers.eos import favour_tokens

    model, data = tmp_path / "model", tmp_path / "train.jsonl"
    shutil.copytree(tiny_model_dir, model)
    data.write_bytes(train_data.read_bytes())
    out = tmp_path / "run"
    assert run_train(model, data, out, steps=1).returncode == 0
    old = json.loads((out / "done.json").read_text())
    if change == "data":  # other questions, same path
        data.write_text("".join(json.dumps({"id": str(i), "question": f"Ann has {i} pens and loses 1. How many?",
                                            "answer": str(max(i - 1, 0))}) + "\n" for i in range(24)))
    else:  # the same architecture and tokenizer, other weights (conftest's model built with another seed)
        tok = load_tokenizer(str(model))
        rebuilt = new_model(tok, hidden_size=32, layers=2, heads=4, kv_heads=2, seed=1)
        favour_tokens(rebuilt, {tok.eos_token_id: 1.0}, level=0.1, eos_token_id=tok.eos_token_id)
        save_model_dir(rebuilt, tok, model)
    if not finished:
        (out / "done.json").unlink()
    proc = run_train(model, data, out, steps=1)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resuming" not in proc.stdout and "already finished" not in proc.stdout
    what = "a finished run (done.json, adapter/)" if finished else "an unfinished run"
    assert re.search(rf"its inputs changed .*{'train_data' if change == 'data' else 'model'} .*moved that run, "
                     rf"{re.escape(what)}, to {re.escape(str(out / 'previous' / '1'))}, where it stays until you "
                     "delete it", proc.stdout), proc.stdout
    new = json.loads((out / "done.json").read_text())
    assert new["adapter_sha256"] != old["adapter_sha256"], "the old adapter was published again"
    assert json.loads((out / "previous/1/inputs.json").read_text()) != json.loads((out / "inputs.json").read_text())
    assert (out / "previous/1/checkpoint").is_dir() and (out / "previous/1/config.json").is_file()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
    again = run_train(model, data, out, steps=1)
    assert again.returncode == 0 and "already finished" in again.stdout


def test_a_finished_run_refuses_another_config(tiny_model_dir, train_data, tmp_path):
    """Issue 31, finding 2: a finished directory compares the command's config as an unfinished one
    does; only the same config (observation fields aside) is "already finished"."""
    out = tmp_path / "run"
    assert run_train(tiny_model_dir, train_data, out, steps=1).returncode == 0
    done = (out / "done.json").read_text()
    for overrides, fields in (({"lr": 1e-3}, "lr"), ({"k": 1, "steps": 2}, "k, steps")):
        proc = run_train(tiny_model_dir, train_data, out, **{"steps": 1, **overrides})
        assert proc.returncode == 2 and f"different config ({fields})" in proc.stderr, proc.stderr[-2000:]
        assert "already finished" not in proc.stdout
    other = tmp_path / "other.jsonl"  # the same bytes elsewhere: the same run (issue 39, finding 9)
    other.write_bytes(train_data.read_bytes())
    proc = run_train(tiny_model_dir, other, out, steps=1)
    assert proc.returncode == 0 and "already finished" in proc.stdout
    proc = run_train(tiny_model_dir, train_data, out, steps=1, wandb_group="another-table")
    assert proc.returncode == 0 and "already finished" in proc.stdout
    assert (out / "done.json").read_text() == done


@pytest.mark.slow
def test_two_ranks_match_one_process(tiny_model_dir, train_data, tmp_path):
    """torchrun with 2 CPU processes (gloo): both ranks end with identical LoRA weights, equal to one
    process updating on the same global batch (same trees, same mini-batches)."""
    from bfspo.training.config import TrainConfig
    from bfspo.training.trainer import Trainer

    torch.set_num_threads(1)
    cfg = TrainConfig(model=str(tiny_model_dir), train_data=str(train_data), k=2, group_size=4, budget=24,
                      selection="entropy", train_batch=16, mini_batch=8, threads=1)
    _, generated, _ = Trainer(cfg, tmp_path / "rollout").rollout()
    trees = [t for t in generated if len(t.leaves()) == 12][:4]
    assert len(trees) == 4 and any(s.advantage for t in trees for s in t.segments)
    trees_file = tmp_path / "trees.jsonl"
    trees_file.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trees))
    script = [str(HELPERS / "ddp_update.py"), str(tiny_model_dir), str(train_data), str(trees_file)]
    one, two = tmp_path / "one", tmp_path / "two"
    for out, launcher in ((one, [sys.executable]),
                          (two, [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                 "--master_port", "29533"])):
        out.mkdir()
        proc = process.run(launcher + script + [str(out)], env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    single, r0, r1 = (torch.load(p) for p in (one / "rank0.pt", two / "rank0.pt", two / "rank1.pt"))
    assert single.keys() == r0.keys() == r1.keys()
    for k in single:
        assert torch.equal(r0[k], r1[k]), k
        torch.testing.assert_close(r0[k], single[k], atol=1e-6, rtol=1e-5)
    assert any(single[k].abs().sum() > 0 for k in single if "lora_B" in k)


@pytest.mark.parametrize("chains, size, plan", [
    ([[8, 8, 8, 8, 8, 8, 8, 8]], 32, [[(0, 0), (0, 1), (0, 2), (0, 3)], [(0, 4), (0, 5), (0, 6), (0, 7)]]),
    ([[32, 32]], 32, [[(0, 0)], [(0, 1)]]),
    ([[12, 12], [12, 12]], 16, [[(0, 0)], [(1, 0)], [(0, 1)], [(1, 1)]]),
    ([[12], [12]], 24, [[(0, 0), (1, 0)]]),
    ([[40], []], 32, [[(0, 0)]]),
    ([[], []], 32, []),
])
def test_minibatch_plan(chains, size, plan):
    from bfspo.training.batching import minibatch_plan

    assert minibatch_plan(chains, size) == plan


def test_minibatch_plan_keeps_the_paper_schedule_on_any_number_of_ranks():
    """App. C: 512 chains in mini-batches of 32 are 16 optimizer steps, on 1 rank or 8."""
    from bfspo.training.batching import minibatch_plan

    for tree_chains in (8, 32):  # DAPO groups (K=0, G=8) and BFS-PO trees (K=3, G=8)
        for world in (1, 2, 8):
            per_rank = [[tree_chains] * (512 // tree_chains // world) for _ in range(world)]
            plan = minibatch_plan(per_rank, 32)
            assert len(plan) == 16
            assert all(sum(per_rank[r][i] for r, i in mb) == 32 for mb in plan)


def test_interrupted_checkpoint_swap_is_recovered(tmp_path):
    """A save that died between its renames leaves checkpoint.old/ only; it is found, and the next
    save keeps it until the new one is in place."""
    from bfspo.training import checkpoint

    old = tmp_path / "checkpoint.old"
    old.mkdir()
    (old / "COMPLETE").write_text("ok\n")
    assert checkpoint.latest(tmp_path) == old

    class Model:
        def named_parameters(self):
            return iter(())

        def save_pretrained(self, path):
            path.mkdir(parents=True)

    class Opt:
        def state_dict(self):
            return {}

    checkpoint.save(tmp_path, Model(), Opt(), {"step": 2})
    assert checkpoint.latest(tmp_path) == tmp_path / "checkpoint"
    assert not old.exists() and not (tmp_path / "checkpoint.tmp").exists()
    assert torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=True)["step"] == 2


def test_torn_metrics_line_and_early_kill_do_not_break_resume(tiny_model_dir, train_data, tmp_path):
    """A kill before the first checkpoint, or in the middle of appending a metrics row, must not leave
    duplicate or unreadable rows for the resumed run."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 0.1}\n{"step": 2, "lo')
    proc = run_train(tiny_model_dir, train_data, out, steps=2, save_every=5)
    assert proc.returncode == 0, proc.stderr
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert f"{out / 'metrics.jsonl'}:2: dropped a torn last line" in proc.stdout


def test_a_torn_metrics_line_in_the_middle_is_named(tiny_model_dir, train_data, tmp_path):
    """Only the last line can be torn by a kill: a bad line before it stops the resume, named."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 0.1}\n{"step": 2, "lo\n{"step": 3, "loss": 0.1}\n')
    proc = run_train(tiny_model_dir, train_data, out, steps=2, save_every=5)
    assert proc.returncode == 2
    assert f"{out / 'metrics.jsonl'}:2: not valid JSON" in proc.stderr and "in the middle of the file" in proc.stderr
    assert not (out / "done.json").exists()


def test_a_second_trainer_on_the_same_directory_is_refused(tiny_model_dir, train_data, tmp_path):
    """One writer per run directory: the second `bfspo train` exits at once naming the first, which
    finishes unharmed with each step logged exactly once."""
    out = tmp_path / "run"
    with process.started(train_args(tiny_model_dir, train_data, out, steps=30, save_every=10), env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as first:
        deadline = time.time() + 240
        while time.time() < deadline and not (out / "config.json").exists():  # written once the lock is held
            time.sleep(0.05)
        second = run_train(tiny_model_dir, train_data, out, steps=30, save_every=10)
        assert not (out / "done.json").exists(), "the first run finished before the second started"
        assert first.wait(timeout=300) == 0, first.stderr.read()
    assert second.returncode == 2
    assert f"is in use by bfspo train (host {socket.gethostname()}, pid {first.pid}" in second.stderr
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 31))
    assert json.loads((out / "done.json").read_text())["steps"] == 30


def test_the_lock_of_a_killed_trainer_does_not_block_the_rerun(tiny_model_dir, train_data, tmp_path):
    out = tmp_path / "run"
    with process.started(train_args(tiny_model_dir, train_data, out, steps=4), env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        deadline = time.time() + 240
        while time.time() < deadline and not (out / "config.json").exists():
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (out / "done.json").exists(), "the run finished before it could be killed"
    proc = run_train(tiny_model_dir, train_data, out, steps=4)
    assert proc.returncode == 0, proc.stderr


def test_output_dir_that_is_a_file_is_refused(tiny_model_dir, train_data, tmp_path):
    out = tmp_path / "file"
    out.write_text("")
    proc = run_train(tiny_model_dir, train_data, out)
    assert proc.returncode == 2 and "exists and is not a directory" in proc.stderr


def test_a_failed_start_leaves_no_config_behind(tiny_model_dir, train_data, tmp_path):
    """A typo in the model path must not make the directory refuse the corrected command."""
    out = tmp_path / "run"
    proc = run_train("/nonexistent/model", train_data, out)
    assert proc.returncode == 2 and "no such model directory" in proc.stderr
    assert not (out / "config.json").exists()
    proc = run_train(tiny_model_dir, train_data, out, steps=1)
    assert proc.returncode == 0, proc.stderr


def test_a_run_without_optimizer_steps_is_not_marked_done(tiny_model_dir, train_data, tmp_path):
    out = tmp_path / "run"
    proc = run_train(tiny_model_dir, train_data, out, steps=2, budget=5, max_gen_rounds=1, oversample=1)
    assert proc.returncode == 2 and "no optimizer step in 2 steps" in proc.stderr
    assert not (out / "done.json").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_sigterm_or_slurms_warning_checkpoints_the_last_step_exits_and_resumes(tiny_model_dir, train_data, tmp_path,
                                                                               signum):
    """SIGTERM (the time limit, scancel) and SIGUSR1 (Slurm's warning, `--signal=USR1@<seconds>`): the
    step in flight ends, its checkpoint is written, the exit status is 143, and the same command resumes."""
    out = tmp_path / "run"
    with process.started(train_args(tiny_model_dir, train_data, out, steps=4, save_every=100), env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        deadline = time.time() + 240
        while time.time() < deadline and not (out / "metrics.jsonl").exists():
            time.sleep(0.02)
        proc.send_signal(signum)
        stdout, _ = proc.communicate(timeout=240)
    assert proc.returncode == 143
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    state = torch.load(out / "checkpoint" / "state.pt", weights_only=True)
    assert state["step"] == logged[-1] < 4
    assert f"{signal.Signals(signum).name}: stopped after step {logged[-1]}" in stdout
    assert not (out / "done.json").exists()
    resumed = run_train(tiny_model_dir, train_data, out, steps=4, save_every=100)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"from step {logged[-1]}" in resumed.stdout
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert json.loads((out / "done.json").read_text())["steps"] == 4


@pytest.mark.parametrize("line, message", [
    ('{"id": "0", "question": null, "answer": "1"}', "train.jsonl:1: missing or empty field 'question'"),
    ('{"id": "0", "question": "Q", "answer": true}', "train.jsonl:1: field 'answer' must be text or a number, got true/false"),
    ('{"id": "0", "question": "Q\xff", "answer": "1"}', "train.jsonl:1: not UTF-8 text"),
])
def test_bad_training_rows_are_refused(tiny_model_dir, tmp_path, line, message):
    from bfspo.errors import BfspoError
    from bfspo.model_io import load_tokenizer
    from bfspo.training.config import TrainConfig
    from bfspo.training.trainer import load_questions

    data = tmp_path / "train.jsonl"
    data.write_bytes(line.encode("latin-1") + b"\n")
    cfg = TrainConfig(model=str(tiny_model_dir), train_data=str(data))
    with pytest.raises(BfspoError, match=re.escape(message)):
        load_questions(cfg, load_tokenizer(str(tiny_model_dir)), None)


def test_limit_keeps_the_first_questions_and_reads_no_further(tiny_model_dir, tmp_path):
    from bfspo.model_io import load_tokenizer
    from bfspo.training.config import TrainConfig
    from bfspo.training.trainer import load_questions

    data = tmp_path / "train.jsonl"
    rows = [json.dumps({"id": str(i), "question": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(5)]
    data.write_text("\n".join(rows + ['{"id": "bad", "question": null}']) + "\n")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    cfg = TrainConfig(model=str(tiny_model_dir), train_data=str(data), limit=3)
    assert [q.id for q in load_questions(cfg, tokenizer, None)] == ["0", "1", "2"]


class _FakeAdapterModel:
    def named_parameters(self):  # no weights to check for NaN or inf
        return iter(())

    def save_pretrained(self, path):
        path.mkdir(parents=True)
        (path / "adapter_model.safetensors").write_bytes(b"weights" * 100)


class _FakeOptimizer:
    def state_dict(self):
        return {}


def test_a_checkpoint_file_changed_after_saving_is_named(tmp_path):
    from bfspo.errors import BfspoError
    from bfspo.training import checkpoint

    checkpoint.save(tmp_path, _FakeAdapterModel(), _FakeOptimizer(), {"step": 3})
    ckpt = checkpoint.latest(tmp_path)
    (ckpt / "adapter" / "adapter_model.safetensors").write_bytes(bytes(700))  # zeroed bytes
    with pytest.raises(BfspoError, match=r"adapter/adapter_model.safetensors missing or changed .* delete"):
        checkpoint.load(ckpt, None, None)


def test_a_truncated_state_pt_is_named_with_the_way_out(tmp_path):
    from bfspo.errors import BfspoError
    from bfspo.training import checkpoint

    checkpoint.save(tmp_path, _FakeAdapterModel(), _FakeOptimizer(), {"step": 1})
    ckpt = checkpoint.latest(tmp_path)
    (ckpt / "state.pt").write_bytes((ckpt / "state.pt").read_bytes()[:50])
    _rewrite_manifest(ckpt)  # a truncation the manifest cannot see
    with pytest.raises(BfspoError, match=re.escape(f"{ckpt / 'state.pt'}: unreadable") + ".*" + re.escape(f"delete {ckpt}")):
        checkpoint.load(ckpt, None, None)


def _rewrite_manifest(ckpt):
    """What whoever can write a run directory can do: make the manifest match the files."""
    from bfspo.training import checkpoint

    (ckpt / "COMPLETE").write_text(json.dumps({"sha256": checkpoint.checksums(ckpt)}))


class _RunsCode:
    """A pickled object that would create `path` when unpickled (os.system would do worse)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def test_a_state_pt_that_would_run_code_is_refused_without_running_it(tmp_path):
    """Issue 31, 4: state.pt is read with weights_only=True, even when its manifest matches."""
    from bfspo.errors import BfspoError
    from bfspo.training import checkpoint

    checkpoint.save(tmp_path, _FakeAdapterModel(), _FakeOptimizer(), {"step": 1})
    ckpt = checkpoint.latest(tmp_path)
    assert torch.load(ckpt / "state.pt", weights_only=True)["step"] == 1  # what bfspo writes loads safely
    ran = tmp_path / "PWNED"
    torch.save({"step": 1, "optimizer": {}, "payload": _RunsCode(ran)}, ckpt / "state.pt")
    _rewrite_manifest(ckpt)
    with pytest.raises(BfspoError, match=re.escape(f"{ckpt / 'state.pt'}: holds objects other than tensors and "
                                                   "plain values") + ".*" + re.escape(f"delete {ckpt}")):
        checkpoint.load(ckpt, None, None)
    assert not ran.exists()


def test_the_rng_states_survive_a_safe_load(tmp_path):
    """The RNG states go through torch.load(weights_only=True) and restore the same draws."""
    import random

    import numpy as np

    from bfspo.training import checkpoint

    torch.save({"rng": checkpoint.rng_state()}, tmp_path / "state.pt")
    draws = random.random(), np.random.normal(), torch.rand(1).item()
    checkpoint.set_rng_state(torch.load(tmp_path / "state.pt", weights_only=True)["rng"])
    assert (random.random(), np.random.normal(), torch.rand(1).item()) == draws


@pytest.mark.parametrize("marker", ['{"sha256": {"adapter/adapter_model.safet', "ok\n", "{}", '{"sha256": {}}'],
                         ids=["torn", "before-manifests", "no-checksums", "empty"])
def test_a_marker_that_is_not_a_manifest_is_a_damaged_checkpoint(tmp_path, marker):
    """Issue 31, 5: a garbled COMPLETE does not turn verification off (the adapter here is damaged too)."""
    from bfspo.errors import BfspoError
    from bfspo.training import checkpoint

    checkpoint.save(tmp_path, _FakeAdapterModel(), _FakeOptimizer(), {"step": 3})
    ckpt = checkpoint.latest(tmp_path)
    (ckpt / "adapter" / "adapter_model.safetensors").write_bytes(bytes(700))
    (ckpt / "COMPLETE").write_text(marker)
    with pytest.raises(BfspoError, match=re.escape(f"{ckpt / 'COMPLETE'}: not a checksum manifest") + ".*"
                       + re.escape(f"delete {ckpt}")):
        checkpoint.load(ckpt, None, None)


def test_a_checkpoint_folder_without_its_marker_is_not_skipped_silently(tmp_path):
    from bfspo.errors import BfspoError
    from bfspo.training import checkpoint

    (tmp_path / "checkpoint").mkdir()
    with pytest.raises(BfspoError, match="without its COMPLETE marker"):
        checkpoint.latest(tmp_path)


def test_a_failed_checkpoint_write_reports_the_disk_space(tmp_path, monkeypatch):
    from bfspo.errors import BfspoError
    from bfspo.training import checkpoint

    checkpoint.save(tmp_path, _FakeAdapterModel(), _FakeOptimizer(), {"step": 1})

    def full_disk(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 128 vs 0")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(BfspoError, match="writing the checkpoint failed .*unexpected pos.* MiB of disk space left"):
        checkpoint.save(tmp_path, _FakeAdapterModel(), _FakeOptimizer(), {"step": 2})
    assert not (tmp_path / "checkpoint.tmp").exists()
    assert torch.load(checkpoint.latest(tmp_path) / "state.pt", weights_only=True)["step"] == 1


def test_a_resumed_run_samples_at_the_keep_rate_an_uninterrupted_one_would(tiny_model_dir, train_data, tmp_path):
    """Issue 47, `sampling: keep_rate`: the first step asks oversample times the need, the next at
    1 / the keep rate seen, bounded by 1x and oversample; the estimate goes into the checkpoint, so a
    resumed run asks as an uninterrupted one; `sampling: fixed` asks oversample at every step. The
    tiny model keeps a few percent of its groups: an oversample of 60 leaves 1 / keep within bounds."""
    import dataclasses
    import math

    from bfspo.training import batching
    from bfspo.training.config import TrainConfig
    from bfspo.training.trainer import Trainer

    cfg = TrainConfig(model=str(tiny_model_dir), train_data=str(train_data), benchmark="gsm8k_train", k=0,
                      group_size=4, budget=8, train_batch=16, mini_batch=8, oversample=60.0, threads=1, steps=2,
                      max_empty_steps=50)
    run = Trainer(cfg, tmp_path / "run")
    rows = []
    for _ in range(2):
        run.step += 1
        rows.append(run.rollout()[2])
    assert rows[0]["ask_rate"] == 60.0 and math.isnan(rows[0]["keep_rate_est"])
    assert rows[0]["questions_asked"] >= math.ceil(60.0 * 16 / 4)  # the prefix's, then those given back
    assert rows[0]["questions_asked"] == rows[0]["questions_generated"] + rows[0]["questions_aborted"]
    assert rows[0]["keep_rate"] == rows[0]["chains_kept"] / (4 * rows[0]["questions_generated"])
    assert rows[1]["keep_rate_est"] == rows[0]["keep_rate"]
    keep = rows[0]["keep_rate"]
    assert 1 / 60 < keep < 1 and rows[1]["ask_rate"] == pytest.approx(1 / keep) and rows[1]["ask_rate"] < 60
    run.save_checkpoint()
    resumed = Trainer(cfg, tmp_path / "run")
    resumed.restore()
    assert resumed.step == 2 and resumed.keep_rate == run.keep_rate and run.keep_rate.asked > 0
    fixed = Trainer(dataclasses.replace(cfg, sampling="fixed"), tmp_path / "fixed")
    fixed.keep_rate = run.keep_rate
    fixed.step = 1
    assert fixed.rollout()[2]["ask_rate"] == 60.0
    assert (batching.ask_rate("keep_rate", resumed.keep_rate, 60.0)
            == batching.ask_rate("keep_rate", run.keep_rate, 60.0) == pytest.approx(1 / run.keep_rate.value))


def same_to_rounding(a, b, tol: float = 1e-4) -> bool:
    """Two JSON values equal but for floats within `tol` (log-probs and entropies of batched logits)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tol
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_to_rounding(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same_to_rounding(x, y, tol) for x, y in zip(a, b))
    return a == b


def test_a_lockstep_run_trains_the_same_trees_under_both_sampling_rules(tmp_path_factory, answer_three_data):
    """Issue 47 on the transformers engine: three lockstep steps at one seed under `sampling: fixed`
    (oversample 8 at every step) and `sampling: keep_rate` (8 at step 1, then 1 / the keep rate seen):
    the same trees at every step (question ids, tokens, rewards, advantages; log-probs and entropies to
    the rounding of the engine's batched logits), since each sample is seeded by its tree's place in the
    step's draw order and each step gives back the questions drawn after its batch's prefix."""
    from bfspo.training.config import TrainConfig
    from bfspo.training.trainer import Trainer
    from tests.test_vllm_engine import build_model_dir

    model_dir = build_model_dir(tmp_path_factory.mktemp("answering_model"), answering=True)[0]
    runs, rows = {}, {}
    for rule in ("fixed", "keep_rate"):
        cfg = TrainConfig(model=str(model_dir), train_data=str(answer_three_data), benchmark="gsm8k_train",
                          engine="transformers", k=1, group_size=4, filter="first_samples", budget=24, train_batch=16,
                          mini_batch=8, oversample=8.0, sampling=rule, lr=1e-2, threads=1, seed=3, steps=3,
                          save_every=3, log_trees=-1, wandb_mode="disabled")
        trainer = Trainer(cfg, tmp_path_factory.mktemp(rule))
        trainer.fit()
        runs[rule] = trainer.run_dir
        rows[rule] = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    for step in (1, 2, 3):
        trees = [[json.loads(line) for line in (run / "trees" / f"step_{step:05d}.jsonl").read_text().splitlines()]
                 for run in runs.values()]
        for tree in trees[0] + trees[1]:
            tree["meta"].pop("round")  # the round that drew a tree is the rule's; the tree is not
        assert trees[0] and same_to_rounding(trees[0], trees[1]), f"step {step}: the trees differ"
    assert all(r["rollout/batch_full"] == 1 for rule in rows for r in rows[rule])
    assert [r["rollout/ask_rate"] for r in rows["fixed"]] == [8.0] * 3
    assert rows["keep_rate"][1]["rollout/ask_rate"] < 8.0
    assert [r["train/questions_seen"] for r in rows["fixed"]] == [r["train/questions_seen"] for r in rows["keep_rate"]]
    assert sum(r["rollout/questions_asked"] for r in rows["keep_rate"][1:]) < \
        sum(r["rollout/questions_asked"] for r in rows["fixed"][1:])
