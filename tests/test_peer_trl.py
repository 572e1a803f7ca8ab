"""The peer benchmark's premise (bench/bench_peer_trl.py): on identical inputs, TRL 1.16's GRPOTrainer
with loss_type "dapo" computes the same loss as the project's policy_loss (Eq. 2: token-mean of the
clipped surrogate, no KL), to the bit. Needs the `trl` extra, which `make setup` installs (the `trl`
fixture skips where TRL is not installed)."""

import torch


def test_trl_dapo_loss_equals_policy_loss(trl, tiny_model_dir, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bfspo.algorithm.loss import EPS_HIGH, EPS_LOW, policy_loss

    assert trl.__version__ == "1.16.0"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                            loss_type="dapo", beta=0.0, epsilon=EPS_LOW, epsilon_high=EPS_HIGH, temperature=1.0,
                            max_completion_length=8, use_cpu=True, report_to="none", use_vllm=False)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                              args=config, train_dataset=Dataset.from_list([{"prompt": "Tom has 3 apples."}] * 4),
                              processing_class=tokenizer)
    vocab = model.config.vocab_size
    prompt_ids, completion_ids = torch.randint(5, vocab, (4, 6)), torch.randint(5, vocab, (4, 8))
    completion_mask = torch.ones(4, 8, dtype=torch.long)
    completion_mask[1, 5:] = 0  # answers of different lengths: the token-mean's N counts real tokens only
    completion_mask[3, 2:] = 0
    advantages = torch.tensor([1.5, -0.5, 0.0, -1.0])
    trainer.model.eval()  # TRL's eval mode: the whole batch, no accumulation rescaling
    logps, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, torch.cat([prompt_ids, completion_ids], 1),
        torch.cat([torch.ones_like(prompt_ids), completion_mask], 1), 8)[:2]
    old = logps.detach() + 0.4 * torch.randn_like(logps)  # ratios on both sides of the clip range
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
              "completion_mask": completion_mask, "advantages": advantages, "old_per_token_logps": old,
              "num_items_in_batch": completion_mask.sum()}
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    ours, stats = policy_loss(logps, old, advantages[:, None].expand_as(logps), completion_mask)
    assert 0 < stats["clip_frac"] < 1, "the inputs must exercise both clipped and unclipped tokens"
    assert torch.equal(trl_loss, ours), (trl_loss.item(), ours.item())
