"""A tiny model of a real architecture, built offline: a BPE tokenizer trained with `tokenizers`,
a chat template in the Qwen2.5 style, and a randomly initialised transformers Qwen2 model.

The result is an ordinary Hugging Face model directory, so every loader (AutoTokenizer,
AutoModelForCausalLM, peft, vLLM) treats it like a hub model. The tests build one with random
weights; the toy pipeline (`bfspo toy build`) trains one.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

# Qwen2.5-style chat template: the system turn defaults to DEFAULT_SYSTEM when none is given.
DEFAULT_SYSTEM = "You are a helpful assistant."
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512):
    """Train a byte-level BPE tokenizer on `texts` and wrap it as a transformers fast tokenizer.

    EOS is `<|im_end|>` (the end of an assistant turn, as in Qwen2.5), padding is `<|endoftext|>`.
    Normalisation and pre-tokenisation are Qwen2's own (NFC, Qwen2's split regex, which makes
    every digit a token, then byte-level): a saved model directory has model_type qwen2, so
    AutoTokenizer loads it as a Qwen2Tokenizer, which rebuilds exactly this pipeline around the
    trained vocabulary. Any other pipeline would tokenise differently once reloaded.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def new_model(tokenizer, hidden_size: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
              intermediate_size: int | None = None, max_positions: int = 2048, seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM sized for `tokenizer`, in float32."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_model_dir(model, tokenizer, path: str | Path) -> Path:
    """Save model and tokenizer as one Hugging Face model directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
