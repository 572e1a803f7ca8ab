"""The GPU plan (bfspo/pipeline/shapes.py, memory.py, throughput.py, gpu_plan.py, cli.py): the
shipped model shapes against their model cards, each memory and time term against a hand-computed
value, the refusal of a job that cannot fit, and what the plan puts into the jobs (time limit,
warning signal, checkpoint interval, launcher), down to the sbatch line of the Slurm plugin."""

from __future__ import annotations

import copy
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bfspo.errors import BfspoError
from bfspo.pipeline import gpu_plan, jobs, memory, schedule
from bfspo.pipeline import plan as plan_module
from bfspo.pipeline.matrix import Matrix, load_config, read_configs
from bfspo.pipeline.plan import plan
from bfspo.pipeline.shapes import MODELS_DIR, Shape, load_shape
from bfspo.pipeline.throughput import (
    ASSUMPTIONS,
    chain_tokens_factor,
    decode_tokens_per_s,
    expanded_share,
    forward_s,
    generated_chain_tokens,
    generation_rounds_factor,
    signal_rate,
)

ROOT = Path(__file__).resolve().parents[1]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# h 8, I 16, 2 layers, 2 heads of 4 (q 8 wide), 1 key/value head (k and v 4 wide), vocabulary 10
TINY = Shape(name="tiny", hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, vocab=10, max_positions=64,
             tied=False, qkv_bias=True)
_PAPER = {}


def paper(edit=None) -> dict:
    if "cfg" not in _PAPER:
        _PAPER["cfg"] = load_config(ROOT / "config/paper.yaml")
    cfg = copy.deepcopy(_PAPER["cfg"])
    if edit:
        edit(cfg)
    return cfg


def paper_fixed(edit=None) -> dict:
    """paper.yaml under `sampling: fixed` (3x the questions at every step): runs long enough to need the
    attempts and time limits that the tests of those rules check (issue 47's keep rate halves them)."""
    def both(cfg):
        cfg["train"]["sampling"] = "fixed"
        if edit:
            edit(cfg)
    return paper(both)


# ---- shapes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("hub_id, params, non_embedding", [
    ("Qwen/Qwen2.5-3B-Instruct", 3.09e9, 2.77e9),  # model card: "Number of Parameters: 3.09B, Non-Embedding: 2.77B"
    ("Qwen/Qwen2.5-7B-Instruct", 7.61e9, 6.53e9),  # "7.61B, Non-Embedding: 6.53B"
    ("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, None),  # the hub page's 8.03B
])
def test_shipped_shapes_give_the_model_cards_parameter_counts(hub_id, params, non_embedding):
    s = load_shape(hub_id)
    assert memory.param_count(s) == pytest.approx(params, rel=0.002)
    if non_embedding:
        embeddings = s.vocab * s.hidden * (1 if s.tied else 2)
        assert memory.param_count(s) - embeddings == pytest.approx(non_embedding, rel=0.002)


def test_a_local_model_directory_is_read_and_an_unknown_model_named(tmp_path):
    (tmp_path / "config.json").write_text((MODELS_DIR / "Qwen/Qwen2.5-3B-Instruct/config.json").read_text())
    assert load_shape(str(tmp_path)).hidden == 2048
    with pytest.raises(BfspoError, match="no config.json in acme/model-9b"):
        load_shape("acme/model-9b")
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(BfspoError, match="model_type 'gpt2' is not planned"):
        load_shape(str(tmp_path))


# ---- memory terms, against hand-computed values ------------------------------------------------------


def test_parameter_and_lora_counts():
    # per layer: q 64, k 32, v 32, o 64, gate 128, up 128, down 128 = 576; 2 norms 16; q/k/v biases 16
    assert memory.param_count(TINY) == 2 * (576 + 16 + 16) + 8 + 10 * 8 * 2
    assert memory.matmul_params(TINY) == 2 * 576 + 10 * 8
    # r (in + out): q 2 x 16, k 2 x 12, v 2 x 12, o 2 x 16, gate/up/down 2 x 24 each
    assert memory.lora_params(TINY, 2, ALL) == 2 * (32 + 24 + 24 + 32 + 3 * 48)
    assert memory.lora_params(TINY, 2, ["q_proj", "v_proj"]) == 2 * (32 + 24)
    assert memory.lora_state(100) == 1600  # float32 weight, gradient and AdamW's two moments
    with pytest.raises(ValueError, match="qkv_proj"):
        memory.lora_params(TINY, 2, ["qkv_proj"])


def test_layer_activations_bfloat16_and_float32():
    # bfloat16: norms 2 x 4h = 64; LoRA float32 copies q, k, v 3 x 32, o 32, gate, up 2 x 32, down 4I = 64;
    # A's outputs 7 x 4r = 56; attention 2 (2h + 2kv) + 4H = 56; SwiGLU 3 x 2I = 96
    assert memory.layer_activations(TINY, 2, 2, ALL) == 64 + (96 + 32 + 64 + 64) + 56 + 56 + 96 == 528
    # float32: the copies are shared per input: 4h (q/k/v) + 4h (o) + 4h (gate/up) + 4I (down)
    assert memory.layer_activations(TINY, 4, 2, ALL) == 64 + (32 + 32 + 32 + 64) + 56 + (4 * 24 + 8) + 3 * 4 * 16 == 576
    # the docstring's closed forms
    h, kv, i, heads, r = 8, 4, 16, 2, 2
    assert memory.layer_activations(TINY, 2, r, ALL) == 36 * h + 4 * kv + 10 * i + 4 * heads + 28 * r
    assert memory.layer_activations(TINY, 4, r, ALL) == 28 * h + 8 * kv + 16 * i + 4 * heads + 28 * r
    # LoRA on q and v only: one float32 copy each (bfloat16), none for o and the MLP
    assert memory.layer_activations(TINY, 2, 2, ["q_proj", "v_proj"]) == 64 + 2 * 32 + 2 * 8 + 56 + 96


def test_activations_with_and_without_checkpointing():
    a, w, head = 528, memory.layer_backward_workspace(TINY, 2), 4 * 8 + 8 * 2
    assert w == 4 * 16 + 4 * 16 * 2 + 2 * 4 * 8
    assert memory.activations(TINY, 10, 2, 2, ALL, checkpointing=False) == 10 * (2 * a + w + head)
    assert memory.activations(TINY, 10, 2, 2, ALL, checkpointing=True) == 10 * (2 * 8 * 2 + a + w + head)


def test_logits_kv_and_vllm_terms():
    assert memory.logits_chunk(TINY, 1024, 2) == 1024 * 10 * (2 + 12)
    assert memory.logits_chunk(TINY, 1024, 4) == 1024 * 10 * 12  # float32: the upcast is the logits
    # issue 32: the head's chunk never coexists with a layer's backward (nor, checkpointed, its recompute)
    w, a = memory.layer_backward_workspace(TINY, 2), memory.layer_activations(TINY, 2, 8, ["q_proj"])
    for tokens in (1, 8, 10_000):
        assert memory.update_logits(TINY, tokens, 2, 8, ["q_proj"], False, 1024) == max(
            0, memory.logits_chunk(TINY, 1024, 2) - tokens * w)
        assert memory.update_logits(TINY, tokens, 2, 8, ["q_proj"], True, 1024) == max(
            0, memory.logits_chunk(TINY, 1024, 2) - tokens * (w + a))
    assert memory.update_logits(TINY, 10_000, 2, 8, ["q_proj"], True, 1024) == 0
    assert memory.kv_cache_per_token(TINY, 2) == 2 * 2 * 4 * 2
    q3 = load_shape("Qwen/Qwen2.5-3B-Instruct")
    assert memory.kv_cache_per_token(q3) == 36 * 1024  # 2 x 36 layers x 2 heads x 128 x 2 bytes
    # the transformers engine's decode: 3 rows of up to 100 tokens, 10 vocabulary entries
    assert memory.hf_decode(TINY, 3, 100, 2) == {"KV cache x3": 3 * 100 * 32, "sampling": 3 * 10 * (2 + 45)}
    assert memory.vllm_workspace(TINY, 4, 100, 2) == 100 * 2 * (16 + 48) + 3 * 4 * 4 * 10 + memory.GIB


def test_head_chunk_and_evaluation_defaults_are_the_codes():
    """The plan's copies of the trainer's head chunk and bfspo evaluate's vLLM defaults."""
    from bfspo.algorithm.packing import packed_logprobs

    assert inspect.signature(packed_logprobs).parameters["chunk_size"].default == gpu_plan.HEAD_CHUNK_ROWS
    import argparse

    from bfspo.evaluation import cli as eval_cli

    parser = argparse.ArgumentParser()
    eval_cli.configure_parser(parser)
    defaults = {a.dest: a.default for a in parser._actions}
    for key, value in gpu_plan.EVAL_DEFAULTS.items():
        if key in defaults:  # the evaluation keys of the vLLM engine
            assert defaults[key] == value, key


# ---- time terms ------------------------------------------------------------------------------------


def test_time_terms():
    a = ASSUMPTIONS
    assert generation_rounds_factor(0.5, 3.0, 10) == 3.0  # one round fills the batch
    assert generation_rounds_factor(0.2, 3.0, 10) == pytest.approx(3 * (1 - 0.4 ** 10) / 0.6)
    assert generation_rounds_factor(0.2, 3.0, 2) == pytest.approx(3 * 1.4)
    assert chain_tokens_factor(0) == 1 and chain_tokens_factor(3) == pytest.approx((1 + 3 * 0.5) / 4)
    n = memory.matmul_params(TINY)
    assert forward_s(TINY, 1000, 6) == pytest.approx(6 * n * 1000 / (a.train_mfu * a.hardware.flops))
    # compute-bound at large concurrency: S / (2 N S / (eta F))
    q3 = load_shape("Qwen/Qwen2.5-3B-Instruct")
    n3 = memory.matmul_params(q3)
    assert decode_tokens_per_s(q3, 512, 300) == pytest.approx(a.decode_mfu * a.hardware.flops / (2 * n3))
    # memory-bound for one sequence: the weights and its KV cache per step
    one = (n3 * 2 + 300 * memory.kv_cache_per_token(q3)) / (a.decode_bandwidth * a.hardware.bandwidth)
    assert decode_tokens_per_s(q3, 1, 300) == pytest.approx(1 / one)


# ---- the plan of the paper config ----------------------------------------------------------------------


def test_every_paper_job_is_planned_and_fits_its_80_gb_card():
    m = Matrix(paper())
    plans = gpu_plan.plan_matrix(m)
    assert len(plans.train) == 15 and len(plans.eval) == 42
    assert plans.errors() == []
    for p in plans.train.values():
        assert p.checked and p.memory.peak <= p.gpu_mem and p.vllm_kv >= p.kv_one_sequence
        assert p.save_every == 1 and p.attempts >= 1 and p.signal_s > p.step_s
        assert p.runtime_min <= m.size_class(p.run)["train_runtime"]


def test_a_job_that_cannot_fit_is_refused_naming_it_and_its_largest_term():
    cfg = paper(lambda c: c["resources"]["3b"].update(gpu_mem_gb=22))  # the update needs 23.0 GiB
    text = plan(cfg, ["config/paper.yaml"]).refusal
    assert "train qwen2.5-3b_gsm8k_dapo_s0: needs" in text and "more than the 22 GiB of its class" in text
    assert "largest term is activations@32768" in text and "lower micro_batch_tokens" in text
    assert "llama3.1-8b" not in text  # the 8b class keeps its 80 GB
    cfg = paper(lambda c: c["resources"]["3b"]["train"].update(gpu_memory_utilization=0.95))
    (first, *_) = gpu_plan.plan_matrix(Matrix(cfg)).errors()
    assert "(rescoring, vLLM awake)" in first and "largest term is vLLM (" in first
    assert "lower gpu_memory_utilization" in first


def test_the_transformers_engines_decode_is_a_phase_of_its_own():
    """The transformers engine decodes rollout_batch_size rows at once: their KV cache and one step's
    sampling tensors (the float64 inverse-CDF draw among them) are a phase beside the update, and the
    rollout's only one (its samples carry their log-probs: no rescoring forward); at 4096 rows of
    Qwen2.5-3B it is the peak, and the refusal names it."""
    run = "qwen2.5-3b_gsm8k_dapo_s0"
    hf = gpu_plan.plan_matrix(Matrix(paper(lambda c: c["train"].update(engine="transformers")))).train[run]
    assert hf.memory.phase == "update"
    wide = paper(lambda c: c["train"].update(engine="transformers", rollout_batch_size=4096))
    p = gpu_plan.plan_matrix(Matrix(wide)).train[run]
    q3 = load_shape("Qwen/Qwen2.5-3B-Instruct")
    assert p.memory.phase == "generation, transformers engine"
    assert p.peak_rollout == p.memory.peak  # the rollout is the decode: no rescoring forward
    assert p.memory.terms["sampling"] == 4096 * q3.vocab * (2 + memory.HF_SAMPLING_BYTES)
    assert p.memory.terms["KV cache x4096"] == 4096 * p.kv_one_sequence
    assert "(generation, transformers engine)" in plan(wide, ["config/paper.yaml"]).refusal


def test_a_kv_cache_too_small_for_one_sequence_is_refused():
    cfg = paper(lambda c: c["resources"]["8b"]["train"].update(gpu_memory_utilization=0.2))
    errors = gpu_plan.plan_matrix(Matrix(cfg)).errors()
    assert any(e.startswith("train llama3.1-8b_math_dapo_s0: vLLM's share") and "raise gpu_memory_utilization" in e
               for e in errors)


def test_a_time_limit_shorter_than_one_step_is_refused():
    cfg = paper(lambda c: c["resources"]["8b"].update(train_runtime=30))
    errors = gpu_plan.plan_matrix(Matrix(cfg)).errors()
    assert any("llama3.1-8b_math_dapo_s0: its time limit (30 min" in e for e in errors)


def test_models_built_by_the_workflow_and_cpu_classes_are_not_planned():
    for name in ("config.yaml", "toy-gpu.yaml"):
        m = Matrix(load_config(ROOT / "config" / name))
        plans = gpu_plan.plan_matrix(m)
        assert plans.train == {} and plans.eval == {}


# ---- what the plan puts into the jobs ------------------------------------------------------------------


def test_jobs_take_the_plans_time_limit_signal_and_checkpoint_interval():
    m = Matrix(paper())
    plans = gpu_plan.plan_matrix(m)
    run = "qwen2.5-3b_gsm8k_bfspo_s0"
    p = plans.train[run]
    r = jobs.job_resources(m, run, "train", p)
    assert r["runtime"] == p.runtime_min and r["slurm_extra"] == f"--signal=USR1@{p.signal_s}"
    assert (r["mpi"], r["tasks"], r["gpu"], r["gres"], r["tasks_per_gpu"]) == ("srun", 2, 1, None, 0)
    assert f"save_every={p.save_every}" in shlex.split(jobs.train_args(m, run, p))
    # an explicit save_every wins
    m2 = Matrix(paper(lambda c: c["train"].update(save_every=5)))
    assert "save_every=5" in shlex.split(jobs.train_args(m2, run, gpu_plan.plan_matrix(m2).train[run]))
    e = jobs.job_resources(m, "qwen2.5-3b_zero-shot", "eval", plans.eval[("qwen2.5-3b_zero-shot", "gsm8k")])
    assert e["mpi"] is None and e["slurm_extra"] is None and e["runtime"] >= gpu_plan.MIN_RUNTIME_MIN
    toy = Matrix(load_config(ROOT / "config/config.yaml"))
    t = jobs.job_resources(toy, next(iter(toy.runs)), "train")
    assert t["mpi"] is None and t["runtime"] == toy.config["resources"]["cpu"]["train_runtime"]


def test_launchers_start_one_srun_step_under_slurm_only():
    m = Matrix(paper())
    plans = gpu_plan.plan_matrix(m)
    small, big = "qwen2.5-3b_gsm8k_dapo_s0", "llama3.1-8b_math_bfspo_s0"
    srun = "${SLURM_JOB_ID:+srun --nodes 1 --ntasks 1 --ntasks-per-node 1 --cpus-per-task %d --kill-on-bad-exit=1}"
    assert jobs.train_launcher(m, small, plans.train[small]) == f"{srun % 8} bfspo"
    launcher = jobs.train_launcher(m, big, plans.train[big])
    assert launcher.startswith(f"{srun % 16} torchrun --nproc-per-node 2 --signals-to-handle "
                               "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
    assert f"--shutdown-timeout {plans.train[big].signal_s} --standalone -m bfspo.cli" in launcher
    for env, starts in (({}, "bfspo train"), ({"SLURM_JOB_ID": "7"}, "srun --nodes 1")):
        out = subprocess.run(["bash", "-c", f"echo {jobs.train_launcher(m, small)} train"], env=env,
                             capture_output=True, text=True).stdout
        assert out.startswith(starts), out


def test_a_multi_node_class_asks_for_gpus_per_node_and_one_torchrun_per_node():
    m = Matrix(paper(lambda c: c["resources"]["8b"].update(nodes=2, gpus=4)))
    run = "qwen2.5-7b_math_bfspo_s0"
    plan = gpu_plan.plan_matrix(m).train[run]
    r = jobs.job_resources(m, run, "train", plan)
    assert (r["gpu"], r["gres"], r["nodes"], r["tasks"]) == (None, "gpu:4", 2, 2)
    launcher = jobs.train_launcher(m, run, plan)
    assert launcher.startswith("${SLURM_JOB_ID:+srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --cpus-per-task 32")
    assert "torchrun --nproc-per-node 4" in launcher and "--nnodes 2 --rdzv-backend c10d" in launcher
    assert plan.gpus * plan.nodes == 8


def _sbatch_line(resources: dict, threads: int) -> str:
    """The sbatch command snakemake-executor-plugin-slurm builds for a job with these resources."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    class Res(SimpleNamespace):
        def get(self, key, default=None):
            return getattr(self, key, default)

    res = Res(**{k: v for k, v in resources.items() if v is not None})  # Snakemake drops None resources
    job = SimpleNamespace(resources=res, threads=threads)
    validate_slurm_extra(job)
    params = dict(run_uuid="u", slurm_logfile="l", comment_str="c", account="", partition="", workdir="w")
    return get_submit_command(job, params) + set_gres_string(job)


def test_the_slurm_plugin_submits_the_warning_and_no_step_of_its_own():
    m = Matrix(paper())
    plans = gpu_plan.plan_matrix(m)
    run = "llama3.1-8b_gsm8k_bfspo_s0"
    line = _sbatch_line(jobs.job_resources(m, run, "train", plans.train[run]), jobs.threads(m, run, "train"))
    assert f"--signal=USR1@{plans.train[run].signal_s}" in line and "B:" not in line
    assert "--ntasks=2" in line and "--ntasks-per-gpu" not in line and "--gpus=2" in line
    assert "--cpus-per-gpu=8" in line and "--nodes=1" in line and f"-t {plans.train[run].runtime_min}" in line
    # the plugin's job step runs the rule without an srun of its own when the job has an `mpi` resource
    from snakemake_executor_plugin_slurm_jobstep import Executor

    assert '"mpi" in job.resources.keys()' in inspect.getsource(Executor.run_job)
    m2 = Matrix(paper(lambda c: c["resources"]["8b"].update(nodes=2, gpus=4)))
    p2 = gpu_plan.plan_matrix(m2).train[run]
    line = _sbatch_line(jobs.job_resources(m2, run, "train", p2), jobs.threads(m2, run, "train"))
    assert "--nodes=2" in line and "--gres=gpu:4" in line and "--gpus=" not in line and "--ntasks=2" in line


def test_the_slurm_plugin_submits_the_slurm_keys_after_the_warning():
    """Issue 37: the config's qos, constraint, GPU type, reservation and sbatch options reach the plugin's
    sbatch line, the user's options after the trainer's warning signal, which they cannot replace."""
    cfg = paper()
    cfg["slurm"] |= {"partition": "gpu", "account": "lab", "qos": "normal", "constraint": "a100&nvlink",
                     "reservation": "paper", "extra": "--mail-type=FAIL --exclusive",
                     "sizes": {"8b": {"gpu_type": "a100"}}}
    m = Matrix(cfg)
    plans = gpu_plan.plan_matrix(m)
    run = "llama3.1-8b_gsm8k_bfspo_s0"
    line = _sbatch_line(jobs.job_resources(m, run, "train", plans.train[run]), jobs.threads(m, run, "train"))
    assert "--qos=normal" in line and "-C 'a100&nvlink'" in line and "--gres=gpu:a100:2" in line
    assert "--gpus=" not in line and "--cpus-per-gpu=8" in line
    signal = f"--signal=USR1@{plans.train[run].signal_s}"
    assert f"{signal} --reservation=paper --mail-type=FAIL --exclusive" in line
    small = "qwen2.5-3b_gsm8k_dapo_s0"
    line = _sbatch_line(jobs.job_resources(m, small, "train", plans.train[small]), jobs.threads(m, small, "train"))
    assert "--gpus=1" in line and "--gres" not in line and "-C 'a100&nvlink'" in line
    line = _sbatch_line(jobs.slurm_resources(m), 1)  # prepare, tables, ...: no GPU, no GPU node's constraint
    assert "--qos=normal" in line and "-C " not in line and "--gpus" not in line and "--exclusive" in line


def test_signal_rate_reads_the_filter_on_first_answers_or_all_leaves():
    """Issue 32: P(0 < #correct < n) for n independent answers of accuracy p; n = G under first_samples
    (and for DAPO), G (K + 1) leaves under all_leaves."""
    assert signal_rate(4, 3, "first_samples", 0.871) == pytest.approx(1 - 0.871 ** 4 - 0.129 ** 4)
    assert signal_rate(4, 3, "all_leaves", 0.871) == pytest.approx(1 - 0.871 ** 16 - 0.129 ** 16)
    assert signal_rate(16, 0, "first_samples", 0.871) == signal_rate(16, 0, "all_leaves", 0.871)
    assert signal_rate(4, 3, "first_samples", 1.0) == 0 and signal_rate(1, 0, "all_leaves", 0.3) == pytest.approx(0)
    assert signal_rate(2, 0, "first_samples", 0.5) == pytest.approx(0.5)
    with pytest.raises(BfspoError, match="unknown filter"):
        signal_rate(4, 3, "leaves", 0.5)
    with pytest.raises(BfspoError, match="probability"):
        signal_rate(4, 3, "all_leaves", 87.1)
    # only the trees that pass the first-samples filter are searched
    assert expanded_share(3, "first_samples", 0.4) == 0.4 and expanded_share(3, "all_leaves", 0.4) == 1.0
    assert expanded_share(0, "all_leaves", 0.4) == 0.0
    assert generated_chain_tokens(4, 3, 0.4) == pytest.approx(4 * (1 + 0.4 * 3 * 0.5))
    assert generated_chain_tokens(16, 0, 0.0) == 16


def test_the_plan_takes_each_runs_signal_rate_from_its_group_and_filter():
    """DAPO at G = 16 keeps most GSM8K groups; BFS-PO's G = 4 first answers keep fewer, and under
    first_samples the trees that fail are not searched, so BFS-PO generates fewer chains than under
    all_leaves, which expands every tree."""
    m = Matrix(paper())
    p = gpu_plan.plan_matrix(m).train
    p_gsm8k = ASSUMPTIONS.accuracy("gsm8k_train")
    dapo, bfspo = p["qwen2.5-3b_gsm8k_dapo_s0"], p["qwen2.5-3b_gsm8k_bfspo_s0"]
    assert dapo.signal == pytest.approx(signal_rate(16, 0, "first_samples", p_gsm8k))
    assert bfspo.signal == pytest.approx(signal_rate(4, 3, "first_samples", p_gsm8k)) and bfspo.signal < 0.5
    # 8192 chains trained; sampling: keep_rate, one round of 1 / signal times the questions: 512 / signal
    # trees of which a share `signal` is searched
    assert dapo.generated_chains == pytest.approx(8192 / dapo.signal)
    assert bfspo.generated_chains == pytest.approx(512 / bfspo.signal * 4 * (1 + bfspo.signal * 3))
    cfg = gpu_plan.train_config(m, "qwen2.5-3b_gsm8k_bfspo_s0")
    cfg.filter = "all_leaves"
    all_leaves = gpu_plan.plan_train_config(cfg, run="all", gpus=1, nodes=1, ranks=1, gpu_mem=None, cap_min=1440)
    assert all_leaves.signal == pytest.approx(signal_rate(4, 3, "all_leaves", p_gsm8k))
    assert all_leaves.generated_chains == pytest.approx(8192 / all_leaves.signal)
    # all_leaves keeps more trees, so it asks fewer questions: fewer tokens generated than first_samples,
    # which drops more of them
    assert all_leaves.generated_tokens < bfspo.generated_tokens
    # sampling: fixed (verl's rule): one round of 3x the questions (keep x oversample >= 1)
    for run, keep_rate_plan in (("qwen2.5-3b_gsm8k_dapo_s0", dapo), ("qwen2.5-3b_gsm8k_bfspo_s0", bfspo)):
        cfg = gpu_plan.train_config(m, run)
        cfg.sampling = "fixed"
        fixed = gpu_plan.plan_train_config(cfg, run="fixed", gpus=1, nodes=1, ranks=1, gpu_mem=None, cap_min=1440)
        expected = 3 * 8192 if cfg.k == 0 else 3 * 512 * 4 * (1 + bfspo.signal * 3)
        assert fixed.generated_chains == pytest.approx(expected) and fixed.step_s > keep_rate_plan.step_s
    cfg.filter = "all_leaves"  # at 3x: all_leaves expands every tree, first_samples only those that pass
    fixed_all = gpu_plan.plan_train_config(cfg, run="all", gpus=1, nodes=1, ranks=1, gpu_mem=None, cap_min=1440)
    assert fixed_all.generated_tokens > fixed.generated_tokens and fixed_all.step_s > fixed.step_s


def test_the_paper_config_trains_bfspo_on_dapos_questions_and_chains_per_optimizer_step():
    """The breakdown study's choices (config/README.md, "Batch sizes"): every run trains on DAPO's 8192
    chains per batch and 512 per optimizer step under the first-samples filter, and a K = 3 tree is
    DAPO's group of 16 chains, so BFS-PO's 32 trees per step are DAPO's 32 questions."""
    m = Matrix(paper())
    configs = {run: gpu_plan.train_config(m, run) for run in m.runs}
    assert {(c.train_batch_chains, c.mini_batch_chains, c.filter) for c in configs.values()} == {
        (8192, 512, "first_samples")}
    dapo = {c.group_size for c in configs.values() if c.k == 0}
    assert dapo == {16}
    for run, c in configs.items():
        if c.k == 3:
            assert c.chains_per_question == 16 and c.mini_batch_chains // c.chains_per_question == 32, run
        if c.k > 0:
            assert c.group_size == 4, run


def test_bfspo_plan_prints_every_job_and_refuses_what_cannot_fit(tmp_path):
    out = subprocess.run([sys.executable, "-m", "bfspo.cli", "plan", "--config", "config/paper.yaml"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert sum(line.startswith("train ") for line in lines) == 15
    assert sum(line.startswith("evaluate ") for line in lines) == 42
    assert "Every planned job fits its GPU." in out.stdout and "the paper: 192 GPU-h" in out.stdout
    # issue 37: a table, one row a job, a subtotal per paper table, the host memory and the partition
    assert lines[0].split() == ["job", "GPUs", "peak", "GiB/GPU", "(phase)", "time", "limit", "GPU-h", "host",
                                "GiB", "partition"]
    row = next(line for line in lines if line.startswith("train llama3.1-8b_math_bfspo_s0 "))
    assert re.fullmatch(r"train llama3.1-8b_math_bfspo_s0 +2 +61\.8/80\.0 \(rescoring, vLLM awake\) +\d+\.\d h "
                        r"+48\.0 h x \d +\d+\.\d +125\.0 +\(default\)", row), row
    assert max(map(len, lines)) <= 200 and "weights" not in out.stdout  # the terms only with --verbose
    subtotals = {m.group(1): float(m.group(2).replace(",", "")) for line in lines
                 if (m := re.match(r"  subtotal (\S+): ([\d,]+) GPU-h", line))}
    total = float(re.search(r"Total: ([\d,]+) GPU-hours", out.stdout).group(1).replace(",", ""))
    assert set(subtotals) == {"ablation", "gsm8k", "math"} and abs(sum(subtotals.values()) - total) <= 2
    assert lines[-1].startswith("Slurm: no partition and account set, so jobs go to the cluster's default")
    verbose = subprocess.run([sys.executable, "-m", "bfspo.cli", "plan", "--config", "config/paper.yaml", "--verbose"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert verbose.returncode == 0 and verbose.stdout.startswith("Assumptions")
    assert "train llama3.1-8b_math_bfspo_s0: 2 GPU | peak 61.8/80.0 GiB (rescoring, vLLM awake) = weights" in verbose.stdout
    named = tmp_path / "paper.yaml"
    named.write_text((ROOT / "config/paper.yaml").read_text().replace("partition: null", "partition: gpu-a100")
                     .replace("account: null", "account: lab"))
    out = subprocess.run([sys.executable, "-m", "bfspo.cli", "plan", "--config", str(named)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Slurm: no" not in out.stdout
    assert re.search(r"62\.5 +gpu-a100$", next(line for line in out.stdout.splitlines() if line.startswith("train ")))
    small = subprocess.run([sys.executable, "-m", "bfspo.cli", "plan", "--config", "config/paper.yaml",
                            "--gpu-mem-gb", "16"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert small.returncode == 1 and "Refused, as `snakemake -n` refuses it:" in small.stdout
    assert "paper.yaml: jobs that cannot run (bfspo plan prints every term):\n  train qwen2.5-3b" in small.stdout


# ---- the memory model against a measured update ------------------------------------------------------


@pytest.mark.parametrize("checkpointing", [False, True], ids=["full", "checkpointed"])
def test_the_plan_predicts_the_measured_peak_of_an_update_within_25_percent(tmp_path, checkpointing):
    """bench/bench_plan_memory.py at a small shape (Qwen2.5-3B's config.json, narrower), in a process of
    its own: one micro-batch update as the trainer runs it, its peak RSS against the plan's terms
    (bench/RESULTS.md has the same check at Qwen2.5-3B's own layer shapes)."""
    small = json.loads((MODELS_DIR / "Qwen/Qwen2.5-3B-Instruct/config.json").read_text()) | {
        "hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 2,
        "vocab_size": 16384}
    (tmp_path / "config.json").write_text(json.dumps(small))
    cmd = [sys.executable, "-m", "bench.bench_plan_memory", "--shape", str(tmp_path), "--layers", "2",
           "--tokens", "2048", "--json"] + ([] if checkpointing else ["--no-checkpointing"])
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.splitlines()[-1])
    assert r["row_tokens"] > 1500 and r["checkpointing"] == checkpointing
    assert 0.75 <= r["measured_bytes"] / r["plan_bytes"] <= 1.25, r


# ---- the terms issue 30 added: LoRA's decode cost, wave tails, preemption, start-up ------------------


def test_lora_tail_preemption_and_start_terms():
    from bfspo.pipeline.throughput import (
        decode_step_s,
        generation_rounds,
        preempted_share,
        recompute_tokens,
        start_s,
        wave_tail_s,
    )

    a = ASSUMPTIONS
    q3 = load_shape("Qwen/Qwen2.5-3B-Instruct")
    assert decode_step_s(q3, 64, 300, lora=True) == pytest.approx(decode_step_s(q3, 64, 300) * 1.35)
    assert decode_tokens_per_s(q3, 64, 300, lora=True) == pytest.approx(64 / decode_step_s(q3, 64, 300) / 1.35)
    # (budget - answer) steps at half the concurrency; none when answers fill the budget
    assert wave_tail_s(q3, 512, 312, 256, 300) == pytest.approx(200 * decode_step_s(q3, 128, 300))
    assert wave_tail_s(q3, 512, 512, 256, 300) == 0
    assert preempted_share(256, 150_000, 1000) == pytest.approx(1 - 150_000 / 256_000)
    assert preempted_share(256, 300_000, 1000) == 0
    assert recompute_tokens(1000, 0.25, 100, 400) == 1000 * 0.25 * 300
    assert start_s(a) == 180 and start_s(a, vllm=True, graphs=20) == 180 + 90 + 20 * 30
    assert generation_rounds(0.2, 3.0, 2) == pytest.approx([3.0, 1.2])


def test_the_train_plan_adds_the_tail_the_recompute_and_the_start_of_every_attempt():
    m = Matrix(paper())
    run = "llama3.1-8b_math_bfspo_s0"
    p = gpu_plan.plan_matrix(m).train[run]
    assert set(p.step_parts) == {"decode", "tail", "prefill", "recompute", "rescore", "update", "overhead"}
    assert p.step_s == pytest.approx(sum(p.step_parts.values()))
    # streamed (vLLM's default rollout): one engine loop per step, one tail when it drains
    assert p.waves == 1 and p.step_parts["tail"] > 0
    lockstep = gpu_plan.plan_matrix(Matrix(paper(lambda c: c["train"].update(rollout="lockstep")))).train[run]
    assert lockstep.waves == 4  # K + 1 = 4 waves in the one round that fills the batch, each with its tail
    assert lockstep.step_parts["tail"] == pytest.approx(4 * p.step_parts["tail"])
    assert p.preempted == 0 and p.step_parts["recompute"] == 0  # 256 sequences fit the planned KV cache
    assert p.graphs == 2 * p.update_buckets + p.rescore_buckets and p.start_s == 180 + 90 + p.graphs * 30
    assert p.gpu_hours == pytest.approx((p.train_s + p.attempts * p.start_s) * 2 / 3600)
    # twice the sequences at once: the KV cache holds about half of them, the rest are recomputed
    more = gpu_plan.plan_matrix(Matrix(paper(lambda c: c["resources"]["8b"]["train"].update(max_num_seqs=512))))
    q = more.train[run]
    assert 0.4 < q.preempted < 0.6 and q.step_parts["recompute"] > 0
    # a zero-shot evaluation decodes without LoRA, a trained run's with its adapter
    plans = gpu_plan.plan_matrix(m)
    zero, trained = plans.eval[("llama3.1-8b_zero-shot", "math500")], plans.eval[(run, "math500")]
    assert zero.decode_tok_s == pytest.approx(trained.decode_tok_s * 1.35)


def test_the_bucket_lengths_that_packed_rows_meet():
    """Issue 38, hand-worked: rows of one call, rows filled to within a unit of the budget and the
    last row's spread, a spread that wraps past a multiple of the budget, and one that spans it."""
    from bfspo.pipeline.throughput import buckets_met, row_length_ranges

    T, step = 32768, 2048
    one = row_length_ranges(1, 1400, 100, T)  # a group of 1,400 tokens alone: 1,100-1,700, one bucket
    assert one == [(1100, 1700)] and buckets_met(one, T, step) == 1
    assert buckets_met([(1900, 2300)], T, step) == 2  # 2,048 and 4,096
    # 32 trees of 3,310 tokens (105,920, spread 1,650): full rows in (29,458, 32,768] meet 30,720 and
    # 32,768; the last row spreads over 105,920 +- 4,950 mod 32,768 = 2,666 ... 12,566: 4,096 ... 14,336
    rows = row_length_ranges(32, 3310, 1650, T)
    assert rows == [(T - 3310, T), (pytest.approx(2666), pytest.approx(12566))]
    assert buckets_met(rows, T, step) == 2 + 6
    # 32,000 +- 1,500 wraps: a last row of 30,500 ... 32,768, or 1 ... 732 past the first full row
    wrapped = row_length_ranges(2, 16000, 500, T)
    assert wrapped == [(16768, T), (1, pytest.approx(732)), (30500, T)]
    assert buckets_met(wrapped, T, step) == 8 + 1  # 18,432 ... 32,768, and 2,048
    assert buckets_met(row_length_ranges(40, 3000, 6000, T), T, step) == 16  # the spread spans every length


def test_the_plan_counts_the_rescorings_rows_and_the_compiles():
    """Issue 38: the rescoring runs every group's context (an expansion's prompt and prefix) with its
    samples, packed into rows padded half a bucket each by the flex kernel; compiles are counted per
    bucket length met. Blockwise attention compiles nothing and pads nothing; the transformers engine
    has no rescoring."""
    run = "qwen2.5-3b_gsm8k_bfspo_s0"
    p = gpu_plan.plan_matrix(Matrix(paper())).train[run]
    assert p.generated_tokens < p.rescored_tokens < 1.5 * p.generated_tokens  # contexts and padding
    assert p.update_buckets >= 2 and p.rescore_buckets >= 1 and p.graphs == 2 * p.update_buckets + p.rescore_buckets
    blockwise = gpu_plan.plan_matrix(Matrix(paper(lambda c: c["train"].update(tree_attention="blockwise")))).train[run]
    assert blockwise.graphs == 0 and blockwise.start_s == 180 + 90
    assert blockwise.rescored_tokens < p.rescored_tokens and blockwise.step_parts["rescore"] < p.step_parts["rescore"]
    hf = gpu_plan.plan_matrix(Matrix(paper(lambda c: c["train"].update(engine="transformers")))).train[run]
    assert hf.rescored_tokens == 0 and hf.step_parts["rescore"] == 0 and hf.rescore_buckets == 0
    assert hf.graphs == 2 * hf.update_buckets
    # one bucket per row (attention_bucket = micro_batch_tokens): one length for each
    one = gpu_plan.plan_matrix(Matrix(paper(lambda c: c["train"].update(attention_bucket=32768)))).train[run]
    assert one.update_buckets == one.rescore_buckets == 1 and one.graphs == 3


def test_a_frozen_projection_saves_no_input_for_the_backward():
    """Why the memory plan has no term for the frozen projections' inputs (issue 30 suggested about 18%
    per layer): autograd saves a linear layer's input only for its weight's gradient, and LoRA freezes
    the base weights. What a LoRA projection saves is its float32 copy of the input and A's output
    (memory.layer_activations), besides the weights themselves."""
    import torch
    from peft import LoraConfig, get_peft_model

    class Projection(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(64, 32, bias=True)

        def forward(self, x):
            return self.q_proj(x)

    model = get_peft_model(Projection().to(torch.bfloat16), LoraConfig(r=8, target_modules=["q_proj"]))
    x = torch.randn(10, 64, dtype=torch.bfloat16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(x * 1)
    params = {p.data_ptr() for p in model.parameters()}
    activations = [(tuple(t.shape), t.dtype) for t in saved if t.data_ptr() not in params]
    assert sorted(activations, key=str) == sorted([((10, 64), torch.float32), ((10, 8), torch.float32)], key=str)


# ---- Slurm requests (issue 30) ---------------------------------------------------------------------------


def test_a_run_that_needs_more_attempts_than_the_profiles_retries_is_refused():
    assert jobs.profile_attempts() == 3  # slurm/config.yaml: retries 2
    cfg = paper_fixed(lambda c: c["resources"]["8b"].update(train_runtime=1440))
    plans = gpu_plan.plan_matrix(Matrix(cfg))
    refused = [e for e in plans.errors() if "attempts" in e]
    assert [e.split(":")[0] for e in refused] == ["train llama3.1-8b_math_dapo_s0", "train qwen2.5-7b_math_dapo_s0"]
    assert "more than the 3 that the Slurm profile's retries give" in refused[0] and "raise the class's " in refused[0]
    # the advised time limit is enough
    minutes = int(refused[0].split("train_runtime to ")[1].split()[0])
    fixed = paper_fixed(lambda c: c["resources"]["8b"].update(train_runtime=minutes))
    assert gpu_plan.plan_matrix(Matrix(fixed)).train["llama3.1-8b_math_dapo_s0"].attempts <= 3
    assert not [e for e in gpu_plan.plan_matrix(Matrix(cfg), max_attempts=None).errors() if "attempts" in e]
    assert jobs.profile_attempts(ROOT / "no-such-profile.yaml") is None


def test_threads_of_the_printed_command_are_the_jobs_not_the_dry_runs():
    """A dry run caps every job's threads at --cores (1 unless given): a GPU job's processes take the
    class's threads whatever Snakemake granted locally; a CPU job's, what it granted."""
    m = Matrix(paper())
    assert jobs.process_threads(m, "qwen2.5-3b_gsm8k_dapo_s0", "train", 1) == 8
    assert jobs.process_threads(m, "llama3.1-8b_math_dapo_s0", "train", 1) == 8  # 16 threads, 2 ranks
    assert jobs.process_threads(m, "llama3.1-8b_zero-shot", "eval", 1) == 8
    toy = Matrix(load_config(ROOT / "config/config.yaml"))
    run = next(iter(toy.runs))
    assert jobs.process_threads(toy, run, "train", 2) == max(1, 2 // jobs.ranks(toy, run))
    out = subprocess.run(["snakemake", "--profile", "slurm", "-n", "-p", "--configfile", "config/paper.yaml"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("--set threads=8 ") == 15 and "--set threads=1 " not in out.stdout
    assert out.stdout.count("--threads 8 ") == 42


def test_evaluation_asks_for_its_gpus_share_of_the_classs_host_memory():
    m = Matrix(paper())
    assert jobs.job_resources(m, "llama3.1-8b_math_dapo_s0", "train")["mem_mb"] == 128000
    assert jobs.job_resources(m, "llama3.1-8b_zero-shot", "eval")["mem_mb"] == 64000  # 1 of the 2 GPUs
    assert jobs.job_resources(m, "qwen2.5-3b_zero-shot", "eval")["mem_mb"] == 64000
    toy = Matrix(load_config(ROOT / "config/config.yaml"))
    run = next(iter(toy.runs))
    assert jobs.job_resources(toy, run, "eval")["mem_mb"] == toy.size_class(run)["mem_mb"]


@pytest.mark.parametrize("inherited", [{}, {"SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "gpu[1-2]"}],
                         ids=["as-the-plugin-runs-it", "with-the-jobs-variables"])
def test_the_launcher_asks_srun_for_its_tasks_whatever_slurm_ntasks_says(tmp_path, inherited):
    """The Slurm plugin's job step runs the rule with SLURM_NTASKS (and SLURM_JOB_NODELIST) removed;
    the launcher's srun gets its task count from its own options either way (a fake srun and squeue
    record what they were asked)."""
    from snakemake_executor_plugin_slurm_jobstep import Executor

    source = inspect.getsource(Executor.run_job)
    assert 'var.startswith("SLURM_") and var not in keep_slurm' in source and '"SLURM_NTASKS"' not in source
    for tool, reply in (("srun", 'echo "srun $* | SLURM_NTASKS=${SLURM_NTASKS:-unset}"'), ("squeue", "echo gpu[1-2]"),
                        ("scontrol", 'echo "${@: -1}" | sed "s/\\[1-2\\]/1/"')):
        (tmp_path / tool).write_text(f"#!/bin/sh\n{reply}\n" if tool != "scontrol" else f"#!/bin/bash\n{reply}\n")
        (tmp_path / tool).chmod(0o755)
    m = Matrix(paper(lambda c: c["resources"]["8b"].update(nodes=2, gpus=4)))
    run = "qwen2.5-7b_math_bfspo_s0"
    launcher = jobs.train_launcher(m, run, gpu_plan.plan_matrix(m).train[run])
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ID": "7", **inherited}
    out = subprocess.run(["bash", "-c", f"{launcher} train"], env=env, capture_output=True, text=True).stdout
    assert out.startswith("srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --cpus-per-task 32"), out
    assert "--rdzv-endpoint gpu1:29500" in out  # the first node, from squeue, not SLURM_JOB_NODELIST
    assert out.strip().endswith(f"SLURM_NTASKS={inherited.get('SLURM_NTASKS', 'unset')}")


def test_the_measured_update_follows_a_warm_up_at_its_own_shapes(tmp_path, monkeypatch):
    """bench_plan_memory times its second update of the measured model, on the same trees: the first
    (and the tiny model's before it) compiled what there was to compile, so the timed one compiles
    nothing (its warm-up used to run only at the tiny model's shapes)."""
    import argparse

    import bfspo.training.accumulate as accumulate
    from bench import bench_plan_memory

    small = json.loads((MODELS_DIR / "Qwen/Qwen2.5-3B-Instruct/config.json").read_text()) | {
        "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 1024}
    (tmp_path / "config.json").write_text(json.dumps(small))
    calls = []
    real = accumulate.minibatch_backward

    def recording(model, trees, **kwargs):
        calls.append((model.config.hidden_size, id(trees)))
        return real(model, trees, **kwargs)

    monkeypatch.setattr(accumulate, "minibatch_backward", recording)
    args = argparse.Namespace(shape=str(tmp_path), layers=1, tokens=600, prompt=40, answer=60, budget=128, group=4,
                              k=0, checkpointing=True)
    records = list(bench_plan_memory.measure(args))  # one per measurement, as made; the last has every field
    assert [r["stage"] for r in records] == ["model", "warm-up", "update", "peak memory"]
    assert [h for h, _ in calls] == [64, 128, 128] and calls[1][1] == calls[2][1]  # the tiny warm-up: CPU only
    r = records[-1]
    assert r["compiles_in_timed_update"] == 0 and r["row_tokens"] > 0
    # the peak RSS above the baseline, measured as the bench runs, in a process of its own: in the test
    # suite's long-lived process the update reuses heap pages already resident, and measures 0
    fresh = subprocess.run([sys.executable, "-m", "bench.bench_plan_memory", "--shape", str(tmp_path), "--layers", "1",
                            "--tokens", "600", "--prompt", "40", "--answer", "60", "--budget", "128", "--group", "4",
                            "--k", "0", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    measured = [json.loads(line) for line in fresh.stdout.splitlines() if line.startswith("{")]
    assert measured[-1]["stage"] == "peak memory" and measured[-1]["measured_bytes"] > 0
    # --one-row (the GPU check's update): whole trees in one micro-batch, padded to one bucket of --tokens
    calls.clear()
    buckets = []
    monkeypatch.setattr(accumulate, "minibatch_backward",
                        lambda model, trees, **kw: buckets.append(kw["bucket"]) or recording(model, trees, **kw))
    one = list(bench_plan_memory.measure(argparse.Namespace(**vars(args), one_row=True)))[-1]
    assert one["bucket"] == 600 and set(buckets) == {600} and one["trees"] == 2 and one["row_tokens"] <= 600


# ---- the one planning path: time end to end, GPUs at once, the partition's limit (issues 45, 48) ----------


def test_the_critical_path_follows_the_dags_dependencies_and_the_peak_the_profiles_concurrency():
    from bfspo.pipeline.schedule import Job, critical_path, simulate

    jobs_ = [Job("train a", 10, 4), Job("train b", 6, 2), Job("evaluate a x", 1, 1, ("train a",)),
             Job("evaluate b x", 5, 1, ("train b",)), Job("evaluate z x", 2, 1)]
    hours, chain = critical_path(jobs_)
    assert hours == 11 and [j.name for j in chain] == ["train a", "evaluate a x"]  # not b's 6 + 5
    free = simulate(jobs_, None)
    assert (free.peak_gpus, free.peak_at, free.makespan) == (7, 0, 11)  # both trainings and z at once
    # two at once: a and b first; at 6 b's evaluation (first in order of the ready ones), at 10 a's, at 11 z
    two = simulate(jobs_, 2)
    assert (two.peak_gpus, two.peak_at, two.peak_jobs) == (6, 0, ("train b", "train a")) and two.makespan == 13
    one = simulate(jobs_, 1)
    assert one.peak_gpus == 4 and one.makespan == sum(j.hours for j in jobs_)
    # the paper: the longest chain is Llama-8B's MATH DAPO run and its longest evaluation (issue 45: 101 h by
    # hand at 3x the questions; issue 47: 56 h asking at the keep rate)
    m = Matrix(paper())
    plans = gpu_plan.plan_matrix(m)
    hours, chain = critical_path(schedule.plan_jobs(plans))
    longest = max(plans.train.values(), key=lambda p: p.train_s + p.attempts * p.start_s)
    assert chain[0].name == f"train {longest.run}" == "train llama3.1-8b_math_dapo_s0" and 50 < hours < 65
    assert chain[1].name.startswith("evaluate llama3.1-8b_math_dapo_s0 ")
    # 50 jobs at once hold every training job's GPUs (23) and the zero-shot evaluations' (one each)
    zero_shot = sum(p.gpus for (run, _), p in plans.eval.items() if run not in plans.train)
    assert sum(p.gpus * p.nodes for p in plans.train.values()) == 23
    assert simulate(schedule.plan_jobs(plans), 50).peak_gpus == 23 + zero_shot
    out = subprocess.run([sys.executable, "-m", "bfspo.cli", "plan", "--config", "config/paper.yaml"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120).stdout
    assert f"Critical path: {hours:,.1f} h" in out and "  train llama3.1-8b_math_dapo_s0 " in out
    assert f"Peak GPUs at 50 jobs at once (slurm/config.yaml: jobs): {23 + zero_shot}," in out
    assert jobs.profile_jobs() == 50 and jobs.profile_jobs(ROOT / "no-such-profile.yaml") is None


@pytest.mark.parametrize("slurm, key, refused", [
    ({"max_runtime": 1440}, "slurm.max_runtime", 8),  # the 7-8B classes' 2,880 min, GSM8K and MATH
    ({"sizes": {"8b": {"max_runtime": 2000}}}, "slurm.sizes.8b.max_runtime", 8),
    ({"max_runtime": 2000, "sizes": {"8b": {"max_runtime": 2880}}}, "slurm.max_runtime", 0),  # 3b asks 1440
    ({"max_runtime": 19}, "slurm.max_runtime", 15 + 42),  # every job asks at least 20 minutes
])
def test_a_job_over_the_partitions_time_limit_is_refused_naming_its_time_and_the_limit(slurm, key, refused):
    cfg = paper_fixed(lambda c: c["slurm"].update(slurm))
    p = plan(cfg, ["config/paper.yaml"])
    over = [line.strip() for line in p.refusal.splitlines() if "over the partition's" in line]
    assert len(over) == refused
    if refused:
        limit = slurm.get("max_runtime") if key == "slurm.max_runtime" else slurm["sizes"]["8b"]["max_runtime"]
        assert p.refusal.startswith("config/paper.yaml: jobs that cannot run")
        assert f"train llama3.1-8b_math_dapo_s0: time limit 2880 min, over the partition's {limit} ({key})" in p.refusal
    else:
        assert p.problems == []
    # the advice is enough: at the limit it names, the 8b jobs fit (and need the attempts it names)
    fixed = paper_fixed(lambda c: c["slurm"].update(max_runtime=1440)
                        or c["resources"]["8b"].update(train_runtime=1440))
    after = plan(fixed, ["config/paper.yaml"])
    assert "over the partition's" not in after.refusal and "needs 5 attempts" in after.refusal
    assert "(then 5 attempts; raise retries to 5, one to spare)" in plan(
        paper_fixed(lambda c: c["slurm"].update(max_runtime=1440)), ["config/paper.yaml"]).refusal


def test_a_run_with_no_attempt_to_spare_is_warned_with_the_keys_that_give_one():
    m = Matrix(cfg := paper_fixed())
    p = plan(cfg, ["config/paper.yaml"])
    (warning,) = [w for w in p.warnings if "attempts" in w]
    named = re.findall(r"^  train (\S+): 3 attempts of 2880 min; resources.8b.train_runtime (\d+) would need 2$",
                       warning, re.M)
    assert [run for run, _ in named] == ["llama3.1-8b_math_dapo_s0", "qwen2.5-7b_math_dapo_s0"]
    assert "raise `retries` to 3 in slurm/config.yaml" in warning
    assert [r for r, tp in p.jobs.train.items() if tp.attempts == p.jobs.max_attempts] == [r for r, _ in named]
    minutes = max(int(m_) for _, m_ in named)
    spared = plan(paper_fixed(lambda c: c["resources"]["8b"].update(train_runtime=minutes)), ["config/paper.yaml"])
    assert not [w for w in spared.warnings if "attempts" in w] and spared.problems == []
    assert plan_module.spare_attempt_warning(m, gpu_plan.plan_matrix(m, max_attempts=None)) == ""
    capped = plan(paper_fixed(lambda c: c["slurm"].update(max_runtime=2880)), ["config/paper.yaml"])
    assert "over the partition's 2880 min (slurm.max_runtime)" in next(w for w in capped.warnings if "attempts" in w)


def test_config_files_merge_as_snakemake_merges_them(tmp_path):
    """`bfspo plan --config A B` reads B over A key by key, at every depth (snakemake.utils.update_config);
    the merged config goes through the schema (an unknown key of the site file is refused, naming both files)."""
    site = tmp_path / "site.yaml"
    site.write_text("slurm:\n  partition: gpu\n  sizes: {8b: {constraint: a100-80gb}}\nresources:\n  8b: {gpus: 4}\n")
    merged = read_configs([ROOT / "config/paper.yaml", site])
    alone = read_configs([ROOT / "config/paper.yaml"])
    assert merged["slurm"]["partition"] == "gpu" and merged["slurm"]["account"] is None  # the rest of slurm kept
    assert merged["slurm"]["sizes"] == {"8b": {"constraint": "a100-80gb"}}
    assert merged["resources"]["8b"] == alone["resources"]["8b"] | {"gpus": 4}  # mem_mb, train_runtime, ... kept
    assert merged["models"] == alone["models"]
    assert plan(merged, [ROOT / "config/paper.yaml", site]).problems == []
    site.write_text("slurm:\n  partiton: gpu\n")
    bad = plan(read_configs([ROOT / "config/paper.yaml", site]), [ROOT / "config/paper.yaml", site])
    assert bad.matrix is None and f"config/paper.yaml + {site}: slurm: unknown key 'partiton'" in bad.refusal
