"""bfspo.integrations.trl (issue 40): BFSPOTrainer's update on given search trees is our Trainer's
(K = 3) and TRL's own DAPO loss (K = 0); its settings, its reward function, the layering that keeps
TRL out of the core, and examples/trl_bfspo.py end to end on one process and two."""

from __future__ import annotations

import ast
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bfspo.algorithm.advantages import assign_advantages, assign_rewards
from bfspo.algorithm.loss import EPS_HIGH, EPS_LOW
from bfspo.algorithm.packing import n_entries
from bfspo.algorithm.search import build_trees
from tests.helpers.trees import with_old_logprobs
from tests.helpers.trl_replay import BUDGET, lora_grads, lora_model, replay_step

ROOT = Path(__file__).resolve().parents[1]


def test_nothing_below_the_integrations_imports_them_or_trl():
    """The layering: no module of bfspo outside bfspo/integrations imports TRL or the integrations."""
    offenders = []
    for path in (ROOT / "bfspo").rglob("*.py"):
        if "integrations" in path.relative_to(ROOT / "bfspo").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n == "trl" or n.startswith(("trl.", "bfspo.integrations"))]
    assert not offenders, offenders


def test_bfspo_and_its_trainer_import_without_trl():
    """`import bfspo` and `bfspo train`'s modules load where TRL cannot be imported (the core install)."""
    code = ("import sys; sys.modules['trl'] = None\n"
            "import bfspo.cli, bfspo.training.trainer, bfspo.evaluation.evaluate, bfspo.pipeline.cli\n"
            "assert 'datasets' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_verifier_reward_scores_with_the_project_verifier(trl, tmp_path):
    from bfspo.integrations.trl.rewards import question_rows, verifier_reward

    reward = verifier_reward("gsm8k_train")
    assert reward.__name__ == "verifier_gsm8k_train"
    completions = [[{"role": "assistant", "content": "3 + 4 = 7. The answer is \\boxed{7}."}],
                   [{"role": "assistant", "content": "The answer is \\boxed{8}."}], "so #### 7"]
    assert reward(completions=completions, answer=["7", "7", "7"], trainer_state=None) == [1.0, 0.0, 1.0]
    with pytest.raises(KeyError, match="no 'answer' column"):
        reward(completions=completions, solution=["7"] * 3)
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"id": 1, "question": "Tom has 3 apples and buys 4 more.", "answer": 7}) + "\n")
    (row,) = question_rows(str(path), "gsm8k_train")
    assert row["answer"] == "7" and row["prompt"][0]["role"] == "user"
    assert row["prompt"][0]["content"].endswith("\nTom has 3 apples and buys 4 more.")


def test_config_fields_come_from_train_config_and_bad_settings_are_refused(trl, tmp_path):
    from bfspo.integrations.trl import BFSPOConfig, BFSPOTrainer
    from bfspo.integrations.trl.trainer import unsupported_settings
    from bfspo.training.config import TrainConfig

    train = {f.name: f for f in TrainConfig.__dataclass_fields__.values()}
    config = BFSPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    for name in ("k", "selection", "filter", "advantage", "overlong", "overlong_window", "tree_attention"):
        assert getattr(config, name) == train[name].default
        assert BFSPOConfig.__dataclass_fields__[name].metadata["help"].startswith(train[name].metadata["help"])
    assert (config.epsilon, config.epsilon_high, config.beta, config.loss_type) == (EPS_LOW, EPS_HIGH, 0.0, "dapo")
    with pytest.raises(ValueError, match="selection must be one of"):
        BFSPOConfig(output_dir=str(tmp_path), use_cpu=True, selection="dfs")
    bad = BFSPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", beta=0.04, loss_type="grpo",
                      num_generations=4, per_device_train_batch_size=2, steps_per_generation=4,
                      gradient_accumulation_steps=3)
    problems = unsupported_settings(bad, [lambda completions, **_: [0.0] * len(completions), "some/reward-model"])
    assert [p.split()[0] for p in problems] == ["beta=0.04:", "loss_type='grpo':", "steps_per_generation",
                                                 "a", "reward"], problems
    with pytest.raises(ValueError, match="beta=0.04.*no reward function"):
        BFSPOTrainer(model="unused", reward_funcs=[], args=bad)


# --- the same trees, the same update ---------------------------------------------------------------


def search_trees(model, tokenizer, k: int, questions: list[str]):
    """Algorithm 1 on `questions` with the transformers engine, G = 3 (4 at K = 0); a chain is
    "correct" when its length is even (the tiny model answers nothing right), so trees hold both
    verdicts and expand. Rewards, branch advantages, and old log-probs set off the model's own by
    noise, so that some ratios clip."""
    from bfspo.rollout.hf_engine import TransformersEngine

    prompts = [tokenizer(q, add_special_tokens=False)["input_ids"] for q in questions]
    trees = build_trees(TransformersEngine(model, tokenizer), prompts, [lambda ids: len(ids) % 2 == 0] * len(prompts),
                        group_size=3 if k else 4, k=k, budget=BUDGET, seed=1, filter="none")
    for tree in trees:
        assign_rewards(tree)
        assign_advantages(tree, "branch")
    return with_old_logprobs(model, trees, noise=0.5)


def assert_same_update(loss_a, grads_a, loss_b, grads_b, tol=1e-6):
    assert abs(loss_a - loss_b) <= tol, (loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 0
    assert all(g.abs().max() > 0 for g in grads_a.values()), "every LoRA matrix (A and B) has a gradient"
    worst = max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a)
    assert worst <= tol, worst


@pytest.mark.slow
def test_one_step_on_given_trees_equals_our_trainers_update(trl, tiny_model_dir, tmp_path):
    """K = 3: BFSPOTrainer's optimizer step on the trees (one row, through the model's forward, TRL's
    gradient bookkeeping) has the loss and LoRA gradients of Trainer.update's mini-batch
    (bfspo.training.accumulate.minibatch_backward, here over several micro-batches) to 1e-6."""
    from transformers import AutoTokenizer

    from bfspo.training.accumulate import minibatch_backward

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ours = lora_model(tiny_model_dir)
    trees = search_trees(ours, tokenizer, k=3, questions=["Tom has 3 apples.", "A shop sells 12 pens a day."])
    assert sum(len(t.backtracking) for t in trees) >= 2, "the trees must hold expansions"
    theirs = copy.deepcopy(ours)
    ours.train()
    acc = minibatch_backward(ours, trees, micro_batch_tokens=48, normalizer=sum(n_entries(t) for t in trees),
                             eps_low=EPS_LOW, eps_high=EPS_HIGH)
    assert acc.micro_batches > 1 and 0 < acc.stats["clip_frac"] < 1
    loss, grads = replay_step(theirs, tokenizer, trees, tmp_path / "replay", k=3, filter="none")
    assert_same_update(acc.loss, lora_grads(ours), loss, grads)


@pytest.mark.slow
def test_two_processes_train_what_one_process_trains(trl, tiny_model_dir, tmp_path):
    """DDP: `accelerate launch` on 2 processes, each replaying one of the two trees, takes the step
    that one process takes on both (the loss normalised by the unique tokens of both processes, the
    gradients summed, not averaged, over them), to 1e-6."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = lora_model(tiny_model_dir)
    trees = search_trees(model, tokenizer, k=3, questions=["Tom has 3 apples.", "A shop sells 12 pens a day."])
    assert len({t.n_tokens for t in trees}) == 2, "trees of different sizes: a plain mean over processes would differ"
    (tmp_path / "trees.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trees))
    one = replay_step(lora_model(tiny_model_dir), tokenizer, trees, tmp_path / "one", k=3, filter="none")
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           str(ROOT / "tests" / "helpers" / "trl_replay.py"), str(tiny_model_dir), str(tmp_path / "trees.jsonl"),
           str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    two = torch.load(tmp_path / "step.pt", weights_only=True)
    assert two["processes"] == 2
    assert_same_update(*one, two["loss"], two["grads"])


@pytest.mark.slow
def test_at_k0_one_step_equals_trls_dapo_loss(trl, tiny_model_dir, tmp_path):
    """K = 0: on the same groups, old log-probs and advantages, BFSPOTrainer's step has the loss and
    LoRA gradients of TRL's own GRPOTrainer with loss_type "dapo" (its padded batch, its fused head)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ours = lora_model(tiny_model_dir)
    questions = ["Tom has 3 apples.", "Tom has 4 apples."]
    assert len({len(tokenizer(q)["input_ids"]) for q in questions}) == 1, "equal prompts: TRL pads none"
    trees = search_trees(ours, tokenizer, k=0, questions=questions)
    theirs = copy.deepcopy(ours)
    config = trl.GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=8, num_generations=4,
                            loss_type="dapo", beta=0.0, epsilon=EPS_LOW, epsilon_high=EPS_HIGH,
                            max_completion_length=BUDGET, use_cpu=True, report_to="none", bf16=False,
                            gradient_checkpointing=False)
    grpo = trl.GRPOTrainer(model=ours, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
                           train_dataset=Dataset.from_list([{"prompt": q} for q in questions]),
                           processing_class=tokenizer)
    chains = [(t, leaf) for t in trees for leaf in t.leaves()]
    width = max(t.segments[leaf].leaf.length for t, leaf in chains)

    def padded(values, fill):
        return torch.tensor([v + [fill] * (width - len(v)) for v in values])

    ids = [t.segments[leaf].token_ids for t, leaf in chains]
    inputs = {"prompt_ids": torch.tensor([t.prompt_ids for t, _ in chains]),
              "completion_ids": padded(ids, tokenizer.pad_token_id),
              "completion_mask": padded([[1] * len(i) for i in ids], 0),
              "advantages": torch.tensor([t.segments[leaf].advantage for t, leaf in chains]),
              "old_per_token_logps": padded([t.segments[leaf].logprobs for t, leaf in chains], 0.0)}
    inputs |= {"prompt_mask": torch.ones_like(inputs["prompt_ids"]), "num_items_in_batch": inputs["completion_mask"].sum()}
    grpo.model.eval()  # TRL's eval mode: the whole batch, no accumulation rescaling (no dropout either way)
    trl_loss = grpo._compute_loss(grpo.model, inputs)
    trl_loss.backward()
    loss, grads = replay_step(theirs, tokenizer, trees, tmp_path / "replay", k=0, filter="none")
    assert_same_update(trl_loss.item(), lora_grads(grpo.model), loss, grads)


# --- end to end -------------------------------------------------------------------------------------


def run_example(model_dir, data, out: Path, launcher: list[str]) -> dict:
    env = os.environ | {"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                        "PYTHONPATH": str(ROOT)}
    cmd = launcher + [str(ROOT / "examples" / "trl_bfspo.py"), "--model", str(model_dir), "--data", str(data),
                      "--benchmark", "gsm8k_train", "--group", "4", "--budget", "24", "--questions", "1",
                      "--steps", "3", "--output-dir", str(out)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "trainer_state.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_the_example_trains_three_steps_and_logs_wandb_offline(trl, tiny_model_dir, train_data, tmp_path, processes):
    """examples/trl_bfspo.py at tiny size: 3 optimizer steps with `python` and with `accelerate launch`
    on 2 processes (DDP over gloo), each step's tree metrics logged, the W&B run written offline."""
    launcher = [sys.executable] if processes == 1 else [
        str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    out = tmp_path / "run"
    state = run_example(tiny_model_dir, train_data, out, launcher)
    steps = [row for row in state["log_history"] if "loss" in row]
    assert [row["step"] for row in steps] == [1, 2, 3]
    assert all(row["rollout/questions"] == processes and row["tree/chains"] >= 4 for row in steps), steps
    assert (out / "adapter_model.safetensors").exists()
    (run,) = (out / "wandb").glob("offline-run-*")
    assert list(run.glob("*.wandb"))
