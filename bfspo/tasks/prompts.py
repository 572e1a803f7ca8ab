"""Every piece of prompt text, in one place.

The paper adopts TokenSkip's protocol: the model's own chat template, with the system prompt that
the template puts by default, and a single user turn

    Please reason step by step, and put your final answer within \\boxed{}.
    {question}

MMLU-STEM questions carry their choices as `A. ...` lines (see `format_choices`, which
`bfspo prepare` uses to build the stored question). Their instruction asks for the letter in
\\boxed{} instead of "your final answer", and is otherwise the same sentence:

    Please reason step by step, and put the letter of the correct choice (A, B, C or D) within \\boxed{}.
    {question with choice lines}
"""

from __future__ import annotations

from collections.abc import Sequence

from bfspo.errors import BfspoError
from bfspo.tasks.benchmarks import Benchmark, get_benchmark

CHOICE_LETTERS = "ABCD"

TOKENSKIP_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
MMLU_INSTRUCTION = "Please reason step by step, and put the letter of the correct choice (A, B, C or D) within \\boxed{}."
INSTRUCTIONS = {"math": TOKENSKIP_INSTRUCTION, "aime": TOKENSKIP_INSTRUCTION, "mmlu": MMLU_INSTRUCTION}


def format_choices(question: str, choices: Sequence[str]) -> str:
    """An MMLU question followed by one `A. choice` line per choice."""
    if len(choices) != len(CHOICE_LETTERS):
        raise BfspoError(f"expected {len(CHOICE_LETTERS)} choices, got {len(choices)}")
    lines = [f"{letter}. {str(choice).strip()}" for letter, choice in zip(CHOICE_LETTERS, choices)]
    return "\n".join([question.strip(), *lines])


def user_message(benchmark: str | Benchmark, question: str) -> str:
    """The user turn: the benchmark kind's instruction, a newline, then the question."""
    return f"{INSTRUCTIONS[get_benchmark(benchmark).kind]}\n{question}"


def render_prompt(tokenizer, benchmark: str | Benchmark, question: str) -> str:
    """The full prompt text: the user turn through the model's chat template, ready for the answer."""
    messages = [{"role": "user", "content": user_message(benchmark, question)}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_ids(tokenizer, benchmark: str | Benchmark, question: str) -> list[int]:
    """Token ids of `render_prompt`; the template already holds any BOS, so none is added."""
    return tokenizer(render_prompt(tokenizer, benchmark, question), add_special_tokens=False)["input_ids"]
