"""The toy reasoning task: seeded multi-step arithmetic word problems with integer answers.

A problem tracks one quantity (Tom's apples, the hotel's guests, ...) over 2-5 consecutive days,
each day an addition, subtraction, doubling or halving with a small operand:

    Tom has 14 apples. On Monday, Tom eats 9 apples. On Tuesday, the apples double. How many
    apples does Tom have now?

A solution is a sequence of *parts*: an opening restatement, one line per day, a recap, and the
answer line. Each part independently takes one of three verbosity *forms*, and every solution ends
in `\\boxed{N}` (so `bfspo.tasks.verify` checks it like a MATH answer):

- `concise`: the equation only (`Monday: 14 - 9 = 5`); no opening and no recap; `\\boxed{5}`;
- `stepwise`: a short sentence with the unit of the result (`On Monday, 14 - 9 = 5 apples.`);
  no opening and no recap; `The answer is \\boxed{5}.`;
- `verbose`: the fact restated before its equation, units in every equation
  (`On Monday, Tom eats 9 apples: 14 apples - 9 = 5 apples.`); the opening `Let me restate the
  facts. ...` and the recap `To recap: ...` are parts that exist only in this form;
  `So the final answer is \\boxed{5}.`

A model trained on the mix learns to choose the verbosity of every line, so an answer can be
shortened at any of its line breaks, not only at its first token: the toy analogue of an
overthinking reasoning model, where redundant sentences and units appear mid-answer (as in the
paper's qualitative analysis). The days always run from Monday, so a day name is a step counter that carries
no uncertainty: the choices left to the model are the forms and the arithmetic.

Splits: `toy` (in-domain: the training templates, 2-5 steps) and `toy_ood` (out-of-domain: half
its problems use story templates never seen in training, with 2-5 steps; half use the training
templates with 6-7 steps).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

# The default numbers, small enough for a tiny model: every value in [1, 20], starting in [2, 15];
# add/sub operands 2-9; mul/div by 2; 2-5 steps in domain, 6-7 out of domain. `Difficulty` changes them.
START = (2, 15)
ADD_SUB = (2, 9)
MAX_VALUE = 20
ID_STEPS = (2, 5)
OOD_STEPS = (6, 7)

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
FORMS = ("concise", "stepwise", "verbose")
FORM_WEIGHTS = {"concise": 0.2, "stepwise": 0.3, "verbose": 0.5}
SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


@dataclass(frozen=True)
class Difficulty:
    """How hard a problem is: every value in [1, max_value], the start value in [2, 3/4 max_value],
    add/sub operands in [2, max_operand], and in-domain problems of min_steps to max_steps steps
    (the longer out-of-domain problems have the two step counts after max_steps). The default is
    the toy of docs/reproducibility.md (values up to 20, operands up to 9, 2-5 steps; 6-7 out of domain)."""

    max_value: int = MAX_VALUE
    max_operand: int = ADD_SUB[1]
    min_steps: int = ID_STEPS[0]
    max_steps: int = ID_STEPS[1]

    def __post_init__(self):
        if self.max_operand < ADD_SUB[0] or self.max_value < 2 * ADD_SUB[0] + 1:
            raise ValueError(f"need max_operand >= {ADD_SUB[0]} and max_value >= {2 * ADD_SUB[0] + 1}; got {self}")
        if not 1 <= self.min_steps <= self.max_steps or self.max_steps + 2 > len(DAYS):
            raise ValueError(f"need 1 <= min_steps <= max_steps <= {len(DAYS) - 2} (a day per step, two more "
                             f"out of domain); got {self}")

    @property
    def start(self) -> tuple[int, int]:
        return START[0], self.max_value * 3 // 4

    @property
    def steps(self) -> tuple[int, int]:
        return self.min_steps, self.max_steps

    @property
    def ood_steps(self) -> tuple[int, int]:
        return self.max_steps + 1, self.max_steps + 2


DEFAULT = Difficulty()


@dataclass(frozen=True)
class Template:
    """One story frame. `{v}` is a value, `{n}` an operand.

    subject: who or what holds the quantity (as written mid-sentence).
    unit: what is counted.
    start: the first fact, which gives the starting value.
    ops: for each operation (add, sub, and mul, div by 2), the clauses that can state one day's change.
    ask: the question sentence.
    """

    name: str
    subject: str
    unit: str
    start: str
    ops: dict[str, tuple[str, ...]]
    ask: str


def _template(name: str, subject: str, unit: str, verb: str, ops: dict[str, tuple[str, ...]]) -> Template:
    """A story where `subject` has (`verb`) a number of `unit`."""
    owner = subject[0].upper() + subject[1:]
    return Template(name, subject, unit, f"{owner} {verb} {{v}} {unit}.", ops,
                    f"How many {unit} does {subject} have now?")


TEMPLATES = {
    t.name: t
    for t in (
        _template("apples", "Tom", "apples", "has", {
            "add": ("Tom buys {n} more apples", "Tom finds {n} apples"),
            "sub": ("Tom gives away {n} apples", "Tom eats {n} apples"),
            "mul": ("the apples double",),
            "div": ("Tom gives away half of the apples",),
        }),
        _template("hotel", "the hotel", "guests", "has", {
            "add": ("{n} guests arrive", "{n} more guests check in"),
            "sub": ("{n} guests leave", "{n} guests check out"),
            "mul": ("the number of guests doubles",),
            "div": ("half of the guests leave",),
        }),
        _template("savings", "Mia", "dollars", "has", {
            "add": ("Mia earns {n} dollars", "Mia gets {n} dollars as a gift"),
            "sub": ("Mia spends {n} dollars", "Mia pays {n} dollars for lunch"),
            "mul": ("Mia doubles her dollars",),
            "div": ("Mia spends half of her dollars",),
        }),
        _template("shop", "the shop", "boxes", "has", {
            "add": ("a truck brings {n} boxes", "the shop gets {n} more boxes"),
            "sub": ("the shop sells {n} boxes", "a truck takes {n} boxes away"),
            "mul": ("the number of boxes doubles",),
            "div": ("the shop sells half of the boxes",),
        }),
        # Held out of training: only in the out-of-domain split.
        _template("library", "the library", "books", "has", {
            "add": ("a donor gives {n} books", "the library buys {n} more books"),
            "sub": ("readers take {n} books home", "the library throws away {n} books"),
            "mul": ("the number of books doubles",),
            "div": ("the library gives away half of the books",),
        }),
        _template("farm", "the farm", "sheep", "has", {
            "add": ("{n} lambs are born", "the farmer buys {n} more sheep"),
            "sub": ("the farmer sells {n} sheep", "{n} sheep run away"),
            "mul": ("the flock doubles in size",),
            "div": ("half of the sheep are sold",),
        }),
    )
}
ID_TEMPLATES = ("apples", "hotel", "savings", "shop")
OOD_TEMPLATES = ("library", "farm")


@dataclass(frozen=True)
class Step:
    """One day's change: `before op operand = after`, stated by `clause`."""

    day: str
    op: str
    operand: int
    before: int
    after: int
    clause: str

    @property
    def sentence(self) -> str:
        return f"On {self.day}, {self.clause}."


@dataclass(frozen=True)
class Problem:
    """A start value and its steps, told with the story `template`."""

    template: str
    start: int
    steps: tuple[Step, ...]

    @property
    def answer(self) -> int:
        return self.steps[-1].after

    @property
    def start_sentence(self) -> str:
        return TEMPLATES[self.template].start.format(v=self.start)

    @property
    def question(self) -> str:
        return " ".join([self.start_sentence, *(s.sentence for s in self.steps), TEMPLATES[self.template].ask])


def _choose_step(rng: random.Random, value: int, d: Difficulty) -> tuple[str, int, int]:
    """A random operation that keeps the result in [1, d.max_value]: (op, operand, result)."""
    options = []
    if value + ADD_SUB[0] <= d.max_value:
        options.append("add")
    if value - ADD_SUB[0] >= 1:
        options.append("sub")
    if 2 * value <= d.max_value:
        options.append("mul")
    if value % 2 == 0:
        options.append("div")
    op = rng.choice(options)
    if op == "add":
        n = rng.randint(ADD_SUB[0], min(d.max_operand, d.max_value - value))
        return op, n, value + n
    if op == "sub":
        n = rng.randint(ADD_SUB[0], min(d.max_operand, value - 1))
        return op, n, value - n
    return op, 2, value * 2 if op == "mul" else value // 2


def make_problem(rng: random.Random, template: str, n_steps: int, difficulty: Difficulty = DEFAULT) -> Problem:
    """One random problem of `n_steps` steps on consecutive days from Monday, told with the
    story `template`, its numbers as large as `difficulty` says."""
    ops = TEMPLATES[template].ops
    start = value = rng.randint(*difficulty.start)
    steps = []
    for i in range(n_steps):
        op, n, after = _choose_step(rng, value, difficulty)
        day = DAYS[i]
        steps.append(Step(day, op, n, value, after, rng.choice(ops[op]).format(n=n)))
        value = after
    return Problem(template, start, tuple(steps))


def _equation(step: Step, unit: str = "") -> str:
    """`a op n = b`, with `unit` after the two quantities (not after the operand)."""
    u = f" {unit}" if unit else ""
    return f"{step.before}{u} {SYMBOL[step.op]} {step.operand} = {step.after}{u}"


def random_forms(rng: random.Random, n_steps: int) -> tuple[str, ...]:
    """One form per part of a solution with `n_steps` steps (opening, each step, recap, answer),
    drawn independently with FORM_WEIGHTS."""
    return tuple(rng.choices(FORMS, weights=[FORM_WEIGHTS[f] for f in FORMS], k=n_steps + 3))


def solution(problem: Problem, forms: str | Sequence[str]) -> str:
    """The solution of `problem` with one form per part (opening, each step, recap, answer), or
    one form (a name in FORMS) for every part. It ends with \\boxed{answer}."""
    p, unit = problem, TEMPLATES[problem.template].unit
    forms = (forms,) * (len(p.steps) + 3) if isinstance(forms, str) else tuple(forms)
    if len(forms) != len(p.steps) + 3 or not set(forms) <= set(FORMS):
        raise ValueError(f"need {len(p.steps) + 3} forms from {', '.join(FORMS)}; got {forms!r}")
    opening, *step_forms, recap, answer = forms
    lines = [f"Let me restate the facts. {p.start_sentence}"] if opening == "verbose" else []
    for s, form in zip(p.steps, step_forms):
        lines.append({
            "concise": f"{s.day}: {_equation(s)}",
            "stepwise": f"On {s.day}, {_equation(s)} {unit}.",
            "verbose": f"On {s.day}, {s.clause}: {_equation(s, unit)}.",
        }[form])
    if recap == "verbose":
        lines.append(f"To recap: from {p.start} to {p.answer} {unit}.")
    boxed = f"\\boxed{{{p.answer}}}"
    lines.append({"concise": boxed, "stepwise": f"The answer is {boxed}.",
                  "verbose": f"So the final answer is {boxed}."}[answer])
    return "\n".join(lines)


_LINE_FORMS = (
    (re.compile(r"Let me restate|To recap|So the final answer|On \w+, [^:]*: "), "verbose"),
    (re.compile(r"On \w+, |The answer is"), "stepwise"),
)


def line_forms(response: str) -> list[str]:
    """The form of each line of a (generated) response, for length reports: verbose lines restate
    or recap, stepwise lines are sentences around a bare equation, anything else is concise."""
    forms = []
    for line in response.splitlines():
        forms.append(next((form for pattern, form in _LINE_FORMS if pattern.match(line)), "concise"))
    return forms


def _rows(rng: random.Random, split: str, n: int, seen: set[str], with_solution: bool,
          difficulty: Difficulty) -> list[dict]:
    """`n` problems with questions unseen so far (recorded in `seen`), as prepared-data rows."""
    rows = []
    while len(rows) < n:
        if split == "toy_ood":
            unseen = len(rows) % 2 == 0
            template = rng.choice(OOD_TEMPLATES if unseen else ID_TEMPLATES)
            n_steps = rng.randint(*(difficulty.steps if unseen else difficulty.ood_steps))
        else:
            template, n_steps = rng.choice(ID_TEMPLATES), rng.randint(*difficulty.steps)
        p = make_problem(rng, template, n_steps, difficulty)
        if p.question in seen:
            continue
        seen.add(p.question)
        row = {
            "id": f"{split}-{len(rows):05d}",
            "question": p.question,
            "answer": str(p.answer),
            "benchmark": "toy_ood" if split == "toy_ood" else "toy",
            "template": template,
            "steps": n_steps,
        }
        if with_solution:
            forms = random_forms(rng, n_steps)
            row.update(forms=list(forms), solution=solution(p, forms))
        rows.append(row)
    return rows


def make_splits(seed: int, n_train: int, n_rl: int, n_eval: int, difficulty: Difficulty = DEFAULT,
                exclude: frozenset[str] = frozenset()) -> dict[str, list[dict]]:
    """All splits, with pairwise disjoint questions: {"train": SFT rows with `solution` and
    `forms`, "rl_train": RL questions, "toy": in-domain eval, "toy_ood": out-of-domain eval}, every
    split as hard as `difficulty`, none of them a question of `exclude` (e.g. the SFT questions of
    a model that is to be trained and evaluated on harder questions).

    The evaluation splits are drawn first, so their questions do not depend on the train sizes.
    """
    rng = random.Random(seed)
    seen = set(exclude)
    out = {split: _rows(rng, split, n_eval, seen, False, difficulty) for split in ("toy", "toy_ood")}
    out["rl_train"] = _rows(rng, "rl_train", n_rl, seen, False, difficulty)
    out["train"] = _rows(rng, "train", n_train, seen, True, difficulty)
    return out
