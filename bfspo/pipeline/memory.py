"""GPU memory of training and evaluation, one pure function per term (bytes).

Notation (a `Shape`): L layers, h hidden size, I intermediate size, H attention heads, kv the
width of the key (and value) projection (kv_heads x head_dim), V vocabulary, b bytes per element
of the model's dtype (2 for bfloat16 on GPU, 4 for float32 on CPU), r the LoRA rank, T the tokens of
one micro-batch (`micro_batch_tokens`), C the rows of one output-head chunk.

What the training side holds, as the trainer builds it (bfspo/training/trainer.py,
bfspo/algorithm/packing.py) with transformers' Qwen2/Llama layers and peft's LoRA:

- the frozen base weights, in the model's dtype;
- the LoRA adapters in float32 (peft's `autocast_adapter_dtype` upcasts adapters of a bfloat16
  model), their gradients, and AdamW's two moments: 16 bytes per LoRA parameter;
- the activations that autograd keeps for the backward pass (`layer_activations`): with gradient
  checkpointing only each layer's input, plus one layer's activations while it is recomputed;
- one chunk of the output head: the log-softmax runs over C rows at a time (`logits_chunk`);
- vLLM, resident (its share `gpu_memory_utilization` of the card) or asleep during the update
  (sleep level 1: its weights are offloaded to host memory and its KV cache is freed).
"""

from __future__ import annotations

from bfspo.pipeline.shapes import Shape

GIB = 2**30
LORA_DTYPE_BYTES = 4  # peft keeps the adapters of a bfloat16 model in float32
ADAM_BYTES_PER_PARAM = 4 + 4 + 4 + 4  # float32 weight, gradient, exp_avg, exp_avg_sq


def matmul_params(s: Shape) -> int:
    """Parameters that take part in a matrix product per token (the 2N of a forward pass):
    L x (sum over the projections of in x out) + V x h (the output head, tied or not)."""
    per_layer = sum(i * o for i, o in s.projections().values())
    return s.layers * per_layer + s.vocab * s.hidden


def param_count(s: Shape) -> int:
    """All parameters: the projections and their biases (Qwen2's q/k/v), two RMSNorm weights per
    layer, the final norm, the embedding, and the output head unless it is tied:

        N = L (sum_p in_p out_p + [h + 2 kv if q/k/v biases] + 2h) + h + V h (2 if untied)
    """
    per_layer = sum(i * o for i, o in s.projections().values()) + 2 * s.hidden
    if s.qkv_bias:
        per_layer += s.hidden + 2 * s.kv_dim
    return s.layers * per_layer + s.hidden + s.vocab * s.hidden * (1 if s.tied else 2)


def weights(s: Shape, b: int) -> int:
    """The base weights: N x b."""
    return param_count(s) * b


def lora_params(s: Shape, r: int, targets) -> int:
    """LoRA parameters: A (r x in) and B (out x r) on every target projection of every layer:
    L x sum_{t in targets} r (in_t + out_t)."""
    proj = s.projections()
    unknown = set(targets) - set(proj)
    if unknown:
        raise ValueError(f"unknown LoRA target(s) {sorted(unknown)}; known: {sorted(proj)}")
    return s.layers * sum(r * (proj[t][0] + proj[t][1]) for t in targets)


def lora_state(n_lora: int) -> int:
    """The adapters, their gradients and AdamW's two moments, all float32: 16 bytes per parameter."""
    return ADAM_BYTES_PER_PARAM * n_lora


def layer_activations(s: Shape, b: int, r: int, targets) -> int:
    """Bytes per token that autograd keeps for the backward pass of one decoder layer (no
    checkpointing), with LoRA on `targets`:

    - each RMSNorm keeps its input in float32 (it computes in float32): 2 x 4h;
    - each LoRA projection keeps its input in float32 for dA. Projections that share an input (q, k,
      v; gate, up) share one copy when the model is float32 (the cast is a no-op), and each keeps
      its own cast copy when it is not: per input group of width w with n targets, 4w (b = 4) or
      4wn (b = 2). The groups: q/k/v read h, o reads h, gate/up read h, down reads I;
    - each LoRA projection keeps A's output for dB: 4r;
    - attention keeps q and k after RoPE, v and its output in the model's dtype, and the
      log-sum-exp of each query and head in float32: b (2h + 2kv) + 4H (grouped-query attention
      with unrepeated keys and values, and nothing of size T x T);
    - SwiGLU keeps the gate projection (SiLU's input), SiLU's output and the up projection: 3Ib.

    In bfloat16 with LoRA on all seven projections this is 36h + 4kv + 10I + 4H + 28r; in float32,
    28h + 8kv + 16I + 4H + 28r.
    """
    groups = {("q_proj", "k_proj", "v_proj"): s.hidden, ("o_proj",): s.hidden,
              ("gate_proj", "up_proj"): s.hidden, ("down_proj",): s.intermediate}
    lora_inputs = 0
    for members, width in groups.items():
        n = sum(t in targets for t in members)
        if n:
            lora_inputs += LORA_DTYPE_BYTES * width * (1 if b == LORA_DTYPE_BYTES else n)
    norms = 2 * 4 * s.hidden
    attention = b * (2 * s.hidden + 2 * s.kv_dim) + 4 * s.heads
    mlp = 3 * s.intermediate * b
    return norms + lora_inputs + LORA_DTYPE_BYTES * r * len(targets) + attention + mlp


def layer_backward_workspace(s: Shape, b: int) -> int:
    """Bytes per token of the gradients alive while one layer runs its backward pass: the
    gradient of the MLP's intermediate activations (the product, SiLU's output, the up and gate
    projections' outputs, each of width I, one of them in float32 on LoRA's path) and of the hidden
    state in and out: 4I + 4Ib + 2h x 4.
    """
    return 4 * s.intermediate + 4 * s.intermediate * b + 2 * 4 * s.hidden


def activations(s: Shape, tokens: int, b: int, r: int, targets, checkpointing: bool) -> int:
    """Activation memory of one micro-batch of `tokens` tokens in the update.

    Without checkpointing: T (L a + w), a = `layer_activations`, w = `layer_backward_workspace`.
    With checkpointing (each layer's input kept, the layer recomputed in the backward pass):
    T (L h b + a + w). Either way, the head's input: the final RMSNorm's float32 input and its
    output in the model's dtype, T (4h + hb).
    """
    a, w = layer_activations(s, b, r, targets), layer_backward_workspace(s, b)
    head_input = 4 * s.hidden + s.hidden * b
    per_token = (s.layers * s.hidden * b + a if checkpointing else s.layers * a) + w + head_input
    return tokens * per_token


def forward_activations(s: Shape, tokens: int, b: int) -> int:
    """A forward pass without gradients (the rescoring that gives old log-probs and entropies)
    keeps one layer's tensors at a time: the residual stream in and out (2hb), RMSNorm's float32
    copy (4h), q, k, v and the attention output (b (2h + 2kv)), the MLP's gate, up, SiLU and
    product (4Ib) and LoRA's float32 copy of the product (4I); and the head's input (4h + hb):
    T (8h + 5hb + 2 kv b + 4Ib + 4I)."""
    h, kv, i = s.hidden, s.kv_dim, s.intermediate
    return tokens * (8 * h + 5 * h * b + 2 * kv * b + 4 * i * b + 4 * i)


def logits_chunk(s: Shape, rows: int, b: int) -> int:
    """One chunk of the output head (packing.py: C rows at a time, recomputed in the backward):
    the logits in the model's dtype and three float32 [C, V] tensors (the logits upcast, then the
    softmax and the gradient, or exp's temporaries in the forward): C V (b + 12), or C V x 12 in
    float32, where the upcast is the logits themselves."""
    return rows * s.vocab * ((0 if b == 4 else b) + 3 * 4)


def update_logits(s: Shape, tokens: int, b: int, r: int, targets, checkpointing: bool, rows: int) -> int:
    """What the output head adds to the update's peak beyond `activations`: its chunk (`logits_chunk`)
    lives after the layers' forward pass and before their backward pass, never beside a layer's
    backward workspace w (`layer_backward_workspace`) nor, with checkpointing, beside a layer's
    recomputed activations a (`layer_activations`), both of which `activations` counts:
    max(0, logits_chunk - T w), or max(0, logits_chunk - T (a + w)) with checkpointing."""
    apart = layer_backward_workspace(s, b) + (layer_activations(s, b, r, targets) if checkpointing else 0)
    return max(0, logits_chunk(s, rows, b) - tokens * apart)


def kv_cache_per_token(s: Shape, b: int = 2) -> int:
    """vLLM's KV cache per token: keys and values of every layer: 2 L kv b."""
    return 2 * s.layers * s.kv_dim * b


# Bytes per row and vocabulary entry of one decode step's sampling in the transformers engine
# (bfspo/rollout/hf_engine.py: logprobs_and_entropy, sample_next), every [rows, V] tensor counted as
# live at once: the float32 log-probabilities (4) and probabilities (4), top-p's sorted copy (4) and
# its int64 order (8), the nucleus mask (1), the masked and scattered probabilities (4 + 4), and the
# float64 copy and its cumulative sum that the inverse-CDF draw reads (8 + 8).
HF_SAMPLING_BYTES = 4 + 4 + 4 + 8 + 1 + 4 + 4 + 8 + 8


def hf_decode(s: Shape, rows: int, max_len: int, b: int = 2) -> dict[str, int]:
    """What the transformers engine's decode holds beside the model: the KV cache of `rows` sequences
    (rollout_batch_size) at their longest, max_len tokens, 2 L kv b each; and one step's logits in the
    model's dtype with its sampling tensors, rows V (b + HF_SAMPLING_BYTES)."""
    return {f"KV cache x{rows}": rows * max_len * kv_cache_per_token(s, b),
            "sampling": rows * s.vocab * (b + HF_SAMPLING_BYTES)}


def vllm_workspace(s: Shape, max_num_seqs: int, max_batched_tokens: int, b: int = 2) -> int:
    """vLLM's memory besides weights and KV cache (what its start-up profiling reserves): the
    activations of one forward of `max_batched_tokens` tokens (the hidden state, the MLP's three
    [T, I] tensors), the sampler's float32 logits of `max_num_seqs` sequences (and two copies
    for top-p sorting), and about 1 GiB of CUDA graphs:
    Tb (2h + 3I) + 3 x 4 S V + 1 GiB."""
    return (max_batched_tokens * b * (2 * s.hidden + 3 * s.intermediate)
            + 3 * 4 * max_num_seqs * s.vocab + GIB)
