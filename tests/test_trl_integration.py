"""bfspo.integrations.trl (issues 40, 45, 46, 48): BFSPOTrainer's update on given search trees is our
Trainer's (K = 3) and TRL's own DAPO loss (K = 0); its settings, its reward functions (one verdict,
the others added to the leaf reward), its metrics under TRL's and `bfspo train`'s names, its tree
logs, the private TRL names it calls, the layering that keeps TRL out of the core, and
examples/trl_bfspo.py end to end on one process and two."""

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
    for name in ("k", "selection", "verdict_reward", "log_trees", "epsilon_high"):  # TRL's Parameters: section
        assert f"\n        {name} (`" in BFSPOConfig.__doc__, name
    assert "\n        beta (`" not in BFSPOConfig.__doc__  # GRPOConfig's own fields are documented by TRL
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


def test_the_verdict_comes_from_one_reward_function(trl, tmp_path):
    """verdict_reward picks the correctness function; by default the only one or verifier_reward's;
    several functions and no way to pick is refused, naming the field."""
    from bfspo.integrations.trl import BFSPOConfig, BFSPOTrainer, verifier_reward
    from bfspo.integrations.trl.rewards import verdict_index
    from bfspo.integrations.trl.trainer import unsupported_settings

    assert verdict_index(["accuracy"], None) == 0
    assert verdict_index(["format_reward", "verifier_gsm8k_train"], None) == 1
    assert verdict_index(["accuracy", "format_reward"], "accuracy") == 0
    with pytest.raises(ValueError, match="BFSPOConfig.verdict_reward: with several reward functions"):
        verdict_index(["accuracy", "format_reward"], None)
    with pytest.raises(ValueError, match="verdict_reward='accurate' must name exactly one"):
        verdict_index(["accuracy", "format_reward"], "accurate")
    config = BFSPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert not unsupported_settings(config, [format_reward, verifier_reward("gsm8k_train")])
    with pytest.raises(ValueError, match="verdict_reward"):
        BFSPOTrainer(model="unused", reward_funcs=[accuracy, format_reward], args=config)


def test_reward_values_follow_trls_semantics():
    """None is "not applicable": it adds nothing to the leaf reward, and from the verdict function it
    is no verdict, so wrong; a wrong length, a scalar or strings are errors naming the function."""
    import math

    from bfspo.integrations.trl.rewards import chain_value, extra_reward, is_correct_value

    assert chain_value("f", [0.5]) == 0.5 and chain_value("f", (1,)) == 1.0
    assert math.isnan(chain_value("f", [None]))
    assert not is_correct_value(chain_value("f", [None])) and not is_correct_value(float("nan"))
    assert is_correct_value(1.0) and not is_correct_value(0.0)
    assert extra_reward([1.0, 0.2, math.nan], [1.0, 2.0, 1.0], verdict=0) == pytest.approx(0.4)
    assert extra_reward([math.nan, math.nan], [1.0, 1.0], verdict=0) == 0.0
    for bad in ([0.1, 0.2], 0.5, ["1.0"], [True], []):
        with pytest.raises(TypeError, match="reward function 'my_reward' returned .* must return a list with one float"):
            chain_value("my_reward", bad)


def test_bad_settings_are_refused_as_bfspo_train_refuses_them(trl, tmp_path):
    from bfspo.integrations.trl import BFSPOConfig
    from bfspo.integrations.trl.trainer import unsupported_settings

    for settings, message in ((dict(epsilon_high=-1), "epsilon_high .bfspo train's eps_high. must be a number >= 0"),
                              (dict(epsilon=float("nan")), "epsilon .bfspo train's eps_low. must be a number in"),
                              (dict(temperature=0.0), "temperature"), (dict(log_trees=-2), "log_trees")):
        with pytest.raises(ValueError, match=message):
            BFSPOConfig(output_dir=str(tmp_path), use_cpu=True, **settings)
    for settings, word in ((dict(use_liger_kernel=True), "use_liger_kernel"), (dict(scale_rewards="batch"), "scale_rewards"),
                           (dict(mask_truncated_completions=True), "mask_truncated_completions")):
        config = BFSPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **settings)
        assert any(word in p for p in unsupported_settings(config, [accuracy])), settings


def test_the_private_trl_names_it_calls_are_there(trl):
    """BFSPOTrainer reaches into GRPOTrainer and transformers' W&B callback: each name it calls,
    with the parameters it passes, exists in the pinned TRL 1.16 (this fails when TRL moves one)."""
    import inspect

    from transformers.integrations import WandbCallback
    from trl.trainer.utils import get_callable_name

    assert trl.__version__ == "1.16.0"
    params = inspect.signature(trl.GRPOTrainer._generate_single_turn).parameters
    assert list(params)[:5] == ["self", "prompt_ids", "images", "multimodal_fields", "num_generations"]
    assert list(inspect.signature(trl.GRPOTrainer._tokenize_prompts).parameters) == ["self", "prompts"]
    assert list(inspect.signature(trl.GRPOTrainer._prepare_inputs).parameters) == ["self", "generation_batch"]
    assert list(inspect.signature(trl.GRPOTrainer.training_step).parameters) == ["self", "model", "inputs",
                                                                                  "num_items_in_batch"]
    assert list(inspect.signature(WandbCallback.setup).parameters)[:4] == ["self", "args", "state", "model"]
    assert get_callable_name(accuracy) == "accuracy"
    source = inspect.getsource(trl.GRPOTrainer)
    for attribute in ("self._step", "self._buffered_inputs", "self._metrics", "self._logs", "self.reward_func_names",
                      "self.reward_weights", "self.generation_config", "self.generation_kwargs", "self.vllm_generation",
                      "self._is_vlm", "self.eos_token_ids", "self.num_iterations", "self.epsilon_low",
                      "self.epsilon_high", "self.log_completions", "self.use_vllm", "self.max_completion_length"):
        assert f"{attribute} = " in source, attribute
    assert '"prompt"' in source and '"advantages"' in source and '"rewards"' in source  # the _logs table's columns
    assert "self._initialized" in inspect.getsource(WandbCallback) and "self._wandb" in inspect.getsource(WandbCallback)


def test_bfspo_keys_keep_their_sections_in_wandb(trl, tmp_path):
    """HF's W&B callback prefixes every key with train/; ours keeps `bfspo train`'s sectioned keys as
    they are (no train/train/...), TRL's own get TRL's prefix, all in one W&B row."""
    from types import SimpleNamespace

    from bfspo.integrations.trl.trainer import SectionedWandbCallback

    rows = []

    class FakeWandb:
        def log(self, row, commit=True):
            rows.append((dict(row), commit))

    callback = SectionedWandbCallback()
    callback._wandb, callback._initialized = FakeWandb(), True
    state = SimpleNamespace(is_world_process_zero=True, global_step=3)
    callback.on_log(None, state, None, logs={"loss": 0.5, "reward": 0.4, "completions/mean_length": 9.0,
                                             "rollout/accuracy": 0.25, "train/clip_frac": 0.1, "tree/backtracks": 2})
    assert rows == [({"rollout/accuracy": 0.25, "train/clip_frac": 0.1, "tree/backtracks": 2}, False),
                    ({"train/loss": 0.5, "train/reward": 0.4, "train/completions/mean_length": 9.0,
                      "train/global_step": 3}, True)]


# --- a short run with two reward functions ---------------------------------------------------------


def accuracy(completions, **_):
    """The test's correctness function: an even number of characters is "right" (the tiny model
    answers nothing right), so trees hold both verdicts."""
    return [float(len(c) % 2 == 0) for c in completions]


def format_reward(completions, **_):
    """TRL's usual format reward: 0.2 for a well-formed answer (here every answer)."""
    return [0.2 for _ in completions]


def tiny_trainer(tiny_model_dir, out: Path, reward_funcs, rows=None, **settings):
    """A BFSPOTrainer on the tiny float32 model (no LoRA), G = 4, K = 1, budget 24, one question a step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bfspo.integrations.trl import BFSPOConfig, BFSPOTrainer

    torch.manual_seed(0)
    config = BFSPOConfig(**{"output_dir": str(out), "k": 1, "num_generations": 4, "max_completion_length": 24,
                            "per_device_train_batch_size": 4, "max_steps": 2, "logging_steps": 1, "save_strategy": "no",
                            "report_to": "none", "use_cpu": True, "disable_tqdm": True, "learning_rate": 1e-3,
                            "seed": 0} | settings)
    rows = rows if rows is not None else [{"prompt": f"Tom has {i} apples.", "id": str(i)} for i in range(8)]
    return BFSPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                        reward_funcs=reward_funcs, args=config, processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
                        train_dataset=Dataset.from_list(rows))


@pytest.fixture(scope="module")
def two_reward_run(trl, tiny_model_dir, tmp_path_factory):
    """[accuracy, format_reward] with verdict_reward="accuracy", TRL's defaults for bf16 (True: a
    float32 model under mixed precision on CPU) and gradient checkpointing, every tree logged,
    log_completions on: (the trainer after train(), its output folder)."""
    out = tmp_path_factory.mktemp("two_rewards")
    trainer = tiny_trainer(tiny_model_dir, out, [accuracy, format_reward], verdict_reward="accuracy", log_trees=-1,
                           log_completions=True)
    assert trainer.args.bf16 and trainer.args.gradient_checkpointing, "TRL's defaults"
    trainer.train()
    return trainer, out


def step_rows(trainer) -> list[dict]:
    return [row for row in trainer.state.log_history if "loss" in row]


@pytest.mark.slow
def test_a_format_reward_does_not_make_wrong_answers_correct(two_reward_run):
    """With [accuracy, format] the verdict is the accuracy function's: trees are kept and trained (the
    weighted sum, always positive here, made every answer correct, no tree kept and the loss 0), the
    logged accuracy is the accuracy function's, and the format reward adds 0.2 to each leaf reward."""
    from bfspo.algorithm.rewards import sequence_reward
    from bfspo.reporting.tree_stats import read_trees, tree_files

    trainer, out = two_reward_run
    rows = step_rows(trainer)
    assert [r["step"] for r in rows] == [1, 2]
    assert sum(r["rollout/groups_kept"] for r in rows) > 0 and any(r["loss"] != 0 for r in rows), rows
    leaves = []
    for tree, _ in read_trees(tree_files([out])):
        values = tree["meta"]["rewards"]
        assert values["format_reward"] == [0.2] * len(tree["leaves"])
        for leaf, value in zip(tree["leaves"], values["accuracy"]):
            assert leaf["correct"] == (value > 0 and leaf["finished"])
            expected = sequence_reward(leaf["correct"], leaf["length"], tree["budget"], True, "paper") + 0.2
            assert leaf["reward"] == pytest.approx(expected)
            leaves.append(leaf)
    assert 0 < sum(leaf["correct"] for leaf in leaves) < len(leaves)
    assert len(leaves) == sum(r["rollout/chains_generated"] for r in rows)
    for r in rows:  # TRL's metrics with TRL's meaning: every chain's value of each function, their weighted sum
        assert r["rewards/format_reward/mean"] == pytest.approx(0.2)
        assert r["reward"] == pytest.approx(r["rewards/accuracy/mean"] + 0.2)
        assert 0 <= r["rollout/accuracy_all_leaves"] <= r["rewards/accuracy/mean"]


@pytest.mark.slow
def test_metrics_carry_trls_names_and_ours_and_tree_logs_read_back(two_reward_run):
    """GRPOTrainer's own metrics are logged under its names; BFS-PO's under `bfspo train`'s sectioned
    names (bfspo.training.step_metrics); the tree files read back with `bfspo tree stats`."""
    from bfspo.reporting.tree_stats import read_trees, tree_files, tree_stats
    from bfspo.training.step_metrics import SECTIONS

    trainer, out = two_reward_run
    trl_names = {"num_tokens", "completions/mean_length", "completions/clipped_ratio", "reward", "reward_std",
                 "frac_reward_zero_std", "rewards/accuracy/mean", "entropy", "clip_ratio/low_mean",
                 "clip_ratio/high_mean", "clip_ratio/region_mean"}
    for row in step_rows(trainer):
        assert trl_names <= row.keys(), trl_names - row.keys()
        ours = {k for k in row if k.startswith(("rollout/", "tree/", "advantage/", "train/"))}
        assert ours and ours <= set(SECTIONS.values()), ours - set(SECTIONS.values())
        assert "tree/chains" not in row and row["rollout/chains_generated"] >= 4
        assert row["completions/mean_length"] == pytest.approx(row["rollout/len_mean_all_leaves"])
    assert step_rows(trainer)[1]["num_tokens"] > step_rows(trainer)[0]["num_tokens"] > 0
    assert sorted(p.name for p in (out / "trees").iterdir()) == ["step_00001.jsonl", "step_00002.jsonl"]
    assert tree_stats(read_trees(tree_files([out])))


@pytest.mark.slow
def test_log_completions_fills_trls_table_with_the_leaves(two_reward_run):
    import pandas as pd

    trainer, out = two_reward_run
    (table,) = sorted((out / "completions").glob("completions_00002.parquet"))
    df = pd.read_parquet(table)
    assert len(df) == step_rows(trainer)[1]["rollout/chains_generated"]
    assert {"prompt", "completion", "accuracy", "format_reward", "advantage"} <= set(df.columns)
    assert df["advantage"].notna().all() and (df["advantage"] != 0).any()
    assert df["prompt"].str.startswith("Tom has").all()


@pytest.mark.slow
def test_train_leaves_the_models_forward_as_it_found_it(two_reward_run):
    """The packed forward is redirected for one call at a time: after train() no function of the
    trainer is left in the model's forward (the wrappers that accelerate adds, down to the model's
    own forward); and with bf16=True on CPU a float32 model trains (the update runs in its dtype)."""
    import inspect

    trainer, _ = two_reward_run
    code = []
    f = trainer.model.forward
    while f is not None:
        f = getattr(f, "__func__", f)
        code.append(f.__code__.co_filename if hasattr(f, "__code__") else type(f).__module__)  # a callable object
        f = getattr(f, "__wrapped__", None)
    assert code[-1] == inspect.unwrap(type(trainer.model).forward).__code__.co_filename, code
    assert not [c for c in code if "bfspo" in c], code


@pytest.mark.slow
def test_none_from_another_function_is_not_applicable(trl, tiny_model_dir, tmp_path):
    """TRL's None ("not applicable") from a function other than the verdict leaves the verdict and the
    leaf reward as they are (it made every chain wrong, as NaN in the weighted sum)."""
    from bfspo.algorithm.rewards import sequence_reward
    from bfspo.reporting.tree_stats import read_trees, tree_files

    def not_applicable(completions, **_):
        return [None] * len(completions)

    trainer = tiny_trainer(tiny_model_dir, tmp_path, [accuracy, not_applicable], verdict_reward="accuracy",
                           log_trees=-1, max_steps=1, bf16=False, gradient_checkpointing=False)
    trainer.train()
    (row,) = step_rows(trainer)
    assert row["rewards/not_applicable/mean"] is None  # TRL's log: no value where every one was None
    assert row["reward"] == pytest.approx(row["rewards/accuracy/mean"])
    leaves = [(leaf, tree["budget"]) for tree, _ in read_trees(tree_files([tmp_path])) for leaf in tree["leaves"]]
    assert any(leaf["correct"] for leaf, _ in leaves)
    for leaf, budget in leaves:
        assert leaf["reward"] == pytest.approx(sequence_reward(leaf["correct"], leaf["length"], budget, True, "paper"))


def test_the_example_says_what_to_build_without_the_toy_model(trl, tmp_path):
    """`python examples/trl_bfspo.py` in a fresh clone (no results/toy/model): the commands that build
    it, not a transformers "Repo id" error."""
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "trl_bfspo.py"), "--steps", "1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "no toy model at results/toy/model; build it first" in proc.stderr
    assert "bfspo toy build --train results/toy/data/train.jsonl --out-dir results/toy/model" in proc.stderr


@pytest.mark.slow
def test_bad_reward_outputs_and_prompts_are_named_errors(trl, tiny_model_dir, tmp_path):
    """A reward function returning a scalar fails naming it; a missing prompt column and an empty
    prompt are named errors, not a KeyError or an IndexError."""
    def scalar(completions, **_):
        return 1.0

    with pytest.raises(TypeError, match="reward function 'scalar' returned 1.0"):
        tiny_trainer(tiny_model_dir, tmp_path / "a", scalar, max_steps=1).train()
    with pytest.raises(ValueError, match="no 'prompt' column .its columns: question, id"):
        tiny_trainer(tiny_model_dir, tmp_path / "b", accuracy, rows=[{"question": "q", "id": "1"}] * 4)
    with pytest.raises(ValueError, match="an empty prompt .''. in the train_dataset, row id '1'"):
        tiny_trainer(tiny_model_dir, tmp_path / "c", accuracy, rows=[{"prompt": "", "id": "1"}] * 4, max_steps=1).train()


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
    assert all(row["rollout/groups_kept"] + row["rollout/groups_filtered"] == processes
               and row["rollout/chains_generated"] >= 4 for row in steps), steps
    assert (out / "adapter_model.safetensors").exists()
    (run,) = (out / "wandb").glob("offline-run-*")
    assert list(run.glob("*.wandb"))
