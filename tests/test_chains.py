"""Chains per batch and per optimizer step of every arm (bfspo/pipeline/chains.py, issue 36): what
whole trees reach of each target, the arms named when they miss it by more than 5%, and `bfspo
plan`'s warning. tests/test_workflow.py checks that `snakemake -n` prints it."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bfspo.pipeline import chains, gpu_plan
from bfspo.pipeline.matrix import Matrix, load_config

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("config.yaml", "test.yaml", "paper.yaml", "toy-seeds.yaml", "toy-study.yaml", "toy-study-hard.yaml",
           "toy-breakdown.yaml", "toy-breakdown-hard.yaml", "toy-gpu.yaml")
_CONFIGS = {}


def config(name: str, **train) -> dict:
    if name not in _CONFIGS:
        _CONFIGS[name] = load_config(ROOT / "config" / name)
    cfg = copy.deepcopy(_CONFIGS[name])
    cfg["train"].update(train)
    if train:  # every arm at these settings: the methods' own `train` (config.yaml's G = 4 trees) goes
        for spec in cfg["methods"].values():
            spec.pop("train", None)
    return cfg


@pytest.mark.parametrize("target, tree, reached", [
    (64, 24, 48),    # the toy before issue 36: K = 2 at G = 8, 2 trees
    (512, 12, 504),  # paper.yaml's mini-batch at K = 2, G = 4: 42 trees
    (48, 16, 48),    # the toy now: K = 3 at G = 4
    (8, 12, 12),     # a tree larger than the target is taken alone
])
def test_whole_trees_reach_the_largest_multiple_of_their_size(target, tree, reached):
    assert chains.reach(target, tree) == reached


@pytest.mark.parametrize("name", SHIPPED)
def test_every_arm_of_every_shipped_config_trains_its_target_chains_per_step(name):
    assert chains.shortfalls(Matrix(config(name))) == []


def test_the_paper_configs_k2_reaches_504_of_512_chains_per_optimizer_step_which_passes():
    m = Matrix(config("paper.yaml"))
    run = "qwen2.5-3b_gsm8k_bfspo-k2_s0"
    assert chains.reached(gpu_plan.train_config(m, run), 1) == [("batch", 8192, 8184), ("optimizer step", 512, 504)]


def test_an_arm_whose_trees_miss_its_batch_or_step_is_named_with_its_tree_and_reach():
    """The toy before issue 36: G = 8, 64 chains in mini-batches of 32; K = 2's trees of 24 chains
    fill 48 and 24; K = 0, 1, 3 (8, 16, 32 chains) fill theirs."""
    short = chains.shortfalls(Matrix(config("config.yaml", group_size=8, train_batch=64, mini_batch=32)))
    assert [(s.arm, s.what, s.target, s.reached) for s in short] == [
        ("toy_toy_bfspo-k2", "batch", 64, 48), ("toy_toy_bfspo-k2", "optimizer step", 32, 24)]
    assert str(short[0]) == ("toy-ablation: arm toy_toy_bfspo-k2 (K = 2, G = 8): whole trees of 24 chains give 48 "
                             "chains per batch, against a target of 64 (75%)")
    assert "within 5%" in chains.warning(short) and chains.warning([]) == ""


def test_each_rank_fills_its_own_share_with_whole_trees():
    """2 ranks split 48 chains into shares of 24, which DAPO's 16-chain groups and K = 3's 16-chain
    trees fill to 16 each."""
    cfg = config("config.yaml")
    cfg["resources"]["cpu"]["ranks"] = 2
    short = chains.shortfalls(Matrix(cfg))
    assert {(s.arm, s.what, s.target, s.reached) for s in short} == {
        (f"toy_toy_{m}", "batch", 48, 32) for m in ("dapo", "bfspo", "no-bfs", "global-adv", "no-overlong")}


def test_an_arm_is_named_once_whatever_its_seeds():
    cfg = config("config.yaml", group_size=8, train_batch=64, mini_batch=32)
    cfg["seeds"] = [0, 1, 2]
    assert len(chains.shortfalls(Matrix(cfg))) == 2


def test_bfspo_plan_prints_the_warning_and_still_exits_0(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config("config.yaml", group_size=8, train_batch=64, mini_batch=32)))
    out = subprocess.run([sys.executable, "-m", "bfspo.cli", "plan", "--config", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "toy-ablation: arm toy_toy_bfspo-k2 (K = 2, G = 8): whole trees of 24 chains give 24 chains per optimizer " \
           "step, against a target of 32 (75%)" in out.stdout
    shipped = subprocess.run([sys.executable, "-m", "bfspo.cli", "plan", "--config", "config/config.yaml"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert shipped.returncode == 0 and "whole trees" not in shipped.stdout
