"""The verifier v(o, a*): answer extraction and answer checking.

Extraction follows TokenSkip (which follows the Qwen2.5-Math evaluation): the last \\boxed{} if
there is one; otherwise the text after the last "(the / final / correct) answer is" /
"answer:" / "####" / a line starting "A:"; otherwise the last number. An MMLU letter comes only
from the box or the last answer statement, in the forms instruction-tuned models write ("the
correct choice / option is (B)", "the answer would be C", "option D is correct", `_LETTER_ANCHOR`,
`_LETTER_FIRST`), never from a list of the choices. Math answers are then
compared with math-verify (gold first). math-verify's own timeout uses SIGALRM, which only works
in the main thread, so it is switched off and every comparison runs instead in a persistent child
process that is killed and replaced when it misses its deadline: a pathological answer such as
`9^{9^{9^{9}}}` costs at most `timeout` seconds, from any thread or process. The workers form one
bounded pool per process, shared by its threads; a caller waits for a free worker, and its deadline
counts only its own comparison (never that wait, nor a worker's start-up). A comparison that misses
its deadline is scored False and counted (`timeouts()`): the trainer logs the count of each step as
rollout/verify_timeouts, and an evaluation's summary holds its verify_timeouts. A worker dies with
the process that started it. Extraction runs in the caller and is linear in the response's length.

Every verdict is cached per (gold, answer, deadline), a timeout too (`_verify_cached`): a repeated
pathological answer costs nothing, and is counted as a timeout again, since it is scored False for
one; threads asking the same question at once share one comparison. A slow comparison never holds
up the others: a caller that finds every worker busy, one of them on a comparison running longer
than `SLOW_S`, starts one more worker (at most `MAX_EXTRA_WORKERS` beyond the pool's size, given
back when no slow comparison needs it), so an ordinary answer waits about SLOW_S and a worker's
start-up, not the deadlines of the pathological answers before it, as long as a core is free to
run it (each pathological comparison keeps a core busy until its deadline).
"""

from __future__ import annotations

import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

from bfspo.tasks.benchmarks import Benchmark, get_benchmark

VERIFY_TIMEOUT_S = 5.0  # deadline of one math-verify comparison
WORKER_START_TIMEOUT_S = 120.0  # the child imports sympy and math-verify once
MAX_ANSWER_CHARS = 1000  # longer "answers" are never correct and are not parsed at all
SLOW_S = 0.5  # a comparison running longer is slow: a caller waiting for a worker starts another
MAX_EXTRA_WORKERS = 8  # workers beyond the pool's size that slow comparisons may make room for
CACHE_SIZE = 1 << 16  # verdicts kept (least recently used dropped)
# comparisons a worker makes before it says it is ready: fractions, decimals, symbols, sets, intervals
WARM_UP = [("\\frac{1}{2}", "0.5"), ("x^2+1", "1+x^2"), ("\\{1, 2\\}", "(1, 2]"), ("\\sqrt{2}\\pi", "2")]

# ---------------------------------------------------------------- extraction

_ANCHOR = re.compile(
    r"(?:\banswer\s+is|answer\s*(?:\*+\s*)?:|####|^[ \t]*A[ \t]*:)\s*",  # "the / final / correct answer is"
    re.IGNORECASE | re.MULTILINE,
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+(?:\.\d+)?)?|-?\.\d+")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
_LETTER = re.compile(r"^\(?([A-D])\)?(?![A-Za-z0-9])")
_MORE_LETTERS = re.compile(r"\s*(?:,|/|\bor\b|\band\b)\s*\(?[A-D]\)?(?![A-Za-z0-9])")  # "A, B", "A or B"
_CHOICE_LINE = re.compile(r"^[ \t*]*\(?([A-D])(?:\)|[.:])[ \t*]", re.MULTILINE)  # "A. 4", "(B) 6", "**C:** 7"
_INLINE_CHOICE = re.compile(r"(?:^|\s)\(?([A-D])(?:\)|[.:])\s")  # "A. 4 B. 6 C. 7" on one line
# MMLU answer statements, the letter after them: _ANCHOR's, and "the correct choice / option is",
# "the answer would / should / must be", these only where a capital letter (or "option X") follows.
_LETTER_ANCHOR = re.compile(
    _ANCHOR.pattern + r"|\b(?:answer|choice|option)\s+(?:is|would\s+be|should\s+be|must\s+be)\b[\s:*]*"
    r"(?=\(?(?:(?:option|choice)\s+)?\(?(?-i:[A-D])\b)",
    re.IGNORECASE | re.MULTILINE,
)
# ... and the letter before them: "option C is correct", "(B) is the correct answer", "**D** is right."
_LETTER_FIRST = re.compile(
    r"(?:\b(?:option|choice)\s+)?(?<![\w*(])\**\(?((?-i:[A-D]))\)?\**\s+is\s+(?:the\s+)?(?:correct|right|best)"
    r"(?:\s+(?:answer|choice|option))?\s*(?:[.!]|$)",
    re.IGNORECASE | re.MULTILINE,
)
_CHOICE_WORD = re.compile(r"^(?:option|choice|letter)\s+", re.IGNORECASE)  # "option B", "choice (C)"


_BRACE_DEPTH = {"{": 1, "}": -1}


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}) with balanced braces, else None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] != "{":  # "\boxed 5": the answer runs to the next space or "$"
        return re.split(r"[\s$]", text[i:], maxsplit=1)[0] or None
    depth = 0
    for j in range(i, len(text)):
        depth += _BRACE_DEPTH.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def _last_anchor(text: str) -> re.Match | None:
    """The last answer phrase ("the answer is", "####", ...) of `text`, if any."""
    last = None
    for last in _ANCHOR.finditer(text):
        pass
    return last


def _after_last_anchor(text: str) -> str | None:
    """The rest of the sentence after the last answer phrase."""
    last = _last_anchor(text)
    if last is None:
        return None
    rest = text[last.end() :].lstrip(" \t\n:*").split("\n", 1)[0]
    end = _SENTENCE_END.search(rest)
    return rest[: end.start()] if end else rest


def _last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(_THOUSANDS.sub("", text))
    return numbers[-1] if numbers else None


_WRAPPERS = (("\\(", "\\)"), ("\\[", "\\]"), ("$", "$"))
# What _strip_answer removes at the front (whitespace, colons, bold marks), and at the back, matched
# in the reversed text (whitespace, bold marks, periods and slashes); a run of each wrapper's left
# part at the front and of its right part at the back (reversed), with the parts' lengths.
_FRONT = re.compile(r"\s*:*\**")
_BACK = re.compile(r"\s*\**[./]*")
_WRAPPER_RUNS = [(re.compile(f"(?:{re.escape(left)})*"), re.compile(f"(?:{re.escape(right[::-1])})*"),
                  len(left), len(right)) for left, right in _WRAPPERS]


def _strip_answer(ans: str) -> str:
    """Remove what wraps an answer without being part of it: a leading colon, **bold** marks,
    $...$, \\( \\), \\[ \\], and a final period or slash, again until nothing changes.

    Linear in the length, however deep the nesting: the text is cut once, at the end, from two
    indices, and n nested copies of one wrapper go in one step (found in O(n), `_wrapper_depth`)."""
    rev, n = ans[::-1], len(ans)
    i, j = 0, n
    while True:
        before = (i, j)
        i = _FRONT.match(ans, i, j).end()
        j = n - _BACK.match(rev, n - j, n - i).end()
        for left, right, a, b in _WRAPPER_RUNS:
            k = _wrapper_depth(left, right, a, b, ans, rev, i, j)
            i, j = i + k * a, j - k * b
        if (i, j) == before:
            return ans[i:j]


def _wrapper_depth(left, right, a: int, b: int, ans: str, rev: str, i: int, j: int) -> int:
    """How many copies of one wrapper (left part of length a, right part of length b) wrap ans[i:j],
    in time proportional to that number: the runs at both ends are measured up to a limit that
    doubles until one of them is shorter."""
    n, most, limit = len(ans), (j - i) // (a + b), 1
    while True:
        limit = min(limit, most)
        front = (left.match(ans, i, i + limit * a).end() - i) // a
        back = (right.match(rev, n - j, n - j + limit * b).end() - (n - j)) // b
        if front < limit or back < limit or limit == most:
            return min(front, back)
        limit *= 2


def extract_answer(benchmark: str | Benchmark, response: str) -> str | None:
    """The final answer a response gives (a letter for MMLU), or None when it gives none."""
    kind = get_benchmark(benchmark).kind
    boxed = last_boxed(response)
    if kind == "mmlu":
        return _extract_letter(response, boxed)
    if boxed is not None:
        return _strip_answer(boxed) or None
    ans = _strip_answer(_after_last_anchor(response) or "")
    return ans or _last_number(response)


def _lists_choices(text: str) -> bool:
    """Whether `text` lists choices: lines that start with at least two different letters A-D."""
    return len(set(_CHOICE_LINE.findall(text))) >= 2


def _stated_letter_text(response: str) -> str | None:
    """The text of the last answer statement: the rest of its sentence after "the answer is" and the
    like, or the letter of "option C is correct"; None without one, or when the statement is followed
    by a list of the choices (on lines of their own, or three or more on its line)."""
    last = max([*_LETTER_ANCHOR.finditer(response), *_LETTER_FIRST.finditer(response)], key=lambda m: m.start(),
               default=None)
    if last is None:
        return None
    if last.re is _LETTER_FIRST:
        return last.group(1)
    if _lists_choices(response[last.end():]):
        return None
    rest = response[last.end():].lstrip(" \t\n:*").split("\n", 1)[0]
    if len(set(_INLINE_CHOICE.findall(rest))) >= 3:
        return None
    end = _SENTENCE_END.search(rest)
    return rest[: end.start()] if end else rest


def _extract_letter(response: str, boxed: str | None) -> str | None:
    """The chosen letter, only from the last box or else the last answer statement ("the answer is
    (C)", "Answer: C", "the correct option is (B)", "option D is correct"); never from a letter that
    merely stands in the text.

    A response that repeats the options ("A. ... D. increase the mortality rate") names every letter
    and chooses none: an answer statement followed by such a list, and a candidate that names
    several letters ("A, B, C or D"), give no letter.
    """
    for candidate in (boxed, _stated_letter_text(response)):
        if candidate is not None:
            text = re.sub(r"\\text(?:bf)?\{([^{}]*)\}", r"\1", _strip_answer(candidate))
            text = _strip_answer(_CHOICE_WORD.sub("", text))
            m = _LETTER.match(text)
            if m and not _MORE_LETTERS.match(text, m.end()):
                return m.group(1)
    return None


# ---------------------------------------------------------------- checking

_PLAIN_NUMBER = re.compile(
    r"(?P<mantissa>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?)"
    r"(?:[eE](?P<e>[-+]?\d+)|\s*\\(?:times|cdot)\s*10\^(?:\{(?P<braced>[-+]?\d+)\}|(?P<bare>\d)))?"
)
_SCIENTIFIC = re.compile(r"([-+]?\d+(?:\.\d*)?)[eE]([-+]?\d+)")
_UNIT = r"(?:[A-Za-z]+(?:/[A-Za-z]+)+|[A-Za-z]{2,}(?:\^\d)?)"  # "m/s", "km/h", "dollars", "cm^2"
_NUMBER_WITH_WORDS = re.compile(rf"([-+]?[\d.,]*\d)\s*((?:{_UNIT}(?:\s+|$))+)")
_SPACE_BY_SYMBOL = re.compile(r"\s*([^\w\s\\])\s*")
_SIZING = re.compile(r"\\(?:left|right)(?![A-Za-z])")  # \left( but not \leftarrow


def _plain_number(s: str) -> Decimal | None:
    """`s` as an exact decimal if it is nothing but a number: thousands commas and scientific
    notation (`4.5e33`, `4.5 \\times 10^{33}`) allowed."""
    m = _PLAIN_NUMBER.fullmatch(s)
    if not m or not any(c.isdigit() for c in m["mantissa"]):
        return None
    exponent = m["e"] or m["braced"] or m["bare"]
    try:
        value = Decimal(m["mantissa"].replace(",", ""))
        return value.scaleb(int(exponent)) if exponent else value
    except ArithmeticError:  # an exponent beyond Decimal's range
        return None


def normalize_answer(ans: str) -> str:
    """Meaning-preserving clean-up before comparison: dollar signs, \\left/\\right, \\dfrac,
    `{,}` separators, scientific `4.5e33`, and plain unit words after a number ("18 dollars",
    "2.5 m/s"; LaTeX units such as `\\text{ cm}` are math-verify's job)."""
    ans = _strip_answer(ans.replace("\\$", "").replace("$", ""))
    ans = _SIZING.sub("", ans).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("{,}", ",")
    scientific = _SCIENTIFIC.fullmatch(ans)
    if scientific:
        ans = f"{scientific.group(1)}\\times10^{{{scientific.group(2)}}}"
    words = _NUMBER_WITH_WORDS.fullmatch(ans)
    if words and _plain_number(words.group(1)) is not None and "pi" not in words.group(2).split():
        ans = words.group(1)
    return ans


def is_correct(benchmark: str | Benchmark, response: str, gold: str, *, timeout: float = VERIFY_TIMEOUT_S) -> bool:
    """v(o, a*): whether `response` reaches the gold answer `gold` (the prepared data's `answer`).

    math: math-verify (gold first) on the extracted answer, within `timeout` seconds;
    aime: integer equality; mmlu: the same letter.
    """
    kind = get_benchmark(benchmark).kind
    if not isinstance(response, str) or not isinstance(gold, str):
        return False
    ans = extract_answer(benchmark, response)
    if ans is None or len(ans) > MAX_ANSWER_CHARS:
        return False
    if kind == "mmlu":
        return ans == gold.strip().upper()
    if kind == "aime":
        got, want = _integer(ans), _integer(gold)
        return got is not None and got == want
    return math_equal(gold, ans, timeout=timeout)


def _integer(s: str) -> int | None:
    """`s` as an integer if it is a plain number with no fractional part (AIME answers are 0-999)."""
    value = _plain_number(normalize_answer(s))
    if value is None or value.adjusted() > 18 or value != value.to_integral_value():
        return None
    return int(value)


def math_equal(gold: str, answer: str, *, timeout: float = VERIFY_TIMEOUT_S) -> bool:
    """Whether `answer` equals `gold` mathematically. Two plain numbers are compared exactly here;
    identical normalised strings are equal; everything else goes to math-verify in the worker."""
    if len(answer) > MAX_ANSWER_CHARS:
        return False
    gold, answer = normalize_answer(gold), normalize_answer(answer)
    if _SPACE_BY_SYMBOL.sub(r"\1", gold) == _SPACE_BY_SYMBOL.sub(r"\1", answer):
        return True
    g, a = _plain_number(gold), _plain_number(answer)
    if g is not None and a is not None:
        return g == a
    try:
        return _verify_cached(gold, answer, timeout)
    except VerifyTimeout:
        _count_timeout()
        return False


class VerifyTimeout(Exception):
    """A math-verify comparison missed its deadline (the worker was killed), now or when it was cached."""


_TIMEOUTS = 0
_TIMEOUTS_LOCK = threading.Lock()


def timeouts() -> int:
    """Comparisons in this process so far that missed their deadline (each scored False, and counted
    here so that the trainer's step metrics and the evaluation summary can report them)."""
    return _TIMEOUTS


def _count_timeout() -> None:
    global _TIMEOUTS
    with _TIMEOUTS_LOCK:
        _TIMEOUTS += 1


_CACHE: OrderedDict = OrderedDict()  # (gold, answer, timeout) -> True, False, or None for a timeout
_PENDING: dict = {}  # the same key -> the Future of the comparison running for it
_CACHE_LOCK = threading.Lock()


def clear_cache() -> None:
    """Forget every cached verdict."""
    with _CACHE_LOCK:
        _CACHE.clear()


def _verify_cached(gold: str, answer: str, timeout: float) -> bool:
    """math-verify's verdict in a worker, cached (a timeout too: VerifyTimeout again, at no cost);
    a thread asking what another is comparing waits for that comparison."""
    key = (gold, answer, timeout)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            verdict, pending, mine = _CACHE[key], None, False
        else:
            pending = _PENDING.get(key)
            mine = pending is None
            if mine:
                pending = _PENDING[key] = Future()
    if mine:
        try:
            verdict = _pool().verify(gold, answer, timeout)
        except VerifyTimeout:
            verdict = None
        except BaseException as e:
            with _CACHE_LOCK:
                del _PENDING[key]
            pending.set_exception(e)
            raise
        with _CACHE_LOCK:
            _CACHE[key] = verdict
            while len(_CACHE) > CACHE_SIZE:
                _CACHE.popitem(last=False)
            del _PENDING[key]
        pending.set_result(verdict)
    elif pending is not None:
        verdict = pending.result()
    if verdict is None:
        raise VerifyTimeout(f"math-verify took more than {timeout:g} s")
    return verdict


class _Spawner:
    """Starts worker processes from one thread that lives as long as the process. A worker asks the
    kernel to kill it when its parent goes (see `_die_with_parent`), and the kernel reads "parent" as
    the thread that started it: started by a short-lived caller thread, it would die with that thread."""

    def __init__(self):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="bfspo-verify-spawner", daemon=True).start()

    def _serve(self):
        while True:
            done, args, kwargs = self._requests.get()
            try:
                done.set_result(subprocess.Popen(*args, **kwargs))
            except BaseException as e:  # handed to the caller, whatever it is
                done.set_exception(e)

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        done: Future = Future()
        self._requests.put((done, args, kwargs))
        return done.result()


_SPAWNER: _Spawner | None = None


class _VerifyWorker:
    """A persistent child process that runs math-verify, one request at a time (the pool hands a
    worker to one caller at a time).

    The child speaks JSON lines: it reads `[gold, answer]` and writes `true` or `false`. It says
    `ready` only once math-verify has imported and run a comparison, so that a request's deadline
    counts the comparison alone, never the worker's start-up. A request that misses its deadline
    kills the child (VerifyTimeout); the next request starts a fresh one.
    """

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self.comparing_since: float | None = None  # when its current comparison began (start-up excluded)

    def verify(self, gold: str, answer: str, timeout: float) -> bool:
        try:
            return self._verify(gold, answer, timeout)
        finally:
            self.comparing_since = None

    def _verify(self, gold: str, answer: str, timeout: float) -> bool:
        for _ in range(2):  # a worker that died before its deadline is replaced once
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            self.comparing_since = time.monotonic()
            deadline = self.comparing_since + timeout
            try:
                self._proc.stdin.write((json.dumps([gold, answer]) + "\n").encode())
                self._proc.stdin.flush()
                reply = self._read_line(deadline)
            except OSError:
                reply = None
            if reply is not None:
                return json.loads(reply) is True
            self.close()
            if time.monotonic() >= deadline:
                raise VerifyTimeout(f"math-verify took more than {timeout:g} s")
        raise RuntimeError("the math-verify worker process died twice in a row")

    def _start(self):
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._buffer = b""
        self._proc = _spawner().popen(
            [sys.executable, "-c", f"from bfspo.tasks.verify import serve_verifier; serve_verifier({os.getpid()})"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
        )
        if self._read_line(time.monotonic() + WORKER_START_TIMEOUT_S) != "ready":
            self.close()
            raise RuntimeError("the math-verify worker process failed to start")

    def _read_line(self, deadline: float) -> str | None:
        """One line from the child, or None if it does not come before `deadline` (or the child died)."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def close(self):
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                try:  # closing stdin flushes what a dead child never read: a broken pipe, nothing to keep
                    pipe.close()
                except OSError:
                    pass
            self._proc = None


def _default_workers() -> int:
    """The pool's size: the CPUs this process may run on, from 2 (one pathological answer never holds
    up every other comparison) to 8 (each worker holds about 57 MB, and a comparison takes
    milliseconds, so a few workers serve any number of threads)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(2, min(8, cpus))


class _WorkerPool:
    """At most `size` workers, shared by every thread of the process, and one more for each comparison
    running longer than SLOW_S (at most MAX_EXTRA_WORKERS more). A caller takes an idle worker, or
    starts one while the pool may grow, or waits until one is given back or a busy one turns slow;
    the wait, like a worker's start-up, is not part of the caller's deadline. A worker given back
    while the pool holds more than it may now is closed."""

    def __init__(self, size: int):
        self.size = size
        self._free = threading.Condition()
        self._idle: list[_VerifyWorker] = []
        self.workers: list[_VerifyWorker] = []

    def _allowed(self) -> int:
        """How many workers the pool may hold now: `size`, plus one per slow comparison (at most
        MAX_EXTRA_WORKERS more)."""
        now = time.monotonic()
        slow = sum(w.comparing_since is not None and now - w.comparing_since > SLOW_S for w in self.workers)
        return self.size + min(slow, MAX_EXTRA_WORKERS)

    def verify(self, gold: str, answer: str, timeout: float) -> bool:
        with self._free:
            while not self._idle and len(self.workers) >= self._allowed():
                self._free.wait(SLOW_S / 2)  # a busy worker may turn slow meanwhile
            if self._idle:
                worker = self._idle.pop()
            else:
                worker = _VerifyWorker()
                self.workers.append(worker)
        try:
            return worker.verify(gold, answer, timeout)
        finally:
            with self._free:
                if len(self.workers) > self._allowed():  # an extra worker no slow comparison needs now
                    self.workers.remove(worker)
                    worker.close()
                else:
                    self._idle.append(worker)
                self._free.notify()


_POOL: _WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> _WorkerPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = _WorkerPool(_default_workers())
        return _POOL


def _spawner() -> _Spawner:
    global _SPAWNER
    with _POOL_LOCK:
        if _SPAWNER is None:
            _SPAWNER = _Spawner()
        return _SPAWNER


def _forget_workers_in_child():
    """A forked child must not share its parent's workers (nor a lock some parent thread held); its
    parent's spawner thread does not exist in it."""
    global _POOL, _POOL_LOCK, _SPAWNER, _TIMEOUTS_LOCK, _CACHE_LOCK, _PENDING
    _POOL, _POOL_LOCK, _SPAWNER, _TIMEOUTS_LOCK = None, threading.Lock(), None, threading.Lock()
    _CACHE_LOCK, _PENDING = threading.Lock(), {}


os.register_at_fork(after_in_child=_forget_workers_in_child)


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent goes (Linux's PR_SET_PDEATHSIG), even in the
    middle of a computation; exit now if the parent is already gone. Strictly, the signal comes when
    the parent's thread that started the worker ends: the pool starts every worker from one thread
    that lasts as long as the process (`_Spawner`)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)


def serve_verifier(parent: int) -> None:
    """The worker's main loop (run in the child): math-verify with its SIGALRM timeouts disabled."""
    import logging

    _die_with_parent(parent)

    logging.disable(logging.CRITICAL)  # math-verify logs every expression it cannot parse
    from math_verify import parse, verify

    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the replies

    @lru_cache(maxsize=4096)
    def parsed(expr: str):
        return parse(f"\\boxed{{{expr}}}", parsing_timeout=None)

    for gold, answer in WARM_UP:  # the first comparisons import most of sympy: not within a deadline
        verify(parsed(gold), parsed(answer), timeout_seconds=None)
    out.write("ready\n")
    out.flush()

    for line in sys.stdin:
        gold, answer = json.loads(line)
        try:
            ok = bool(verify(parsed(gold), parsed(answer), timeout_seconds=None))
        except Exception:
            ok = False
        out.write(json.dumps(ok) + "\n")
        out.flush()
