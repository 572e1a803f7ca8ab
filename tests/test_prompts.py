"""Prompts: TokenSkip's user turn through the model's own chat template (with its default system prompt)."""

import pytest
from transformers import AutoTokenizer

from bfspo.errors import BfspoError
from bfspo.tasks.benchmarks import BENCHMARKS
from bfspo.tasks.prompts import format_choices, prompt_ids, render_prompt, user_message

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
MMLU_INSTRUCTION = "Please reason step by step, and put the letter of the correct choice (A, B, C or D) within \\boxed{}."
MMLU_QUESTION = "Which of the following is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def expected_prompt(instruction: str, question: str) -> str:
    return (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{instruction}\n{question}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_renders_the_exact_tokenskip_prompt(tokenizer, name):
    kind = BENCHMARKS[name].kind
    question = MMLU_QUESTION if kind == "mmlu" else "Tom has 3 apples and buys 4 more. How many does he have?"
    instruction = MMLU_INSTRUCTION if kind == "mmlu" else MATH_INSTRUCTION
    assert render_prompt(tokenizer, name, question) == expected_prompt(instruction, question)


def test_user_message_is_instruction_newline_question():
    assert user_message("gsm8k", "What is 2+2?") == MATH_INSTRUCTION + "\nWhat is 2+2?"
    assert user_message(BENCHMARKS["aime25"], "Find N.") == MATH_INSTRUCTION + "\nFind N."
    assert user_message("mmlu_stem", MMLU_QUESTION) == MMLU_INSTRUCTION + "\n" + MMLU_QUESTION


def test_format_choices_writes_lettered_lines():
    assert format_choices("Which of the following is a prime number? ", ["4", "6", " 7", 9]) == MMLU_QUESTION
    with pytest.raises(BfspoError, match="expected 4 choices"):
        format_choices("Q?", ["a", "b", "c"])


def test_prompt_ids_tokenise_the_rendered_prompt_with_special_tokens(tokenizer):
    question = "Tom has 3 apples. He buys 4 more apples."
    ids = prompt_ids(tokenizer, "gsm8k", question)
    assert tokenizer.decode(ids) == render_prompt(tokenizer, "gsm8k", question)
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids[0] == im_start  # the template's own first token, nothing added before it
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2


def test_unknown_benchmark_is_a_clear_error():
    with pytest.raises(BfspoError, match="unknown benchmark 'gsm9k'.*gsm8k"):
        user_message("gsm9k", "q")
