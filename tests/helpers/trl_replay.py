"""One optimizer step of a BFSPOTrainer that replays given search trees instead of growing them
(tests/test_trl_integration.py), in-process or as a script under `accelerate launch`:

    accelerate launch --multi_gpu --num_processes 2 tests/helpers/trl_replay.py MODEL_DIR TREES_JSONL OUT_DIR

Each process replays its share of the trees (process r takes trees r, r + processes, ...), so two
processes train what one process trains on all of them; process 0 writes OUT_DIR/step.pt: the loss
TRL logs and the LoRA gradients before the optimizer step (after DDP's reduction).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

BUDGET = 16


def lora_model(model_dir):
    """The tiny model (float32, sdpa) with LoRA on every projection, its B matrices random (seeded),
    so that the A matrices get gradients too; the same on every call."""
    from peft import LoraConfig, get_peft_model

    from bfspo.training.config import LORA_TARGETS
    from tests.helpers.trees import load_float32_model

    torch.manual_seed(0)
    model = get_peft_model(load_float32_model(model_dir), LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS,
                                                                     task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def lora_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def replay_step(model, tokenizer, trees: list, out_dir: Path, processes: int = 1, **settings) -> tuple[float, dict]:
    """One optimizer step of a BFSPOTrainer whose generation batch is `trees` (this process's share
    of them when `processes` > 1): (the loss TRL logs, the LoRA gradients before the optimizer step,
    unclipped)."""
    from accelerate import PartialState
    from datasets import Dataset
    from transformers import TrainerCallback

    from bfspo.integrations.trl import BFSPOConfig, BFSPOTrainer

    state = PartialState()
    mine = trees[state.process_index::processes]

    class Replay(BFSPOTrainer):
        def grow_trees(self, rows):
            return copy.deepcopy(mine)

    grads = {}

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kw):
            grads.update(lora_grads(trainer.model))

    group = len(trees[0].root_children)
    config = BFSPOConfig(output_dir=str(out_dir), num_generations=group, max_completion_length=BUDGET,
                         per_device_train_batch_size=group * len(trees) // processes, max_steps=1, max_grad_norm=0.0,
                         learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                         bf16=False, gradient_checkpointing=False, disable_tqdm=True, **settings)
    trainer = Replay(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
                     processing_class=tokenizer, callbacks=[Capture()],
                     train_dataset=Dataset.from_list([{"prompt": f"question {i}"} for i in range(8)]))
    trainer.train()
    return trainer.state.log_history[0]["loss"], grads


def main(model_dir: str, trees_file: str, out_dir: str) -> None:
    from accelerate import PartialState
    from transformers import AutoTokenizer

    from bfspo.algorithm.tree import SearchTree

    sys.modules["vllm"] = None  # TRL 1.16 would import the CPU vLLM build, which it does not support
    torch.set_num_threads(1)
    state = PartialState()
    trees = [SearchTree.from_dict(json.loads(line)) for line in Path(trees_file).read_text().splitlines()]
    loss, grads = replay_step(lora_model(model_dir), AutoTokenizer.from_pretrained(model_dir), trees,
                              Path(out_dir) / "replay", processes=state.num_processes, k=3, filter="none")
    if state.is_main_process:
        torch.save({"loss": loss, "grads": grads, "processes": state.num_processes}, Path(out_dir) / "step.pt")


if __name__ == "__main__":
    main(*sys.argv[1:4])
