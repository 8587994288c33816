"""The final-number reward computed inside the compiled program, on token ids: a completion is
right when the last integer it writes equals the row's answer.

    table = tokenize_prompts(read_prompt_jsonl("word_problems.jsonl"), tokenizer)
    task = prompt_dataset_task("word_problems", table, tokenizer)
    task = task.with_reward(RewardTerm("final_number", 1.0, final_number_reward(tokenizer, table)))

It is the cheap special case of `envs.text.math_answers.math_answer_reward` (host Python, called
through a callback): no text is decoded and nothing leaves the device, so an update stays one
program with no host round trip. What it reads is deliberately narrow: the last maximal run of
ASCII digits, as a non-negative integer of at most 9 digits. "14 - 8 = 6" and "6 apples" read 6,
as the host reward reads them; "1,234" (reads 234), "-3" (3), "3.5" (5), "\\boxed{}" and
"Answer:" markers, fractions and expressions are the host reward's. Use it for integer answers
written plainly (the shipped word problems), and the host reward for anything richer.

How it works: every token of the vocabulary is decoded once, and what it does to a running
number is tabulated: its leading digits extend the number being read; a non-digit ends it (it
becomes the last number); a digit run inside the token is a whole number; its trailing digits
start the next one. A scan over the completion's tokens then carries (number being read, its
digit count, last whole number, its digit count). Any tokenizer works: a token may hold several
digits, or digits and other characters ("12.", " 7").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from envs.text.task import PromptBatch

__all__ = ["MAX_DIGITS", "final_number_reward", "integer_answers", "token_digit_table"]

Array = jax.Array
MAX_DIGITS = 9  # the most an int32 holds exactly; a longer number matches no answer
_DIGIT_RUN = re.compile(r"[0-9]+")


def _run(text: str) -> tuple[int, int]:
    """(value, digit count) of a digit string, the value capped where the count exceeds
    MAX_DIGITS (such a number never matches, so its value does not matter)."""
    return (int(text[-MAX_DIGITS:]) if text else 0), len(text)


def token_digit_table(tokenizer: Any) -> dict[str, np.ndarray]:
    """What each token id does to a running number, from its decoded text: [V] int32 arrays
    `lead_value`/`lead_length` (the digits it starts with), `breaks` (it holds a non-digit),
    `inner_value`/`inner_length` (the last digit run with non-digits on both sides; length 0 for
    none) and `tail_value`/`tail_length` (the digits it ends with, after its last non-digit)."""
    names = ("lead_value", "lead_length", "breaks", "inner_value", "inner_length", "tail_value")
    table = {name: np.zeros(tokenizer.vocab_size, np.int32) for name in (*names, "tail_length")}
    for token in range(tokenizer.vocab_size):
        text = tokenizer.decode([token])
        runs = list(_DIGIT_RUN.finditer(text))
        if not runs:
            table["breaks"][token] = bool(text)
            continue
        lead = runs[0].group() if runs[0].start() == 0 else ""
        if lead == text:  # all digits: it only extends the number
            table["lead_value"][token], table["lead_length"][token] = _run(lead)
            continue
        table["breaks"][token] = 1
        table["lead_value"][token], table["lead_length"][token] = _run(lead)
        tail = runs[-1].group() if runs[-1].end() == len(text) else ""
        table["tail_value"][token], table["tail_length"][token] = _run(tail)
        inner = [r.group() for r in runs if r.start() > 0 and r.end() < len(text)]
        if inner:
            table["inner_value"][token], table["inner_length"][token] = _run(inner[-1])
    return table


def final_numbers(tokens: Array, mask: Array, table: dict[str, Array]) -> tuple[Array, Array]:
    """(value, valid) [B] of the last integer in each completion's masked tokens [B, N]: valid
    where there is one of 1 to MAX_DIGITS digits."""
    powers = jnp.asarray([10**k for k in range(MAX_DIGITS + 1)], jnp.int32)
    table = {name: jnp.asarray(array) for name, array in table.items()}

    def step(carry, token_and_mask):
        number, length, last, last_length = carry
        token, real = token_and_mask
        get = lambda name: table[name][token]  # noqa: E731
        lead_length = get("lead_length")
        extended = number * powers[jnp.minimum(lead_length, MAX_DIGITS)] + get("lead_value")
        extended_length = length + lead_length
        breaks = get("breaks").astype(bool)
        # A break ends the number being read (if any), then an inner run is a whole number.
        ended = breaks & (extended_length > 0)
        last, last_length = (
            jnp.where(ended, extended, last),
            jnp.where(ended, extended_length, last_length),
        )
        inner = breaks & (get("inner_length") > 0)
        last = jnp.where(inner, get("inner_value"), last)
        last_length = jnp.where(inner, get("inner_length"), last_length)
        number = jnp.where(breaks, get("tail_value"), extended)
        length = jnp.where(breaks, get("tail_length"), extended_length)
        # Past MAX_DIGITS the value is meaningless; keep the count growing so it never matches.
        number = jnp.where(length > MAX_DIGITS, 0, number)
        new = (number, length, last, last_length)
        return jax.tree.map(lambda n, o: jnp.where(real, n, o), new, carry), None

    zeros = jnp.zeros(tokens.shape[0], jnp.int32)
    carry = (zeros, zeros, zeros, zeros)
    (number, length, last, last_length), _ = jax.lax.scan(step, carry, (tokens.T, mask.T))
    value = jnp.where(length > 0, number, last)  # a number running to the end is the last one
    count = jnp.where(length > 0, length, last_length)
    return value, (count > 0) & (count <= MAX_DIGITS)


def integer_answers(values: Sequence[Any], wheres: Sequence[str], column: str) -> np.ndarray:
    """The answers as int32, each a non-negative integer of at most MAX_DIGITS digits (an int,
    or a string such as "42" or "1,234"); anything else is a ValueError naming the row."""
    answers = np.zeros(len(values), np.int32)
    for i, (value, where) in enumerate(zip(values, wheres, strict=True)):
        text = str(value).strip().replace(",", "") if not isinstance(value, bool) else ""
        if not text.isascii() or not text.isdigit() or len(text.lstrip("0") or "0") > MAX_DIGITS:
            raise ValueError(
                f"{where}: {column} {value!r} is not a non-negative integer of at most "
                f"{MAX_DIGITS} digits, which the in-program final-number reward needs; use "
                "envs.text.math_answers:math_answer_reward (host Python) for such answers"
            )
        answers[i] = int(text)
    return answers


def final_number_reward(
    tokenizer: Any, table: Any, column: str = "answer"
) -> Callable[[PromptBatch, Any], Array]:
    """A reward term's function for a task made from `table` (a `jaxrl.data.prompts.PromptTable`):
    1.0 where a completion's last integer equals the sampled row's `column`, else 0.0. The
    answers become a constant of the program, indexed by each prompt's row."""
    if column not in table.rows[0].columns:
        raise ValueError(f"final_number_reward: the prompts have no {column!r} column")
    wheres = [row.where for row in table.rows]
    answers = jnp.asarray(integer_answers([r.columns[column] for r in table.rows], wheres, column))
    digits = {name: jnp.asarray(array) for name, array in token_digit_table(tokenizer).items()}

    def reward(prompts: PromptBatch, completion: Any) -> Array:
        value, valid = final_numbers(completion.tokens, completion.mask, digits)
        return (valid & (value == answers[prompts.row])).astype(jnp.float32)

    return reward
