"""Digit-string tasks whose answers can be checked exactly: reverse, sort, copy, count, addition.

A problem is a short row of digits. Each task says how the row reads as a prompt (a template of
fixed text and digit slices) and what the answer is. Everything exists twice on purpose, once on
host strings (data files for SFT/DPO, scoring of decoded generations) and once as pure JAX
functions over arrays (GRPO samples prompts and scores completions inside its compiled step);
`tests/test_text_tasks.py` checks that the two agree.

    reverse_digits   rev 4821=          -> 1284
    sort_digits      sort 4821=         -> 1248
    copy_digits      copy 4821=         -> 4821
    count_digit      count 2 in 4821=   -> 1        (how often the first digit occurs in the rest)
    addition         48+21=             -> 69       (num_digits-digit operands, no leading zeros)

Held-out problems: a fixed hash of the digits (`envs.text.splits`) puts about 10% of all problems
in the evaluation split, on the host and in JAX alike, so a sampler running inside a compiled
program can avoid the problems the evaluation uses without a table of them.

Each task is a `envs.text.protocol.ProblemTask` (registered in `envs.text.registry.TASKS`), so
every language-model trainer can train on it; its option is `num_digits`.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from envs.text.characters import ZERO, TaskTokens, character_tokens
from envs.text.splits import is_held_out, sample_split
from envs.text.task import PromptBatch, RewardTerm, TextTask
from jaxrl.config import ConfigError, require

Array = jax.Array


def _number_digits(value: Array, width: int) -> tuple[Array, Array]:
    """Decimal digits of non-negative ints, most significant first, left-aligned in `width`
    columns (zeros after), and how many there are."""
    length = jnp.ones_like(value)
    for power in range(1, width):
        length = length + (value >= 10**power)
    column = jnp.arange(width)
    exponent = jnp.maximum(length[:, None] - 1 - column, 0)
    digits = (value[:, None] // (10**exponent)) % 10
    return jnp.where(column < length[:, None], digits, 0), length


@dataclasses.dataclass(frozen=True)
class DigitTask:
    """What every digit task shares; a task sets `name`, `template`, `num_inputs`,
    `answer_width`, `answer` (host) and `answer_digits` (JAX)."""

    num_digits: int = 3

    name: ClassVar[str] = ""
    max_digits: ClassVar[int] = 12

    def __post_init__(self) -> None:
        require(
            1 <= self.num_digits <= self.max_digits,
            "num_digits",
            f"got {self.num_digits} for {self.name}",
            f"choose between 1 and {self.max_digits}",
        )

    # Subclasses describe the prompt as fixed text and slices of the problem's digits.
    @property
    def template(self) -> tuple[str | slice, ...]:
        """The prompt as fixed strings and slices of the problem's digit string, in order."""
        raise NotImplementedError

    @property
    def num_inputs(self) -> int:
        """Digits in a problem (the length of its digit string)."""
        return self.num_digits

    @property
    def answer_width(self) -> int:
        """The most digits an answer can have."""
        return self.num_digits

    def lowest_digits(self) -> tuple[int, ...]:
        """Smallest allowed digit per input position (1 where a number may not start with 0)."""
        return (0,) * self.num_inputs

    def answer(self, problem: str) -> str:
        """The correct answer to a problem given as its digit string, e.g. "4821" -> "1284"."""
        raise NotImplementedError

    def answer_digits(self, digits: Array) -> tuple[Array, Array]:
        """[n, num_inputs] digits -> ([n, answer_width] answer digits, [n] answer lengths)."""
        raise NotImplementedError

    # --- host side: problems, texts, scores ------------------------------------------------

    def prompt(self, problem: str) -> str:
        """The prompt text of a problem given as its digit string, e.g. "rev 4821="."""
        return "".join(p if isinstance(p, str) else problem[p] for p in self.template)

    def alphabet(self) -> str:
        """Every character a prompt or an answer can contain."""
        fixed = "".join(p for p in self.template if isinstance(p, str))
        return "".join(sorted(set(fixed + "0123456789")))

    def problem_digits(self, problems: list[str]) -> np.ndarray:
        """Digit strings as an int32 array [len(problems), num_inputs]."""
        return np.array([[int(c) for c in p] for p in problems], np.int32).reshape(
            len(problems), self.num_inputs
        )

    def sample_problems(
        self,
        rng: np.random.Generator,
        count: int,
        exclude: set[str] | frozenset = frozenset(),
        split: str | None = None,
        allow_fewer: bool = False,
    ) -> list[str]:
        """`count` distinct problems, none in `exclude`; with `split` ("train" or "eval") only
        problems of that split by the held-out hash. With `allow_fewer`, a small problem space
        gives all it has instead of an error."""
        lows = np.array(self.lowest_digits())
        space = int(np.prod(10 - lows))
        if space <= 200_000:  # small spaces: enumerate, so an impossible request is caught
            grid = np.array(list(itertools.product(*[range(low, 10) for low in lows])), np.int32)
            if split is not None:
                grid = grid[is_held_out(grid, np) == (split == "eval")]
            candidates = ["".join(map(str, row)) for row in grid]
            candidates = [c for c in candidates if c not in exclude]
            if allow_fewer:
                count = min(count, len(candidates))
            require(
                count <= len(candidates),
                "count",
                f"{count} distinct {self.name} problems asked for, only {len(candidates)} exist",
                "use more digits or fewer problems",
            )
            return [candidates[i] for i in rng.permutation(len(candidates))[:count]]
        problems: list[str] = []
        seen = set(exclude)
        while len(problems) < count:
            row = rng.integers(lows, 10)
            if split is not None and bool(is_held_out(row[None], np)[0]) != (split == "eval"):
                continue
            problem = "".join(map(str, row))
            if problem not in seen:
                seen.add(problem)
                problems.append(problem)
        return problems

    def score(self, problem: str, completion: str) -> float:
        """1 for the exact answer. Otherwise partial credit, halved so only exact answers score
        above 0.5 (`answer_score`)."""
        return answer_score(self.answer(problem), completion)

    def corrupt(self, answer: str, rng: np.random.Generator) -> str:
        """A wrong answer of the kind a half-trained model gives: a changed digit, two swapped
        neighbours, the answer backwards, or a digit dropped or repeated."""
        while True:
            kind = rng.integers(5)
            i = int(rng.integers(len(answer)))
            if kind == 0:
                wrong = (
                    answer[:i] + str((int(answer[i]) + rng.integers(1, 10)) % 10) + answer[i + 1 :]
                )
            elif kind == 1 and len(answer) > 1:
                i = min(i, len(answer) - 2)
                wrong = answer[:i] + answer[i + 1] + answer[i] + answer[i + 2 :]
            elif kind == 2:
                wrong = answer[::-1]
            elif kind == 3 and len(answer) > 1:
                wrong = answer[:i] + answer[i + 1 :]
            else:
                wrong = answer[: i + 1] + answer[i:]
            if wrong != answer:
                return wrong

    def sft_rows(self, problems: list[str]) -> list[dict[str, str]]:
        """{"prompt", "completion"} rows of the correct answers, for SFT data files."""
        return [{"prompt": self.prompt(p), "completion": self.answer(p)} for p in problems]

    def preference_rows(
        self, problems: list[str], rng: np.random.Generator
    ) -> list[dict[str, str]]:
        """{"prompt", "chosen", "rejected"} rows, the correct answer against a `corrupt` one."""
        return [
            {
                "prompt": self.prompt(p),
                "chosen": self.answer(p),
                "rejected": self.corrupt(self.answer(p), rng),
            }
            for p in problems
        ]

    def tokens(self, tokenizer) -> TaskTokens:
        """The token id of every character the task writes; each must be a single token."""
        return character_tokens(tokenizer, self.alphabet(), self.name)

    def in_program(self, tokenizer) -> bool:
        """Whether prompts are drawn and scored in JAX with `tokenizer`: each character the task
        writes is one token of it (a real model's BPE may make "123" one token; the trainers
        then score the task's problems on the host)."""
        try:
            self.tokens(tokenizer)
        except ConfigError:
            return False
        return True

    # --- JAX side: sample prompts and score completions inside a compiled program ---------

    def sample_digits(self, key: Array, count: int, split: str = "train") -> Array:
        """[count, num_inputs] digits of problems from one split, drawn uniformly; a row in the
        other split is redrawn until it is not (10% of rows, so a few rounds)."""
        lows = jnp.array(self.lowest_digits())

        def draw(key):
            return jax.random.randint(key, (count, self.num_inputs), lows, 10)

        return sample_split(key, draw, split == "eval")

    def encode_problems(self, digits: Array, tokens: TaskTokens) -> PromptBatch:
        """Prompts and answers of [n, num_inputs] digit rows as token ids (pure JAX)."""
        digits = jnp.asarray(digits, jnp.int32)
        n = digits.shape[0]
        char_ids = jnp.asarray(tokens.char_ids)
        pieces = []
        if tokens.bos_id is not None:
            pieces.append(jnp.full((n, 1), tokens.bos_id, jnp.int32))
        for part in self.template:
            if isinstance(part, str):
                codes = jnp.array([ord(c) for c in part], jnp.int32)
                pieces.append(jnp.broadcast_to(char_ids[codes], (n, len(part))))
            else:
                pieces.append(char_ids[ZERO + digits[:, part]])
        prompt = jnp.concatenate(pieces, axis=1)
        answer, length = self.answer_digits(digits)
        in_answer = jnp.arange(answer.shape[1]) < length[:, None]
        answer_tokens = jnp.where(in_answer, char_ids[ZERO + answer], tokens.pad_id)
        return PromptBatch(prompt, jnp.ones_like(prompt, bool), answer_tokens, length)

    def sample_prompts(
        self, key: Array, count: int, tokens: TaskTokens, split: str = "train"
    ) -> PromptBatch:
        """`count` prompts of `split` drawn uniformly, as token ids (pure JAX)."""
        return self.encode_problems(self.sample_digits(key, count, split), tokens)

    def encode_prompts(self, problems: list[str], tokenizer: Any) -> PromptBatch:
        """The prompts and answers of `problems` (digit strings) as `text_task`'s sampler
        encodes them: the held-out prompts a trainer evaluates on."""
        return self.encode_problems(self.problem_digits(problems), self.tokens(tokenizer))

    def text_task(self, tokenizer: Any, format_weight: float = 0.0) -> TextTask:
        """This task as GRPO trains on it: prompts of the train split drawn in JAX, rewarded by
        `answer_reward` (weight 1) plus `format_weight` x `format_reward` when it is not 0.
        Raises `ConfigError` naming `tokenizer` if a character the task writes is not one token."""
        tokens = self.tokens(tokenizer)
        eos = tokens.eos_id
        terms = [
            RewardTerm(
                "task",
                1.0,
                lambda p, c: answer_reward(c.tokens, c.mask, p.answer_tokens, p.answer_length, eos),
            )
        ]
        if format_weight:
            digits = tokens.digit_ids
            format_fn = lambda p, c: format_reward(c.tokens, c.mask, digits, eos)  # noqa: E731
            terms.append(RewardTerm("format", format_weight, format_fn))
        return TextTask(
            self.name,
            lambda key, count, data: self.sample_prompts(key, count, tokens),
            tuple(terms),
            tokens.eos_id,
            tokens.pad_id,
        )


# --- the tasks ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReverseDigits(DigitTask):
    """The digits in reverse order: `rev 4821=` -> `1284`."""

    name: ClassVar[str] = "reverse_digits"

    @property
    def template(self):
        return ("rev ", slice(0, self.num_digits), "=")

    def answer(self, problem: str) -> str:
        return problem[::-1]

    def answer_digits(self, digits):
        return digits[:, ::-1], jnp.full(digits.shape[0], self.num_digits)


@dataclasses.dataclass(frozen=True)
class SortDigits(DigitTask):
    """The digits in ascending order: `sort 4821=` -> `1248`."""

    name: ClassVar[str] = "sort_digits"

    @property
    def template(self):
        return ("sort ", slice(0, self.num_digits), "=")

    def answer(self, problem: str) -> str:
        return "".join(sorted(problem))

    def answer_digits(self, digits):
        return jnp.sort(digits, axis=1), jnp.full(digits.shape[0], self.num_digits)


@dataclasses.dataclass(frozen=True)
class CopyDigits(DigitTask):
    """The digits unchanged: `copy 4821=` -> `4821`."""

    name: ClassVar[str] = "copy_digits"

    @property
    def template(self):
        return ("copy ", slice(0, self.num_digits), "=")

    def answer(self, problem: str) -> str:
        return problem

    def answer_digits(self, digits):
        return digits, jnp.full(digits.shape[0], self.num_digits)


@dataclasses.dataclass(frozen=True)
class CountDigit(DigitTask):
    """How often a query digit occurs in a row of `num_digits` digits."""

    name: ClassVar[str] = "count_digit"

    @property
    def template(self):
        return ("count ", slice(0, 1), " in ", slice(1, 1 + self.num_digits), "=")

    @property
    def num_inputs(self) -> int:
        return 1 + self.num_digits

    @property
    def answer_width(self) -> int:
        return len(str(self.num_digits))

    def answer(self, problem: str) -> str:
        return str(problem[1:].count(problem[0]))

    def answer_digits(self, digits):
        count = jnp.sum(digits[:, 1:] == digits[:, :1], axis=1)
        return _number_digits(count, self.answer_width)


@dataclasses.dataclass(frozen=True)
class Addition(DigitTask):
    """The sum of two `num_digits`-digit numbers (no leading zeros): `48+21=` -> `69`."""

    num_digits: int = 2
    name: ClassVar[str] = "addition"
    max_digits: ClassVar[int] = 6

    @property
    def template(self):
        k = self.num_digits
        return (slice(0, k), "+", slice(k, 2 * k), "=")

    @property
    def num_inputs(self) -> int:
        return 2 * self.num_digits

    @property
    def answer_width(self) -> int:
        return self.num_digits + 1

    def lowest_digits(self):
        k = self.num_digits
        return tuple(1 if i % k == 0 else 0 for i in range(2 * k))

    def answer(self, problem: str) -> str:
        k = self.num_digits
        return str(int(problem[:k]) + int(problem[k:]))

    def answer_digits(self, digits):
        k = self.num_digits
        place = 10 ** jnp.arange(k - 1, -1, -1)
        total = digits[:, :k] @ place + digits[:, k:] @ place
        return _number_digits(total, self.answer_width)


@dataclasses.dataclass(frozen=True)
class RepeatDigit(DigitTask):
    """Long-tailed answer lengths (the partial-rollout task of issue 39): `rep 7x8=` -> the
    digit 7 written `length(8)` times, where code c in 0..9 asks for round(2 ** (num_digits *
    c / 9)) digits: from 1 to 2 ** num_digits, most answers short and a few long (num_digits=5:
    1, 1, 2, 3, 5, 7, 10, 15, 22, 32 digits; mean 9.8)."""

    num_digits: int = 5
    name: ClassVar[str] = "repeat_digit"
    max_digits: ClassVar[int] = 8

    @property
    def template(self):
        return ("rep ", slice(0, 1), "x", slice(1, 2), "=")

    @property
    def num_inputs(self) -> int:
        return 2

    @property
    def answer_width(self) -> int:
        return 2**self.num_digits

    def lengths(self) -> tuple[int, ...]:
        """The answer length each code 0..9 asks for."""
        return tuple(round(2 ** (self.num_digits * code / 9)) for code in range(10))

    def answer(self, problem: str) -> str:
        return problem[0] * self.lengths()[int(problem[1])]

    def answer_digits(self, digits):
        length = jnp.asarray(self.lengths(), jnp.int32)[digits[:, 1]]
        columns = jnp.arange(self.answer_width)
        return jnp.where(columns < length[:, None], digits[:, :1], 0), length


# --- rewards over token arrays -------------------------------------------------------------


def answer_reward(
    completion_tokens: Array,
    completion_mask: Array,
    answer_tokens: Array,
    answer_length: Array,
    eos_id: int,
) -> Array:
    """Per-row reward: 1 when the completion is exactly the answer followed by EOS, otherwise
    half the fraction of the answer positions plus the EOS position after them that it gets
    right (the host `score` rule). Counting the EOS gives partial credit for stopping at the
    right length, which a policy learning from scratch would otherwise have to find by chance.
    completion_*: [B, N]; answer_tokens: [B, A] (pad after answer_length)."""
    width = answer_tokens.shape[1]
    produced = jnp.where(completion_mask, completion_tokens, -1)
    # Room for the answer and the EOS after it, even if the completion is shorter.
    missing = max(0, width + 1 - produced.shape[1])
    produced = jnp.pad(produced, ((0, 0), (0, missing)), constant_values=-1)
    in_answer = jnp.arange(width) < answer_length[:, None]
    right = jnp.sum((produced[:, :width] == answer_tokens) & in_answer, axis=1)
    after = jnp.take_along_axis(produced, answer_length[:, None], axis=1)[:, 0]
    exact = (right == answer_length) & (after == eos_id)
    partial = (right + (after == eos_id)) / (answer_length + 1)
    return jnp.where(exact, 1.0, 0.5 * partial)


def answer_score(answer: str, completion: str) -> float:
    """`answer_reward` on host strings: 1 for the exact answer; otherwise half of (the answer
    positions it gets right, plus one if it stops where the answer does) over the answer's
    length + 1. (`completion` is decoded text, so stopping means ending there; `answer_reward`
    checks the EOS token itself.)"""
    if completion == answer:
        return 1.0
    right = sum(a == b for a, b in zip(completion, answer, strict=False))
    stops_right = len(completion) == len(answer)
    return 0.5 * (right + stops_right) / (len(answer) + 1)


def format_reward(
    completion_tokens: Array, completion_mask: Array, digit_ids: Array, eos_id: int
) -> Array:
    """How much the completion looks like an answer, right or wrong, in [0, 1]: half for the
    fraction of tokens before the end that are digits, half for ending with EOS after at least
    one token. Partial credit lets a policy starting from random tokens find the shape first."""
    length = completion_mask.sum(axis=1)
    body = completion_mask & (jnp.arange(completion_tokens.shape[1]) < (length - 1)[:, None])
    is_digit = jnp.isin(completion_tokens, jnp.asarray(digit_ids))
    digit_fraction = jnp.sum(body & is_digit, axis=1) / jnp.maximum(body.sum(axis=1), 1)
    last = jnp.take_along_axis(completion_tokens, jnp.maximum(length - 1, 0)[:, None], axis=1)
    stops = (length >= 2) & (last[:, 0] == eos_id)
    return 0.5 * digit_fraction + 0.5 * stops
