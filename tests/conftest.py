"""Shared fixtures. Tests never reach a model hub: every model is built here, offline."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models are dominated by per-op overhead: one thread is faster, and steadier on 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import stat
import tempfile

import pytest
import torch

# No test talks to a Slurm controller. Where Slurm's client tools are installed but no controller
# runs (this machine and CI), every `snakemake` start still waits 9 s on `scontrol show config`,
# which the Slurm executor plugin calls on import. Subprocesses of the tests find this stand-in
# first: it answers at once as scontrol does there, with an error.
_NO_SLURM = tempfile.mkdtemp(prefix="bfspo-tests-no-slurm-")
with open(os.path.join(_NO_SLURM, "scontrol"), "w") as _f:
    _f.write("#!/bin/sh\necho 'scontrol: no Slurm controller in the tests' >&2\nexit 1\n")
os.chmod(os.path.join(_NO_SLURM, "scontrol"), stat.S_IRWXU)
os.environ["PATH"] = _NO_SLURM + os.pathsep + os.environ.get("PATH", "")

torch.set_num_threads(1)

TINY_CORPUS = [
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "Tom has 3 apples. He buys 4 more apples. 3 + 4 = 7. The answer is \\boxed{7}.",
    "A shop sells 12 pens a day for 5 days. 12 * 5 = 60. So the answer is \\boxed{60}.",
    "Which of the following is a prime number? A. 4 B. 6 C. 7 D. 9. The answer is \\boxed{C}.",
    "Let x = 2/3 of 12. Then x = 8 and 12 - 8 = 4. Therefore #### 4",
] * 20


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A Qwen2-architecture model with random weights and a BPE tokenizer trained offline. It ends
    about 45% of its sampled answers within 10 tokens and 88% within 32 (tests/helpers/eos.py)."""
    from bfspo.toy.model import new_model, save_model_dir, train_tokenizer
    from tests.helpers.eos import favour_tokens

    tok = train_tokenizer(TINY_CORPUS, vocab_size=320)
    model = new_model(tok, hidden_size=32, layers=2, heads=4, kv_heads=2, seed=0)
    favour_tokens(model, {tok.eos_token_id: 1.0}, level=0.1, eos_token_id=tok.eos_token_id)
    return save_model_dir(model, tok, tmp_path_factory.mktemp("tiny_model"))


def _train_file(tmp_path_factory, rows: list[dict]):
    """`rows` as a prepared JSONL training file in a fresh folder."""
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def train_data(tmp_path_factory):
    """24 one-step word problems in the prepared JSONL format (answers 0-9), for `bfspo train`."""
    return _train_file(tmp_path_factory, [
        {"id": str(i), "question": f"Tom has {i} apples and buys 3 more. How many?", "answer": str(i % 10)}
        for i in range(24)])


@pytest.fixture(scope="module")
def answer_three_data(tmp_path_factory):
    """24 word problems whose answer is 3, the number the answering model of the vLLM tests favours: its
    groups mix right and wrong answers, so training steps keep some."""
    return _train_file(tmp_path_factory, [
        {"id": str(i), "question": f"Tom has {i} apples and gives {i - 3} away. How many are left?", "answer": "3"}
        for i in range(3, 27)])


@pytest.fixture(scope="session")
def trl():
    """TRL (the `trl` extra, which `make setup` installs), imported with vLLM hidden
    (bench.bench_peer_trl.hide_vllm: TRL 1.16 would import the CPU vLLM build, which it does not
    support, for seconds); sys.modules is restored after, so that later tests still import vLLM.
    Skipped where TRL is not installed."""
    import importlib.util
    import sys

    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed (pip install -e '.[trl]'; `make setup` installs it)")
    from bench.bench_peer_trl import hide_vllm

    before = sys.modules.get("vllm", "absent")
    hide_vllm()
    try:
        import trl
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401  (import the trainer while vLLM is hidden)

        import bfspo.integrations.trl  # noqa: F401  (and ours, which imports it)
    finally:
        if before == "absent":
            sys.modules.pop("vllm", None)
        else:
            sys.modules["vllm"] = before
    return trl
