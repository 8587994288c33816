"""The in-program final-number reward (envs/text/final_number.py) against the host Python one it
is the special case of (envs.text.math_answers.math_answer_reward), on byte tokens and on a
tokenizer whose tokens hold several digits, or digits and other characters."""

import re

import numpy as np
import pytest

from envs.text.final_number import final_number_reward, final_numbers, token_digit_table
from envs.text.math_answers import math_answer_reward
from envs.text.task import PromptBatch
from jaxrl.data.prompts import PromptRow, PromptTable
from jaxrl.lm.sampler import Completion
from jaxrl.lm.tokenizer import ByteTokenizer

BYTES = ByteTokenizer()


class PieceTokenizer:
    """Tokens that are whole strings, matched longest first: several digits in one token ("12"),
    a leading space (" 7"), digits and punctuation together ("5.", "x3y", "1=2=3")."""

    PIECES = ["12", "345", " 7", "5.", "x3y", "1=2=3", "0", "1", "2", "3", "4", "5", "6", "7",
              "8", "9", " ", "=", "+", "-", "*", " apples", "\n",
              *"abcdefghijklmnopqrstuvwxyz"]  # fmt: skip
    vocab_size = len(PIECES)

    def decode(self, ids):
        return "".join(self.PIECES[i] for i in ids)

    def encode(self, text):
        ids = []
        while text:
            best = max(
                (i for i, p in enumerate(self.PIECES) if text.startswith(p)),
                key=lambda i: len(self.PIECES[i]),
            )
            ids.append(best)
            text = text[len(self.PIECES[best]) :]
        return ids


def as_completion(tokenizer, texts, pad_to=None):
    ids = [tokenizer.encode(t) for t in texts]
    n = pad_to or max(1, max(map(len, ids)))
    tokens = np.zeros((len(ids), n), np.int32)
    mask = np.zeros((len(ids), n), bool)
    for i, row in enumerate(ids):
        tokens[i, : len(row)], mask[i, : len(row)] = row, True
    return tokens, mask


def answer_table(rows):
    """A prompt table of `rows` (only their columns matter to the reward)."""
    return PromptTable(
        np.zeros((len(rows), 1), np.int32), np.ones((len(rows), 1), bool), rows, 0, 1
    )


def last_numbers(tokenizer, texts, pad_to=None):
    tokens, mask = as_completion(tokenizer, texts, pad_to)
    table = token_digit_table(tokenizer)
    value, valid = np.asarray(final_numbers(tokens, mask, table))
    return [int(v) if ok else None for v, ok in zip(value, valid, strict=True)]


@pytest.mark.parametrize("tokenizer", [BYTES, PieceTokenizer()], ids=["bytes", "pieces"])
def test_hand_cases(tokenizer):
    texts = ["14 - 8 = 6", "6 apples", "no number", "", "12345", "x3y", "1=2=3 apples", "5.",
             "7 * 345\n", "1234567890", "0012"]  # fmt: skip
    want = [6, 6, None, None, 12345, 3, 3, 5, 345, None, 12]  # 10 digits: no answer
    assert last_numbers(tokenizer, texts) == want
    # Tokens past the mask (pad, or after EOS) are not read.
    tokens, mask = as_completion(tokenizer, ["14 = 6"])
    mask[0, -1] = False
    value, valid = final_numbers(tokens, mask, token_digit_table(tokenizer))
    assert bool(valid[0]) and int(value[0]) == 14


@pytest.mark.parametrize("tokenizer", [BYTES, PieceTokenizer()], ids=["bytes", "pieces"])
def test_agrees_with_the_host_reward_on_plainly_written_integers(tokenizer):
    """Random completions of digits, operators, spaces and words (no commas, decimals, fractions,
    signs or answer markers: the host reward's richer reading) get the same reward from both."""
    rng = np.random.default_rng(0)
    pieces = [" ", " = ", " + ", " - ", " * ", " apples", "x", "\n", "y"]
    texts, answers = [], []
    for _ in range(400):
        parts = []
        for _ in range(rng.integers(0, 4)):  # numbers of 1 to 3 digits between other text
            if rng.random() < 0.7:
                parts.append(str(rng.integers(0, 10 ** rng.integers(1, 4))))
            parts.append(pieces[rng.integers(len(pieces))])
        text = "".join(parts)
        texts.append(text)
        numbers = [int(x) for x in re.findall(r"\d+", text)]
        answers.append(numbers[-1] if numbers and rng.random() < 0.6 else int(rng.integers(50)))
    rows = tuple(PromptRow(f"row:{i}", {"prompt": "q", "answer": a}) for i, a in enumerate(answers))
    table = PromptTable(
        np.zeros((len(rows), 1), np.int32), np.ones((len(rows), 1), bool), rows, 0, 1
    )
    reward = final_number_reward(tokenizer, table)
    tokens, mask = as_completion(tokenizer, texts)
    prompts = PromptBatch(None, None, None, None, np.arange(len(rows), dtype=np.int32))
    completion = Completion(tokens, None, mask, mask.sum(1))
    in_program = np.asarray(reward(prompts, completion))
    host = np.array(math_answer_reward(["q"] * len(texts), texts, answers))
    assert 0.3 < host.mean() < 0.9  # both outcomes are well represented
    disagree = [
        (t, a) for t, a, x, y in zip(texts, answers, in_program, host, strict=True) if x != y
    ]
    assert not disagree, disagree[:5]


def test_answers_must_be_plain_integers():
    rows = (PromptRow("f.jsonl:1", {"prompt": "q", "answer": "1,234"}),)
    table = answer_table(rows)
    final_number_reward(BYTES, table)  # "1,234" reads as 1234
    for bad in ("3.5", "-2", "x", "1234567890"):
        rows = (PromptRow("f.jsonl:1", {"prompt": "q", "answer": bad}),)
        table = answer_table(rows)
        with pytest.raises(ValueError, match=r"f.jsonl:1: answer .*math_answer_reward"):
            final_number_reward(BYTES, table)
    with pytest.raises(ValueError, match="no 'solution' column"):
        final_number_reward(BYTES, table, column="solution")
