"""Non-finite values never reach the weights or a checkpoint.

An optimizer step can turn finite weights into NaN or inf (a learning rate or a weight decay too
large for the weights' precision, an overflowing second moment), even when the loss and the gradient
were finite. `step_if_finite` undoes such a step: the weights and the optimizer state are exactly
those from before it, and the trainer counts it as a skipped step (`max_nonfinite`). Left in, one
poisoned step would be checkpointed and every resume would load it; `checkpoint.save` refuses the
tensors that `nonfinite_tensors` names, as a last line of defence.
"""

from __future__ import annotations

import copy

import torch

from bfspo.training import dist


def all_finite(tensors) -> bool:
    """Whether every element of every tensor is finite (one device synchronisation)."""
    flags = [torch.isfinite(t).all() for t in tensors]
    return bool(torch.stack(flags).all()) if flags else True


def step_if_finite(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> bool:
    """`optimizer.step()`, kept only if every weight of `params` is still finite after it (on every
    rank: one rank's non-finite weights undo the step everywhere, so the ranks stay identical);
    otherwise the weights and the optimizer state are restored. Returns whether the step was kept.

    The copy costs three times the trainable weights' memory for a moment (the weights, Adam's two
    moments), small for LoRA adapters."""
    weights = [p.detach().clone() for p in params]
    state = copy.deepcopy(optimizer.state_dict())
    optimizer.step()
    if dist.sum_scalar(0.0 if all_finite(params) else 1.0) == 0:
        return True
    with torch.no_grad():
        for p, saved in zip(params, weights):
            p.copy_(saved)
    optimizer.load_state_dict(state)
    return False


def nonfinite_tensors(model, optimizer) -> list[str]:
    """Names of the trainable weights of `model`, and of the optimizer's state tensors, that hold NaN or inf."""
    names = [name for name, p in model.named_parameters() if p.requires_grad and not all_finite([p])]
    for index, state in optimizer.state_dict().get("state", {}).items():
        names += [f"optimizer {key} of parameter {index}" for key, value in state.items()
                  if torch.is_tensor(value) and value.is_floating_point() and not all_finite([value])]
    return names
