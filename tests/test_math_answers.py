"""Math answer rewards: answers found where models put them, compared exactly as numbers and
symbolically otherwise, and the TRL-signature reward functions over string and chat completions."""

import re
import threading
import time
from fractions import Fraction

import pytest

from envs.text import math_answers
from envs.text.math_answers import (
    answers_match,
    boxed_format_reward,
    extract_answer,
    math_answer_reward,
    parse_number,
    pattern_format_reward,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the result is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("first \\boxed{3}, no wait: \\boxed{{4}}", "{4}"),  # the last box, nested braces kept
        ("\\boxed{\\frac{\\sqrt{2}}{2}} is it", "\\frac{\\sqrt{2}}{2}"),
        ("\\fbox{7}", "7"),
        ("\\boxed 5", "5"),
        ("The answer is 42 apples.", "42 apples"),
        ("Answer: $-\\frac{1}{2}$.", "-\\frac{1}{2}"),
        ("**Answer:** 17", "17"),
        ("answer: 3\nAnswer:\n  12", "12"),  # the last marker; its value on the next line
        ("Natalia sold 48 clips.\n#### 72", "72"),
        ("Answer: Sam has 42 apples in all.", "42"),  # a sentence after the marker: its number
        ("The answer is 42. Then 7 more come.", "42"),  # the marker's sentence only
        ("The answer is: in all 20 + 17 = 37 cards.", "37"),
        ("Answer: x^2 + 1", "x^2 + 1"),
        ("The answer is 4.\nThe final number after 'Answer:' is", "4"),  # a quoted marker
        ("She has 5 - 3 = 2 left", "2"),
        ("it went down to -4", "-4"),
        ("7 - 3", "3"),  # a subtraction, not -3
        ("there were 1,234 people", "1,234"),
        ("about 0.5 or 3/4 of it", "3/4"),
        ("\\boxed{never closed 9", "9"),  # a truncated box is no box
        ("no numbers here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, value",
    [
        ("42", Fraction(42)),
        ("-3", Fraction(-3)),
        ("+3", Fraction(3)),
        ("0.5", Fraction(1, 2)),
        (".25", Fraction(1, 4)),
        ("1,234", Fraction(1234)),
        ("$1,234.50", Fraction(246900, 200)),
        ("12 apples.", Fraction(12)),
        ("42.", Fraction(42)),
        ("50%", Fraction(50)),
        ("50\\%", Fraction(50)),
        ("3/4", Fraction(3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("\\dfrac{3}{4}", Fraction(3, 4)),
        ("-\\frac{1}{2}", Fraction(-1, 2)),
        ("$\\frac{-1}{2}$", Fraction(-1, 2)),
        ("\\frac12", Fraction(1, 2)),
        ("x = 5", Fraction(5)),
        ("5 \\text{ cm}", Fraction(5)),
        ("90^\\circ", Fraction(90)),
        ("\u22127", Fraction(-7)),  # a Unicode minus sign
        ("1{,}000", Fraction(1000)),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    "text", ["", "abc", "3 + 4", "12,34", "1/0", "2\\frac{1}{2}", "12 apples and 3 pears", None]
)
def test_parse_number_refuses_non_numbers(text):
    assert parse_number(text) is None


@pytest.mark.parametrize(
    "predicted, reference",
    [
        ("1,234", "1234"),
        ("0.5", "1/2"),
        ("\\frac{1}{2}", "0.5"),
        ("42 apples", "42"),
        ("-\\frac{1}{2}", "-0.5"),
        ("42", 42),  # a number in the answer column
        ("0.1", 0.1),
        ("7.0", "7"),
        ("x^2+1", "1+x^2"),  # symbolic, through Math-Verify
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
        ("2\\frac{1}{2}", "5/2"),
        ("Yes", "yes"),
    ],
)
def test_answers_match(predicted, reference):
    assert answers_match(predicted, reference)


@pytest.mark.parametrize(
    "predicted, reference",
    [
        ("41", "42"),
        ("41", 42),
        ("0.33", "1/3"),  # exact, no tolerance
        ("-2", "2"),
        (None, "2"),
        ("", "2"),
        ("x^2-1", "x^2+1"),
        ("no", "on"),  # words are compared as words, not as the products n*o and o*n
    ],
)
def test_answers_differ(predicted, reference):
    assert not answers_match(predicted, reference)


def test_without_math_verify_strings_are_compared_normalised(monkeypatch):
    monkeypatch.setattr(math_answers, "_math_verify", lambda: None)
    assert answers_match("$x^2 + 1$", "x^2+1") and answers_match("\\dfrac{a}{b}", "\\frac{a}{b}")
    assert not answers_match("1+x^2", "x^2+1")
    assert answers_match("0.5", "\\frac{1}{2}")  # numbers need no Math-Verify


def test_symbolic_match_off_the_main_thread():
    # GRPO calls host rewards from a callback thread, where SIGALRM timeouts cannot be used.
    results = {}

    def check():
        start = time.perf_counter()
        results["equal"] = answers_match("\\frac{\\pi}{2}", "\\pi/2")
        results["different"] = answers_match("\\pi", "\\pi/2")
        results["tower"] = answers_match("9^{9^{9}}", "5")  # refused, not computed
        results["factorial"] = answers_match("(10^{7})!", "5")
        results["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=check)
    thread.start()
    thread.join(timeout=30)
    assert results["equal"] and not results["different"]
    assert not results["tower"] and not results["factorial"] and results["seconds"] < 5


COMPLETIONS = [
    "3 + 4 = 7. Answer: 7",
    "The answer is \\boxed{\\frac{1}{2}}",
    "I think it is 12 apples.",
    "Answer: 8",
    "Nothing useful",
]


def test_math_answer_reward_strings_and_numeric_answers():
    answers = ["7", "0.5", 12, "9", "1"]
    rewards = math_answer_reward(["p"] * 5, COMPLETIONS, answer=answers, difficulty=[1] * 5)
    assert rewards == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_math_answer_reward_conversational():
    chats = [[{"role": "assistant", "content": text}] for text in COMPLETIONS[:2]]
    chats.append(
        [
            {"role": "assistant", "content": "Answer: 99"},  # only the last message counts
            {"role": "assistant", "content": [{"type": "text", "text": "Answer: 3"}]},
        ]
    )
    prompts = [[{"role": "user", "content": "q"}]] * 3
    assert math_answer_reward(prompts, chats, answer=["7", "1/2", "3"]) == [1.0, 1.0, 1.0]


def test_reward_rejects_mismatched_columns_and_bad_completions():
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        math_answer_reward(["p", "p"], ["1", "2"], answer=["1"])
    with pytest.raises(TypeError, match="a completion is int"):
        math_answer_reward(["p"], [5], answer=["5"])


def test_format_rewards():
    texts = ["so \\boxed{4}", "\\boxed{}", "\\boxed{4", "<think>a\nb</think> 4", "4"]
    assert boxed_format_reward([""] * 5, texts) == [1.0, 0.0, 0.0, 0.0, 0.0]
    think = pattern_format_reward(r"(?s)<think>.*</think>", name="think_format")
    assert think.__name__ == "think_format"
    assert think([""] * 5, texts, answer=["4"] * 5) == [0.0, 0.0, 0.0, 1.0, 0.0]
    chat = [[{"role": "assistant", "content": "<think>x</think>"}]]
    assert think([""], chat) == [1.0] and boxed_format_reward([""], chat) == [0.0]
    with pytest.raises(re.error):
        pattern_format_reward("(unclosed")
