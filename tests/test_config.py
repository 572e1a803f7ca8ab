"""TrainConfig: defaults from the paper, YAML + key=value overrides, and clear errors."""

import re

import pytest

from bfspo.errors import BfspoError
from bfspo.training.config import TrainConfig, load_train_config, parse_overrides


def test_paper_defaults():
    cfg = TrainConfig(model="m", train_data="d")
    assert (cfg.k, cfg.group_size, cfg.lora_r, cfg.lora_alpha, cfg.lr, cfg.weight_decay) == (3, 8, 8, 16, 1e-6, 0.01)
    assert (cfg.eps_low, cfg.eps_high, cfg.train_batch, cfg.mini_batch) == (0.2, 0.28, 512, 32)
    assert (cfg.batch_unit, cfg.train_batch_chains, cfg.mini_batch_chains) == ("chains", 512, 32)
    assert (cfg.oversample, cfg.sampling, cfg.max_gen_rounds, cfg.overlong_window) == (3.0, "keep_rate", 10, "paper")
    assert cfg.method == "bfspo"


@pytest.mark.parametrize("k", [0, 3])
def test_prompt_batches_count_g_chains_per_prompt(k):
    # DAPO's recipe: 512 prompts of G = 16 answers in mini-batches of 32 prompts; BFS-PO fills the
    # same 8192 chains with trees of G (K + 1) chains each (Sec. 4.2)
    cfg = TrainConfig(model="m", train_data="d", k=k, group_size=16, batch_unit="prompts")
    assert (cfg.train_batch_chains, cfg.mini_batch_chains) == (512 * 16, 32 * 16)
    assert cfg.train_batch_chains // cfg.mini_batch_chains == 16


@pytest.mark.parametrize("unit, batch, world, chains", [
    ("chains", 64, 2, 32),
    ("prompts", 2, 2, 4),      # one prompt of G = 4 per rank
])
def test_each_rank_gets_whole_units_of_the_batch(unit, batch, world, chains):
    cfg = TrainConfig(model="m", train_data="d", group_size=4, batch_unit=unit, train_batch=batch, mini_batch=1)
    assert cfg.rank_chains(world) == chains


def test_half_a_prompt_per_rank_is_refused():
    # 1 prompt over 2 ranks: 2 chains each, yet a rank trains a whole group of 4, doubling the batch
    cfg = TrainConfig(model="m", train_data="d", group_size=4, batch_unit="prompts", train_batch=1, mini_batch=1)
    assert cfg.train_batch_chains % 2 == 0
    with pytest.raises(BfspoError, match=r"train_batch \(1 prompts\) must be a multiple of the number of ranks \(2\)"):
        cfg.rank_chains(2)


@pytest.mark.parametrize("overrides, method", [
    ({"k": 0}, "dapo"),
    ({"selection": "entropy"}, "no_bfs"),
    ({"advantage": "global"}, "global"),
    ({"overlong": False}, "no_overlong"),
])
def test_method_names(overrides, method):
    assert TrainConfig(model="m", train_data="d", **overrides).method == method


def test_overrides_are_yaml_scalars(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model: m\ntrain_data: d\nk: 1\n")
    cfg = load_train_config(str(f), ["k=2", "lr=1e-3", "overlong=false", "lora_target_modules=[q_proj, v_proj]"])
    assert (cfg.k, cfg.lr, cfg.overlong, cfg.lora_target_modules) == (2, 1e-3, False, ["q_proj", "v_proj"])
    assert parse_overrides(["wandb_group=null"]) == {"wandb_group": None}


@pytest.mark.parametrize("overrides, message", [
    (["model=m", "train_data=d", "zzz=3"], "unknown key 'zzz' (every key, with its default and meaning"),
    (["model=m", "train_data=d", "stesp=3"], "unknown key 'stesp'; did you mean 'steps'?"),
    (["model=m"], "missing required key(s) train_data"),
    (["model=m", "train_data=d", "selection=greedy"], "selection must be one of"),
    (["model=m", "train_data=d", "advantage=local"], "advantage must be one of"),
    (["model=m", "train_data=d", "k=-1"], "k must be an integer >= 0"),
    (["model=m", "train_data=d", "budget=0"], "budget must be a positive integer"),
    (["model=m", "train_data=d", "train_batch=48", "mini_batch=32"], "must be a multiple"),
    (["model=m", "train_data=d", "lr=fast"], "lr must be a number"),
    (["model=m", "train_data=d", "batch_unit=tokens"], "batch_unit must be one of"),
    (["model=m", "train_data=d", "overlong_window=verl"], "overlong_window must be one of"),
    (["model=m", "train_data=d", "filter=leaves"], "filter must be one of ('all_leaves', 'first_samples', 'none')"),
    (["model=m", "train_data=d", "oversample=0.5"], "oversample must be a number >= 1"),
    (["model=m", "train_data=d", "oversample=many"], "oversample must be a number"),
    (["model=m", "train_data=d", "max_gen_rounds=0"], "max_gen_rounds must be a positive integer"),
    (["model=m", "train_data=d", "overlong=maybe"], "overlong must be true or false"),
    (["model"], "not of the form key=value"),
    (["model=m", "train_data=d", "k=true"], "k must be an integer >= 0, got True"),
    (["model=m", "train_data=d", "eps_low=-5"], "eps_low must be a number in [0, 1)"),
    (["model=m", "train_data=d", "lora_alpha=0"], "lora_alpha must be a positive integer"),
    (["model=m", "train_data=d", "max_grad_norm=-1"], "max_grad_norm must be a number >= 0"),
    (["model=m", "train_data=d", "lr=-1"], "lr must be a number > 0"),
    (["model=m", "train_data=d", "weight_decay=-1"], "weight_decay must be a number >= 0"),
    (["model=m", "train_data=d", "threads=-1"], "threads must be an integer >= 0"),
    (["model=m", "train_data=d", "seed=abc"], "seed must be an integer >= 0, got 'abc'"),
    (["model=null", "train_data=d"], "model must be a non-empty string, got None"),
    (["model=m", "train_data=d", "lora_target_modules=[]"], "lora_target_modules must be a non-empty list"),
    (["model=m", "train_data=d", "k=[1"], "k=[1': the value: not valid YAML"),
    (["model=m", "train_data=d", "per_request_seeds=1"], "per_request_seeds must be true, false or null, got 1"),
    (["model=m", "train_data=d", "max_num_seqs=0"], "max_num_seqs must be a positive integer"),
    (["model=m", "train_data=d", "collective_timeout_min=0"], "collective_timeout_min must be a positive integer"),
    (["model=m", "train_data=d", "tree_attention=tree"],
     "tree_attention must be one of ('auto', 'flex', 'blockwise', 'dense')"),
    (["model=m", "train_data=d", "device=gpu"], "device must be one of ('auto', 'cuda', 'cpu')"),
    (["model=m", "train_data=d", "attention_bucket=0"], "attention_bucket must be a positive integer"),
    (["model=m", "train_data=d", "rollout=waves"], "rollout must be one of ('auto', 'lockstep', 'streamed')"),
    (["model=m", "train_data=d", "sampling=verl"], "sampling must be one of ('fixed', 'keep_rate')"),
    (["model=m", "train_data=d", "rollout=streamed"], "rollout: streamed needs engine: vllm"),
])
def test_bad_config_names_the_problem(overrides, message):
    with pytest.raises(BfspoError, match=re.escape(message)):
        load_train_config(None, overrides)


def test_missing_config_file():
    with pytest.raises(BfspoError, match="no such config file"):
        load_train_config("/nonexistent.yaml", [])


def test_a_yaml_syntax_error_in_the_config_file_is_named(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model: m\ntrain_data: [d\n")
    with pytest.raises(BfspoError, match="c.yaml: not valid YAML"):
        load_train_config(str(f), [])


@pytest.mark.parametrize("value, modules", [("q_proj", ["q_proj"]), ("q_proj,v_proj", ["q_proj", "v_proj"])])
def test_one_lora_target_module_is_a_module_not_its_letters(value, modules):
    assert load_train_config(None, ["model=m", "train_data=d", f"lora_target_modules={value}"]).lora_target_modules == modules
