"""Supervised training of the toy model: exact prompt format, loss masking, a loadable model dir."""

import json
import os
import random
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bfspo.cli import main
from bfspo.errors import BfspoError
from bfspo.io import write_jsonl
from bfspo.tasks.prompts import prompt_ids, render_prompt
from bfspo.toy.model import new_model, save_model_dir, train_tokenizer
from bfspo.toy.sft import IGNORE, SIZES, batches, check_reload, collate, encode, lr_at, tokenizer_corpus
from bfspo.toy.task import make_splits


@pytest.fixture(scope="module")
def rows():
    return make_splits(seed=0, n_train=200, n_rl=1, n_eval=1)["train"]


@pytest.fixture(scope="module")
def tokenizer(rows):
    return train_tokenizer(tokenizer_corpus(rows), 400)


def test_digits_are_single_tokens(tokenizer):
    tokens = tokenizer.tokenize("So 123 + 45 = 168.")
    assert [t for t in tokens if any(c.isdigit() for c in t)] == ["1", "2", "3", "4", "5", "1", "6", "8"]
    assert tokenizer.decode(tokenizer("So 123 + 45 = 168.")["input_ids"]) == "So 123 + 45 = 168."


def test_a_saved_tokenizer_reloads_with_the_same_encoding_and_a_different_one_is_caught(tmp_path, tokenizer, rows):
    save_model_dir(new_model(tokenizer, hidden_size=32), tokenizer, tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert type(reloaded).__name__ == "Qwen2Tokenizer"  # what every consumer of the model dir gets
    check_reload(tmp_path, [encode(tokenizer, r) for r in rows[:20]], rows[:20])
    other = train_tokenizer(tokenizer_corpus(rows), 300)
    with pytest.raises(BfspoError, match="differently once reloaded"):
        check_reload(tmp_path, [encode(other, r) for r in rows[:20]], rows[:20])


def test_encode_is_the_rl_prompt_then_the_solution_and_eos(tokenizer, rows):
    row = rows[0]
    ids, n_prompt = encode(tokenizer, row)
    assert ids[:n_prompt] == prompt_ids(tokenizer, "toy", row["question"])
    assert ids[-1] == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(ids[n_prompt:-1]) == row["solution"]
    full = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Please reason step by step, and put your final answer within \\boxed{{}}.\n{row['question']}"},
         {"role": "assistant", "content": row["solution"]}], tokenize=False)
    assert full.startswith(tokenizer.decode(ids))


def test_collate_pads_right_and_masks_prompt_and_padding():
    input_ids, mask, labels = collate([([5, 6, 7, 8], 2), ([9, 10, 11], 1)], pad_id=0)
    assert input_ids.tolist() == [[5, 6, 7, 8], [9, 10, 11, 0]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert labels.tolist() == [[IGNORE, IGNORE, 7, 8], [IGNORE, 10, 11, IGNORE]]


def test_batches_cover_every_example_once_per_epoch_with_similar_lengths():
    lengths = [random.Random(i).randint(10, 300) for i in range(100)]
    stream = batches(lengths, 10, random.Random(0))
    epoch = [next(stream) for _ in range(10)]
    assert sorted(i for b in epoch for i in b) == list(range(100))
    assert epoch != [next(stream) for _ in range(10)]  # reshuffled
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in epoch) / 10
    assert spread < 100  # random batches of 10 would spread about 240


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    cfg = SIZES["default"]
    assert lr_at(0, cfg) == pytest.approx(cfg.lr / cfg.warmup)
    assert lr_at(cfg.warmup, cfg) == pytest.approx(cfg.lr)
    assert lr_at(cfg.steps, cfg) == pytest.approx(cfg.lr / 10)


def test_build_reduces_loss_and_saves_a_loadable_chat_model(tmp_path, rows):
    train = tmp_path / "train.jsonl"
    write_jsonl(train, rows)
    out = tmp_path / "model"
    assert main(["toy", "build", "--train", str(train), "--out-dir", str(out), "--size", "test",
                 "--threads", "1"]) == 0
    summary = json.loads((out / "sft.json").read_text())
    assert summary["config"]["steps"] == SIZES["test"].steps and summary["config"]["hidden_size"] == SIZES["test"].hidden_size
    assert summary["loss_last"] < 0.6 * summary["loss_first"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model.")]  # no temporary left

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.padding_side == "left"
    prompt = render_prompt(tok, "toy", rows[0]["question"])
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert prompt.endswith("<|im_start|>assistant\n")
    enc = tok([prompt], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out_ids = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert out_ids.shape[1] > enc["input_ids"].shape[1]


def test_build_rejects_rows_without_a_solution(tmp_path, capsys):
    train = tmp_path / "train.jsonl"
    write_jsonl(train, [{"id": "a", "question": "Q?", "answer": "1"}])
    assert main(["toy", "build", "--train", str(train), "--out-dir", str(tmp_path / "m")]) == 2
    assert "train.jsonl:1" in capsys.readouterr().err and not (tmp_path / "m").exists()


def test_build_rejects_an_unknown_size(tmp_path, rows, capsys):
    train = tmp_path / "train.jsonl"
    write_jsonl(train, rows[:2])
    assert main(["toy", "build", "--train", str(train), "--out-dir", str(tmp_path / "m"), "--size", "huge"]) == 2
    assert "huge" in capsys.readouterr().err


def test_build_is_bit_reproducible_whatever_the_thread_environment_and_the_load(tmp_path, rows):
    """Issue 24: the model's bytes depend on the SFT's thread count, so the SFT fixes its own (1). A
    build in a process told to use 2 threads (as Snakemake's OMP_NUM_THREADS is, for a 2-thread job),
    run while a second build loads the cores, gives the bytes of an explicit 1-thread build. Both run
    on the CPU numerics of the environment (--native-numerics): this process loaded torch without
    the pinned ones."""
    train = tmp_path / "train.jsonl"
    write_jsonl(train, rows)
    args = ["toy", "build", "--train", str(train), "--size", "test", "--steps", "12", "--native-numerics"]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    other = subprocess.Popen([sys.executable, "-m", "bfspo.cli", *args, "--out-dir", str(tmp_path / "a")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert main(args + ["--out-dir", str(tmp_path / "b"), "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out, _ = other.communicate(timeout=600)
    assert other.returncode == 0, out[-2000:]
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    losses = [json.loads((tmp_path / d / "sft.json").read_text())["losses"] for d in "ab"]
    assert losses[0] == losses[1]


def test_build_pins_its_cpu_numerics_over_the_environments_and_records_them(tmp_path, rows):
    """Issue 36: `bfspo toy build` sets bfspo/toy/numerics.py's settings before torch loads, over what
    the environment says (here torch's AVX-512 kernels and MKL's Intel-only AVX2 branch), so both
    builds give the same bytes; sft.json records the settings and torch's capability. With
    --native-numerics the environment's settings stay, and sft.json says so."""
    from bfspo.toy.numerics import PINNED, describe

    train = tmp_path / "train.jsonl"
    write_jsonl(train, rows)
    args = [sys.executable, "-m", "bfspo.cli", "toy", "build", "--train", str(train), "--size", "test", "--steps", "6"]
    ambient = {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    plain = {k: v for k, v in os.environ.items() if k not in PINNED}
    for name, env, extra in (("a", plain, []), ("b", plain | ambient, []), ("c", plain | ambient, ["--native-numerics"])):
        out = subprocess.run(args + ["--out-dir", str(tmp_path / name)] + extra, env=env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert (tmp_path / "a/model.safetensors").read_bytes() == (tmp_path / "b/model.safetensors").read_bytes()
    summaries = {name: json.loads((tmp_path / name / "sft.json").read_text()) for name in "abc"}
    assert summaries["a"]["cpu_numerics"] == summaries["b"]["cpu_numerics"] == describe(PINNED)
    assert summaries["c"]["cpu_numerics"] == describe(ambient)
    if "avx2" in open("/proc/cpuinfo").read():
        assert summaries["a"]["cpu_capability"] == summaries["b"]["cpu_capability"] == "AVX2"
