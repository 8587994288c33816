"""Verifiable rewards for math answers: find a completion's final answer and check it.

GRPO on user data (a JSONL file of prompts with an `answer` column) needs a reward that says
whether a sampled completion reached the right answer. Models state answers in many ways, so the
check is split in two:

    extract_answer(text)        the last \\boxed{...} (or \\fbox{...}); else what follows the last
                                "Answer:", "answer is" or "####"; else the last number
    answers_match(pred, ref)    exact numeric equality (fractions.Fraction) when both sides read
                                as numbers, so "1,234" == "1234", "0.5" == "\\frac{1}{2}" and
                                "42 apples." == "42"; otherwise symbolic equivalence through
                                `math_verify` (Hugging Face's Math-Verify, on SymPy), or, if it is
                                not installed, equality of normalised strings

and the reward functions take the TRL signature, `f(prompts, completions, **columns)` returning
one float per completion, so they serve `--config.rewards.host=envs.text.math_answers:...` and TRL
alike. A completion is a string, or (conversational data) a list of chat messages whose last
message's content is the text.

Numbers are compared exactly, not within a tolerance: the answers of arithmetic word problems are
exact, and a rounded 0.33 is not 1/3. A percent sign is read as a unit ("50%" == "50"), the way
GSM8K-style references write percentages.

Math-Verify bounds each SymPy call with SIGALRM, which only works on the main thread; GRPO calls
host rewards from a callback thread. There its timeouts are switched off (its documented option),
and instead an expression that could make SymPy compute for minutes (a power tower such as
9^{9^9}, the factorial of an expression, an exponent of many digits) or a very long one is never
handed to it: it falls back to string equality.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

__all__ = [
    "answers_match",
    "boxed_format_reward",
    "completion_text",
    "extract_answer",
    "math_answer_reward",
    "parse_number",
    "pattern_format_reward",
]

# Longer answers go to string equality, not SymPy (see `_costly_for_sympy`).
MAX_SYMBOLIC_LENGTH = 200
# Math-Verify's own per-call time limit, used only where SIGALRM works (the main thread).
SYMPY_TIMEOUT_SECONDS = 5


# --- finding the answer in a completion ------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE = re.compile(r"\\boxed\s+([^\s{}$]+)")  # MATH writes "\boxed 5" too
# A marker in quotes is a mention ("the number after 'Answer:' is"), not a statement.
_MARKER = re.compile(
    r"(?:answer\s*:|answer\s+is\b\s*:?|####)(?!\s*['\"\u2019\u201d])", re.IGNORECASE
)
_NUMBER_TEXT = r"\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
# A number as it appears in running text: a LaTeX fraction, a/b, or a plain number; a minus sign
# only where it cannot be a subtraction ("5-3" ends in 3, not -3).
_LAST_NUMBER = re.compile(
    r"(?:(?<![\w)}\]])(?<![\d)}\]]\s)-)?"
    r"(?:\\[dt]?frac\{\d+\}\{\d+\}|(?:" + _NUMBER_TEXT + r")(?:\s?/\s?\d+(?![\d,]))?)"
)
_PROSE = re.compile(r"[A-Za-z]{2,}\s+[A-Za-z]{2,}")
_WORDS = re.compile(r"[A-Za-z][A-Za-z\s'.,-]*")


def _boxed_candidates(text: str) -> list[tuple[int, str]]:
    """(position, content) of every \\boxed{...} / \\fbox{...} whose braces close, and of every
    bare `\\boxed 5`."""
    found = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    found.append((match.start(), text[start:i].strip()))
                    break
    found.extend((m.start(), m.group(1)) for m in _BOXED_BARE.finditer(text))
    return [(position, content) for position, content in found if content]


def _clean_segment(segment: str) -> str:
    """The answer text after a marker: its first sentence on its first non-empty line, without
    the markdown bold, maths delimiters and sentence-ending period around it."""
    lines = [line for line in segment.splitlines() if line.strip()]
    line = re.split(r"(?<=\S)[.!?]\s", lines[0])[0] if lines else ""  # "42. Then 7 more."
    line = line.strip().strip("*").strip()
    line = line.removeprefix(":").strip()
    for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if line.startswith(left) and line.rstrip(".").endswith(right) and len(line) > 2:
            line = line.rstrip(".")[len(left) : -len(right)].strip()
    return line.rstrip(".").strip()


def extract_answer(text: str) -> str | None:
    """The final answer a completion states: the content of its last \\boxed{...} (nested braces
    kept, \\fbox too); else the text after the last "Answer:", "answer is" or "####" (any case),
    on that line, or the last number in it when it is a sentence; else the last number in the
    text. None if there is none of these."""
    boxed = _boxed_candidates(text)
    if boxed:
        return max(boxed)[1]
    markers = list(_MARKER.finditer(text))
    if markers:
        segment = _clean_segment(text[markers[-1].end() :])
        if segment:
            numbers = _LAST_NUMBER.findall(segment)
            # "Answer: Sam has 42 apples" is prose around a number; "x^2 + 1" is the answer itself.
            if numbers and parse_number(segment) is None and _PROSE.search(segment):
                return numbers[-1].strip()
            return segment
    numbers = _LAST_NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


# --- reading a number --------------------------------------------------------------------------

_UNWRAP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_DROP = re.compile(r"\\left|\\right|\\[!,;: ]|~|\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\?\$")
_VARIABLE = re.compile(r"^[A-Za-z]\w*\s*=\s*")  # "x = 5"
_SIGNED = r"[+-]?\s*(?:" + _NUMBER_TEXT + r")"
_NUMBER = re.compile(
    r"\s*(?P<sign>[+-]?)\s*(?:"
    r"\\[dt]?frac\s*\{\s*(?P<lnum>" + _SIGNED + r")\s*\}\s*\{\s*(?P<lden>" + _SIGNED + r")\s*\}"
    r"|\\[dt]?frac\s*(?P<snum>\d)\s*(?P<sden>\d)"  # \frac12
    r"|(?P<num>" + _NUMBER_TEXT + r")(?:\s*/\s*(?P<den>" + _NUMBER_TEXT + r"))?"
    r")"
)
# What may follow a number: a percent sign, unit words ("apples", "km/h", "dollars."), a period.
_UNITS = re.compile(r"\s*%?\s*(?:[A-Za-z][A-Za-z\s.'/-]*)?[.!]?\s*")


def _fraction(text: str) -> Fraction:
    return Fraction(text.replace(",", "").replace(" ", ""))


def parse_number(text: str) -> Fraction | None:
    """The exact value of a number written as text, or None if the text is not one number.

    Reads integers, signs, decimals, thousands commas ("1,234"), a/b fractions, LaTeX \\frac{a}{b}
    (\\dfrac, \\tfrac, \\frac12), with currency, maths delimiters, "x =" before and a percent sign,
    unit words or a period after ("$1,234.50", "-\\frac{1}{2}", "12 apples.", "50%" == 50). Text
    with more than one number or with operators ("3 + 4", "2\\frac{1}{2}") gives None."""
    if not isinstance(text, str):
        return None
    cleaned = _UNWRAP.sub(r" \1 ", text.replace("\u2212", "-"))
    cleaned = _DROP.sub("", cleaned.replace("{,}", ",").replace("\\%", "%"))
    cleaned = cleaned.replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    cleaned = _VARIABLE.sub("", cleaned.strip().strip("*").strip())
    match = _NUMBER.match(cleaned)
    if match is None or not _UNITS.fullmatch(cleaned, match.end()):
        return None
    parts = match.groupdict()
    if parts["lnum"] is not None:
        numerator, denominator = _fraction(parts["lnum"]), _fraction(parts["lden"])
    elif parts["snum"] is not None:
        numerator, denominator = Fraction(parts["snum"]), Fraction(parts["sden"])
    else:
        numerator = _fraction(parts["num"])
        denominator = _fraction(parts["den"]) if parts["den"] is not None else Fraction(1)
    if denominator == 0:
        return None
    value = numerator / denominator
    return -value if parts["sign"] == "-" else value


def _as_fraction(value: Any) -> Fraction | None:
    """A reference answer's exact value: ints as they are, floats by their shortest repr (0.1 is
    1/10, not the binary fraction nearest it), strings through `parse_number`."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(repr(value)) if value == value and abs(value) != float("inf") else None
    return parse_number(value) if isinstance(value, str) else None


# --- symbolic equivalence ----------------------------------------------------------------------


class _DropTimeoutNotice(logging.Filter):
    """Math-Verify warns once that its timeouts are off; here they are off on purpose (callback
    threads) and `_costly_for_sympy` stands in for them, so the warning would only mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


@functools.cache
def _math_verify() -> Any:
    """The `math_verify` module, or None where it is not installed (imported on first use: it
    brings SymPy, half a second of imports that numeric answers never need)."""
    try:
        import math_verify
    except ImportError:
        return None
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutNotice())
    return math_verify


def _exponent(text: str, start: int) -> str:
    """The exponent that follows a ^ at `start - 1`: a brace group, a command or one token."""
    rest = text[start:].lstrip()
    if rest.startswith("{"):
        depth = 0
        for i, char in enumerate(rest):
            depth += {"{": 1, "}": -1}.get(char, 0)
            if depth == 0:
                return rest[: i + 1]
        return rest
    token = re.match(r"\\[A-Za-z]+|\w+|.?", rest)
    return token.group(0) if token else ""


def _costly_for_sympy(text: str) -> bool:
    """Whether SymPy might compute for minutes on `text`: a long text, a nested power, an exponent
    with more than four digits in all, or a factorial of an expression or of a number >= 1000."""
    if len(text) > MAX_SYMBOLIC_LENGTH:
        return True
    for match in re.finditer(r"\^", text):
        exponent = _exponent(text, match.end())
        if "^" in exponent or "!" in exponent or sum(c.isdigit() for c in exponent) > 4:
            return True
    for match in re.finditer(r"(?<!\\)!(?!=)", text):
        before = text[: match.start()].rstrip()
        if before.endswith((")", "}", "]")) or re.search(r"\d{4,}$", before):
            return True
    return False


def _symbolic_match(predicted: str, reference: str) -> bool | None:
    """Math-Verify's verdict on two LaTeX / plain-maths answers, or None where it cannot give one
    (not installed, an answer it cannot parse, or one too costly to try)."""
    if any(_WORDS.fullmatch(t) and re.search("[A-Za-z]{2}", t) for t in (predicted, reference)):
        return None  # words, not maths: SymPy reads "no" as n*o, equal to "on"
    math_verify = _math_verify()
    if math_verify is None or _costly_for_sympy(predicted) or _costly_for_sympy(reference):
        return None
    # SIGALRM timeouts work only on the main thread; elsewhere `_costly_for_sympy` guards.
    limit = SYMPY_TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None
    from math_verify.errors import TimeoutException

    try:
        # Wrapped in \boxed{}, its highest-priority extraction, so the whole answer is read as
        # one expression, LaTeX or plain ("x^2+1", "\frac{\pi}{2}", "(1, 2)").
        gold = math_verify.parse(f"\\boxed{{{reference}}}", parsing_timeout=limit)
        target = math_verify.parse(f"\\boxed{{{predicted}}}", parsing_timeout=limit)
        if not gold or not target:
            return None
        return bool(math_verify.verify(gold, target, timeout_seconds=limit))
    except (Exception, TimeoutException):  # noqa: BLE001  a parser failure is "cannot tell"
        return None


_NORMALISE = re.compile(r"\s+|\$|\\left|\\right|\\[!,;: ]|\\text\{|\\mathrm\{")


def _normalised(text: str) -> str:
    text = _NORMALISE.sub("", text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac"))
    return text.rstrip(".").lower()


def answers_match(predicted: str | None, reference: str | float) -> bool:
    """Whether a predicted answer (from `extract_answer`) equals the reference: exactly as numbers
    when both read as numbers (`parse_number`; a number `reference` is taken as is), else by
    Math-Verify's symbolic equivalence when it is installed and can parse both, else as normalised
    strings (whitespace, $ and \\left/\\right removed, case ignored). None never matches."""
    if predicted is None or reference is None:
        return False
    predicted = str(predicted).strip()
    if not predicted:
        return False
    want, got = _as_fraction(reference), parse_number(predicted)
    if want is not None and got is not None:
        return want == got
    reference = str(reference).strip()
    verdict = _symbolic_match(predicted, reference)
    if verdict is not None:
        return verdict
    return bool(reference) and _normalised(predicted) == _normalised(reference)


# --- reward functions (TRL signature) ----------------------------------------------------------


def completion_text(completion: Any) -> str:
    """A completion's text: a string as it is; for conversational data (a list of chat messages)
    the content of the last message (its text parts joined, if the content is a list of parts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list | tuple) and completion:
        message = completion[-1]
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            return content
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise TypeError(
        f"a completion is {type(completion).__name__} {str(completion)[:60]!r}; pass strings or "
        'lists of chat messages like [{"role": "assistant", "content": "..."}]'
    )


def math_answer_reward(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **columns: Any
) -> list[float]:
    """1.0 for each completion whose `extract_answer` matches its row's `answer` (a string or a
    number; `answers_match`), else 0.0."""
    if len(answer) != len(completions):
        raise ValueError(
            f"{len(completions)} completions but {len(answer)} answers; pass the `answer` column "
            "of the completions' rows"
        )
    return [
        float(answers_match(extract_answer(completion_text(completion)), reference))
        for completion, reference in zip(completions, answer, strict=True)
    ]


def boxed_format_reward(
    prompts: Sequence[Any], completions: Sequence[Any], **columns: Any
) -> list[float]:
    """1.0 for each completion that puts something in a closed \\boxed{...} (or \\fbox{...}),
    else 0.0: a format bonus for the answer layout `math_answer_reward` reads first."""
    return [float(bool(_boxed_candidates(completion_text(c)))) for c in completions]


def pattern_format_reward(
    pattern: str, name: str = "pattern_format_reward"
) -> Callable[..., list[float]]:
    """A reward function (TRL signature) giving 1.0 to each completion in which
    `re.search(pattern, text)` finds a match, else 0.0; `name` becomes its `__name__`, which
    trainers log. The pattern is compiled here, so a bad one fails at once (`re.error`); put flags
    in it, e.g. "(?s)<think>.*</think>"."""
    compiled = re.compile(pattern)

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        return [float(compiled.search(completion_text(c)) is not None) for c in completions]

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = f"1.0 where the completion matches {pattern!r}, else 0.0."
    return reward
