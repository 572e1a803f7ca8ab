"""Answer extraction, verification (math-verify in a killable worker) and the reward of Eq. 3-4."""

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bfspo.algorithm.rewards import overlong_penalty, overlong_window, sequence_reward
from bfspo.errors import BfspoError
from bfspo.tasks.verify import extract_answer, is_correct, last_boxed, math_equal, normalize_answer

# Power towers that sympy would evaluate forever. Each test uses its own, because verdicts are cached.
PATHOLOGICAL = "\\boxed{9^{9^{9^{9}}}}"


# ------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
    "response, answer",
    [
        ("So the total is $3 + 4 = \\boxed{7}$.", "7"),
        ("Hence $x = \\boxed{\\frac{\\sqrt{3}}{2}}$.", "\\frac{\\sqrt{3}}{2}"),  # nested braces
        ("First \\boxed{3}, but correcting myself: \\boxed{5}.", "5"),  # the last box counts
        ("The area is \\fbox{12} square units.", "12"),
        ("The answer is \\boxed 5 and that is all.", "5"),
        ("She makes 9 * 2 = $18 every day.\nThe answer is 18.", "18"),
        ("Thus, the final answer is $\\frac{14}{3}$. I hope it is correct.", "\\frac{14}{3}"),
        ("The answer is:\n\n42", "42"),
        ("**Final Answer:** 42", "42"),
        ("Janet sells 16 - 3 - 4 = 9 eggs.\n#### 18", "18"),
        ("Q: How many? A: 26", "26"),
        ("Step 1: 12 * 5 = 60.\nA: 26", "26"),
        ("The answer is 2.5 m/s.", "2.5 m/s"),
        ("He paid 1,200 + 300 = 1,500 dollars in total", "1500"),  # last number, thousands separator
        ("She has 3/4 of the pie left", "3/4"),
        ("I am not sure how to solve this.", None),
        ("", None),
    ],
)
def test_math_extraction(response, answer):
    assert extract_answer("gsm8k", response) == answer


@pytest.mark.parametrize(
    "response, letter",
    [
        ("7 is prime, so the answer is \\boxed{C}.", "C"),
        ("\\boxed{(B)}", "B"),
        ("\\boxed{\\text{D}}", "D"),
        ("\\boxed{C. 7}", "C"),
        ("The correct answer is (B).", "B"),
        ("Answer: D", "D"),
        ("I first thought B, but the answer is A.", "A"),
        ("The answer is:\n\n(C) 7", "C"),
        ("I think B is right, but actually C.", None),  # no box, no answer statement: no letter (issue 22)
        ("\\boxed{7}", None),  # the choice's text, not its letter
        ("A prime has exactly two divisors.\nSo it is 7.", None),
        ("A. 4\nB. 6\nC. 7\nD. 9\nAnswer: D. 9", "D"),  # the options repeated, then an answer statement
        ("**Answer:** (B) 6", "B"),
    ],
)
def test_mmlu_extracts_the_letter(response, letter):
    assert extract_answer("mmlu_stem", response) == letter


@pytest.mark.parametrize(
    "response",
    [
        # issue 22: SmolLM2 repeated the four options, and the last standalone letter read as "D"
        "The question asks about a virus.\nA. increase the birth rate\nB. decrease the death rate\n"
        "C. increase the population\nD. increase the mortality rate",
        "(A) 4\n(B) 6\n(C) 7\n(D) 9",
        "A) 4\nB) 6\nC) 7\nD) 9\n",
        "Options:\n  **A:** 4\n  **B:** 6\n  **C:** 7\n  **D:** 9",
        "The answer is:\nA. 4\nB. 6\nC. 7\nD. 9",  # an answer statement followed by the whole list
        "A: 4\nB: 6\nC: 7\nD: 9",  # "A:" reads as an answer phrase; the list after it chooses nothing
        "The answer is A, B, C or D.",  # the instruction's letters, echoed
        "\\boxed{A, B, C, D}",
        "The answer is (B) or (D).",
        "Let me think. D",  # a bare letter is not an answer statement
    ],
)
def test_mmlu_refuses_a_list_of_choices(response):
    assert extract_answer("mmlu_stem", response) is None
    assert not is_correct("mmlu_stem", response, "D")


# Issue 33: answer statements in the forms instruction-tuned models write (Qwen2.5-, Llama-3.1- and
# SmolLM2-style closings of MMLU-STEM answers), beyond "the answer is (X)" and "Answer: X".
@pytest.mark.parametrize(
    "response, letter",
    [
        ("The molar mass of water is 18 g/mol, so the correct choice is C.", "C"),
        ("Comparing the four values, the correct option is (B).", "B"),
        ("Let's evaluate each option.\n\nThe correct answer is: D", "D"),
        ("Answer: (A)", "A"),
        ("After checking each statement, option B is correct.", "B"),
        ("Only the third statement holds, so (C) is the correct answer.", "C"),
        ("Therefore, the answer would be **D**.", "D"),
        ("So the answer is option C: 7.", "C"),
        ("The correct answer is **B) 6**.", "B"),
        ("Options A and D contradict the data. Therefore, choice (B) is the right choice.", "B"),
        ("**Final answer:** The correct option is A.", "A"),
        ("Option A is correct only when the gas is ideal; here the correct answer is C.", "C"),
        ("At first glance option A is correct. On reflection, the correct option is (D).", "D"),
    ],
)
def test_mmlu_reads_the_statement_forms_of_instruction_tuned_models(response, letter):
    assert extract_answer("mmlu_stem", response) == letter
    assert is_correct("mmlu_stem", response, letter)


@pytest.mark.parametrize(
    "response",
    [
        "The options are A. 4 B. 6 C. 7 D. 9",  # a list on one line, no statement
        "The correct answer is one of A. 4 B. 6 C. 7",  # a statement followed by the list
        "The answer is A. 4 B. 6 C. 7 D. 9",  # ... which used to read as "A"
        "The correct choice is:\nA. 4\nB. 6\nC. 7\nD. 9",
        "The best option is to compare the energies first.",  # "option is" with no letter after it
        "Option A is incorrect and option B is not correct.",
        "I am not sure which option is right.",
        "The correct option is A, B or D.",
    ],
)
def test_mmlu_statement_forms_do_not_read_a_list_or_a_rejection_as_an_answer(response):
    assert extract_answer("mmlu_stem", response) is None


def test_last_boxed_handles_unbalanced_and_missing_boxes():
    assert last_boxed("\\boxed{\\frac{1}{2}") is None
    assert last_boxed("no box here") is None
    assert last_boxed("\\boxed{a} then \\boxed{b{c}}") == "b{c}"


# ------------------------------------------------------------------ math answers


@pytest.mark.parametrize(
    "raw, normal",
    [
        ("\\left( 3, \\dfrac{\\pi}{2} \\right)", "( 3, \\frac{\\pi}{2} )"),
        ("x \\rightarrow \\infty", "x \\rightarrow \\infty"),  # \\right only as a sizing command
        ("\\$1{,}000.", "1,000"),
        ("4.5e33", "4.5\\times10^{33}"),
        ("18 square feet", "18"),
        ("2.5 m/s", "2.5"),
        ("2 pi", "2 pi"),
        ("x = 5", "x = 5"),
    ],
)
def test_normalize_answer(raw, normal):
    assert normalize_answer(raw) == normal


def test_math_equal_compares_plain_numbers_exactly():
    assert math_equal("1,000", "1000.0") and math_equal("2.5e-3", "0.0025")
    assert not math_equal("0.0000001", "0.0000002")  # math-verify would round both to 0


@pytest.mark.parametrize(
    "benchmark, response, gold, expected",
    [
        # GSM8K: gold is a plain number
        ("gsm8k", "She makes \\boxed{18} dollars.", "18", True),
        ("gsm8k", "She makes \\boxed{\\$18}.", "18", True),
        ("gsm8k", "\\boxed{18 \\text{ dollars}}", "18", True),
        ("gsm8k", "The answer is 18 dollars.", "18", True),
        ("gsm8k", "The answer is 1,000.", "1000", True),  # thousands separator
        ("gsm8k", "\\boxed{1{,}000}", "1000", True),
        ("gsm8k", "\\boxed{70000}", "70000", True),
        ("gsm8k", "\\boxed{18.00}", "18", True),
        ("gsm8k", "\\boxed{17}", "18", False),
        ("gsm8k", "\\boxed{-18}", "18", False),
        ("gsm8k", "Janet sells 9 eggs.\n#### 18", "18", True),
        ("gsm8k", "So he runs 540 meters.\nA: 540", "540", True),
        ("gsm8k", "9 * 60 = 540 meters a week", "540", True),  # unboxed, last number
        ("gsm8k", "I cannot tell.", "18", False),  # no answer
        # fractions, decimals, \frac and /
        ("math500", "\\boxed{\\frac{1}{2}}", "0.5", True),
        ("math500", "\\boxed{0.5}", "\\frac{1}{2}", True),
        ("math500", "\\boxed{1/2}", "\\frac{1}{2}", True),
        ("math500", "So x = 14/3", "\\frac{14}{3}", True),
        ("math500", "\\boxed{\\dfrac{9}{7}}", "\\dfrac{9}{7}", True),
        ("math500", "\\boxed{2.5}", "\\frac52", True),
        ("math500", "\\boxed{0.33}", "\\frac{1}{3}", False),
        ("math500", "\\boxed{\\frac{1}{8}}", "-\\frac{1}{8}", False),
        # radicals and expressions
        ("math500", "\\boxed{\\sqrt{117}}", "3\\sqrt{13}", True),
        ("math500", "\\boxed{x^2+2x+1}", "(x+1)^2", True),
        ("math500", "\\boxed{\\text{Evelyn}}", "\\text{Evelyn}", True),
        ("math500", "\\boxed{\\text{Bob}}", "\\text{Evelyn}", False),
        # units, degrees, percent
        ("math500", "\\boxed{5 \\text{ cm}}", "5", True),
        ("math500", "\\boxed{90^\\circ}", "90", True),
        ("math500", "\\boxed{10\\%}", "10", True),
        ("math500", "\\boxed{10\\%}", "0.1", True),
        ("math500", "The speed is 2.5 m/s, so the answer is 2.5 m/s.", "2.5", True),
        # tuples, sets and intervals
        ("math500", "\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("math500", "\\boxed{(\\pi/2, 3)}", "\\left( 3, \\frac{\\pi}{2} \\right)", False),
        ("math500", "\\boxed{[1,2)}", "[1, 2)", True),
        ("math500", "\\boxed{(1,2)}", "[1, 2)", False),
        ("math500", "\\boxed{(-\\infty, 3]}", "(-\\infty,3]", True),
        ("math500", "\\boxed{15,14,6,4}", "4,6,14,15", True),
        # multiple boxes: the last one is the answer
        ("math500", "\\boxed{3}, no wait, \\boxed{5}", "5", True),
        ("math500", "\\boxed{5}, no wait, \\boxed{3}", "5", False),
        # Minerva: scientific notation, compared exactly (no rounding of tiny numbers to 0)
        ("minerva_math", "\\boxed{4.5 \\times 10^{33}} ergs/s", "4.5e33", True),
        ("minerva_math", "\\boxed{4.50e33}", "4.5e33", True),
        ("minerva_math", "\\boxed{4.6e33}", "4.5e33", False),
        ("minerva_math", "\\boxed{1.325e-27}", "2.88e-19", False),
        ("minerva_math", "\\boxed{1.6} \\mathrm{~cm}", "1.6", True),
    ],
)
def test_math_answers(benchmark, response, gold, expected):
    assert is_correct(benchmark, response, gold) is expected


@pytest.mark.parametrize(
    "response, gold, expected",
    [
        ("\\boxed{70}", "70", True),
        ("\\boxed{070}", "70", True),
        ("The answer is 70.", "70", True),
        ("\\boxed{70.0}", "70", True),
        ("\\boxed{70.5}", "70", False),
        ("\\boxed{71}", "70", False),
        ("\\boxed{\\frac{140}{2}}", "70", False),  # AIME compares integers, not expressions
        ("no answer", "70", False),
        ("\\boxed{1e999999999}", "70", False),
    ],
)
def test_aime_compares_integers(response, gold, expected):
    assert is_correct("aime25", response, gold) is expected


@pytest.mark.parametrize(
    "response, expected",
    [("\\boxed{C}", True), ("The answer is (C).", True), ("\\boxed{B}", False), ("\\boxed{7}", False), ("", False)],
)
def test_mmlu_compares_letters(response, expected):
    assert is_correct("mmlu_stem", response, "C") is expected


def test_unknown_benchmark_is_an_error():
    with pytest.raises(BfspoError, match="unknown benchmark"):
        is_correct("gsm9k", "\\boxed{1}", "1")


# ------------------------------------------------------------------ timeouts and threads


def test_pathological_answer_times_out_and_the_worker_recovers():
    is_correct("math500", "\\boxed{x+1}", "1+x")  # start the worker outside the timed call (x+1 == x+1 needs none)
    start = time.monotonic()
    assert is_correct("math500", PATHOLOGICAL, "1", timeout=1.0) is False
    assert 1.0 <= time.monotonic() - start < 3.0  # it reached the deadline, and no further
    assert is_correct("math500", "\\boxed{\\frac{2}{4}}", "0.5") is True  # a fresh worker answers


def test_huge_answer_is_rejected_quickly():
    start = time.monotonic()
    assert is_correct("math500", "\\boxed{" + "1+" * 25_000 + "1}", "1") is False
    assert is_correct("gsm8k", "x" * 50_000, "1") is False
    assert time.monotonic() - start < 1.0


def test_works_outside_the_main_thread():
    results = []

    def check():
        is_correct("math500", "\\boxed{x+2}", "2+x")  # start the worker outside the timed call
        start = time.monotonic()
        results.append(is_correct("math500", "\\boxed{8^{8^{8^{8}}}}", "1", timeout=1.0))
        results.append(1.0 <= time.monotonic() - start < 3.0)
        results.append(is_correct("math500", "\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}"))
        results.append(is_correct("math500", "\\boxed{\\frac{\\sqrt{2}}{3}}", "\\frac{1}{\\sqrt{2}}"))

    thread = threading.Thread(target=check)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert results == [False, True, True, False]


def test_concurrent_threads_get_their_own_answers():
    cases = [(f"\\boxed{{\\frac{{{n}}}{{{n + 1}}}}}", f"{n}/{n + 1}", True) for n in range(1, 9)]
    cases += [(f"\\boxed{{\\frac{{{n}}}{{{n + 2}}}}}", f"{n}/{n + 1}", False) for n in range(1, 9)]
    results = {}

    def check(i, response, gold):
        results[i] = is_correct("math500", response, gold)

    threads = [threading.Thread(target=check, args=(i, r, g)) for i, (r, g, _) in enumerate(cases)]
    for t in threads:
        t.start()
    for t in threads:  # each concurrent caller starts its own worker: 16 imports of sympy on a loaded machine
        t.join(timeout=300)
    assert results == {i: expected for i, (_, _, expected) in enumerate(cases)}


def _check_in_child(args):
    return is_correct(*args, timeout=1.0)


def test_works_in_a_forked_child_process():
    is_correct("math500", "\\boxed{x+2}", "2+x")  # the parent has a worker before forking
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.map(_check_in_child, [("math500", "\\boxed{\\frac{3}{6}}", "0.5"),
                                         ("math500", "\\boxed{7^{7^{7^{7}}}}", "1")])
    assert got == [True, False]


def test_common_case_is_fast():
    responses = [f"Step one.\nStep two gives {n} + 1 = {n + 1}.\nThe answer is \\boxed{{{n + 1}}}." for n in range(2000)]
    start = time.monotonic()
    verdicts = [is_correct("gsm8k", r, str(n + 1 + n % 2)) for n, r in enumerate(responses)]
    assert time.monotonic() - start < 1.0
    assert verdicts == [n % 2 == 0 for n in range(2000)]


# ------------------------------------------------------------------ Eq. 3-4


@pytest.mark.parametrize(
    "length, penalty",
    [
        (0, 0.0),
        (300, 0.0),
        (307.2, 0.0),  # L_max - L_cache = 409.6 - 102.4: the last length without penalty
        (307.2 + 10.24, -0.1),
        (358.4, -0.5),
        (384, -0.75),
        (409.6, -1.0),  # L_max
        (410, -1.0),
        (500, -1.0),
        (512, -1.0),
    ],
)
def test_overlong_penalty_at_budget_512(length, penalty):
    assert overlong_penalty(length, 512) == pytest.approx(penalty, abs=1e-12)


def test_overlong_penalty_scales_with_the_budget():
    assert overlong_penalty(614.4, 1024) == 0.0
    assert overlong_penalty(716.8, 1024) == pytest.approx(-0.5)
    assert overlong_penalty(819.2, 1024) == pytest.approx(-1.0)
    assert overlong_penalty(820, 1024) == -1.0


def test_overlong_penalty_is_continuous_and_non_increasing():
    lengths = [i / 10 for i in range(0, 6000)]
    values = [overlong_penalty(x, 512) for x in lengths]
    assert all(b <= a for a, b in zip(values, values[1:]))
    assert max(abs(b - a) for a, b in zip(values, values[1:])) <= 0.1 / 102.4 + 1e-12


@pytest.mark.parametrize(
    "correct, length, overlong, reward",
    [
        (True, 300, True, 1.0),
        (False, 300, True, -1.0),
        (True, 358.4, True, 0.5),
        (False, 358.4, True, -1.5),
        (True, 500, True, 0.0),
        (False, 500, True, -2.0),
        (True, 500, False, 1.0),
        (False, 500, False, -1.0),
    ],
)
def test_sequence_reward_eq4(correct, length, overlong, reward):
    assert sequence_reward(correct, length, 512, overlong=overlong) == pytest.approx(reward)


@pytest.mark.parametrize(
    "length, penalty",
    [
        (307.2, 0.0),  # where the paper's window starts: DAPO's does not punish yet
        (409.6, 0.0),  # L_max - L_cache = 512 - 102.4: the last length without penalty
        (409.6 + 10.24, -0.1),
        (460.8, -0.5),
        (486.4, -0.75),
        (512, -1.0),  # L_max = the budget
        (513, -1.0),
    ],
)
def test_dapo_window_at_budget_512(length, penalty):
    assert overlong_penalty(length, 512, window="dapo") == pytest.approx(penalty, abs=1e-12)


def test_the_two_windows_at_the_toy_budget():
    # budget 160: L_cache = 32; paper L_max = 128 -> ramp (96, 128]; dapo L_max = 160 -> ramp (128, 160]
    assert overlong_window(160, "paper") == (128.0, 32.0)
    assert overlong_window(160, "dapo") == (160.0, 32.0)
    assert [overlong_penalty(x, 160) for x in (96, 112, 128, 144, 160)] == [0.0, -0.5, -1.0, -1.0, -1.0]
    assert [overlong_penalty(x, 160, "dapo") for x in (96, 112, 128, 144, 160)] == [0.0, 0.0, 0.0, -0.5, -1.0]
    assert sequence_reward(True, 144, 160, window="paper") == 0.0
    assert sequence_reward(True, 144, 160, window="dapo") == 0.5


def test_unknown_window_is_an_error():
    with pytest.raises(BfspoError, match="overlong window must be one of"):
        overlong_penalty(100, 512, window="verl")


def test_extraction_is_linear_in_runs_of_newlines_and_spaces():
    """The answer-phrase regex once took minutes on 1 MB of newlines; the answers must come back."""
    code = ("from bfspo.tasks.verify import is_correct\n"
            "print(is_correct('gsm8k', 'x' + '\\n' * 10**6, '5'), is_correct('gsm8k', 'answer' + ' ' * 10**5 + 'x', '5'),"
            " is_correct('gsm8k', '\\n' * 10**5 + 'A: 5', '5'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["False", "False", "True"], proc.stderr


def test_a_missing_response_or_gold_is_not_correct():
    assert is_correct("gsm8k", None, "5") is False
    assert is_correct("math500", "\\boxed{5}", None) is False


def test_a_pathological_answer_does_not_hold_up_other_threads():
    """The pool has room for two callers at least: a short deadline is kept while another thread's long one runs."""
    is_correct("math500", "\\boxed{x+3}", "3+x")
    slow = threading.Thread(target=is_correct, args=("math500", "\\boxed{6^{6^{6^{6}}}}", "1"), kwargs={"timeout": 20})
    slow.start()
    quick = []
    quick.append(is_correct("math500", "\\boxed{5^{5^{5^{5}}}}", "1", timeout=1.0))
    quick.append(is_correct("math500", "\\boxed{\\frac{3}{9}}", "1/3"))
    assert quick == [False, True]
    assert slow.is_alive(), "the quick calls waited for the slow one"
    slow.join(timeout=60)


def test_the_worker_dies_with_its_caller():
    code = ("import glob, os, signal, threading, time\n"
            "from bfspo.tasks import verify\n"
            "verify.is_correct('math500', '\\\\boxed{x+4}', '4+x')\n"
            "print(*(open(f).read() for f in glob.glob(f'/proc/{os.getpid()}/task/*/children')), flush=True)\n"
            "threading.Thread(target=verify.is_correct, args=('math500', '\\\\boxed{7^{7^{9^{9}}}}', '1'),"
            " kwargs={'timeout': 600}).start()\n"
            "time.sleep(1)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    worker = int(proc.stdout.split()[0])
    try:
        for _ in range(300):
            if not _running(worker):
                break
            time.sleep(0.1)
        assert not _running(worker), "the verifier worker outlived its caller"
    finally:
        if _running(worker):
            os.kill(worker, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether `pid` is alive (a zombie that nobody reaped yet counts as dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_worker_that_died_between_calls_is_replaced_without_a_broken_pipe():
    """A dead child leaves unread bytes in its stdin buffer; closing that pipe must not raise."""
    from bfspo.tasks.verify import _VerifyWorker

    worker = _VerifyWorker()
    assert worker.verify("1/2", "\\frac{2}{4}", 30.0) is True
    worker._proc.kill()
    worker._proc.wait()
    worker._proc.poll = lambda: None  # it dies just after the liveness check: the request hits a broken pipe
    assert worker.verify("1/3", "\\frac{3}{9}", 30.0) is True  # the dead one is closed and replaced
    worker.close()
