"""Reverse a string of digits: `rev 4821=` -> `1284`.

The answer is checkable exactly, so the task gives supervised data (prompt, answer), synthetic
preference pairs (the right answer against a plausibly wrong one) and a reward with partial
credit, both on host strings and as a pure JAX function over token arrays.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.config import require


@dataclasses.dataclass(frozen=True)
class ReverseDigits:
    num_digits: int = 3

    def __post_init__(self) -> None:
        require(
            1 <= self.num_digits <= 12,
            "num_digits",
            f"got {self.num_digits}",
            "choose between 1 and 12 digits",
        )

    name = "reverse_digits"

    # --- problems and texts ----------------------------------------------------------------

    def sample_problems(
        self, rng: np.random.Generator, count: int, exclude: set[str] | frozenset = frozenset()
    ) -> list[str]:
        """`count` distinct digit strings not in `exclude` (so eval problems stay unseen)."""
        space = 10**self.num_digits - len(exclude)
        require(
            count <= space,
            "count",
            f"{count} distinct problems asked for, only {space} exist",
            "use more digits or fewer problems",
        )
        problems: list[str] = []
        seen = set(exclude)
        while len(problems) < count:
            problem = "".join(rng.choice(list("0123456789"), self.num_digits))
            if problem not in seen:
                seen.add(problem)
                problems.append(problem)
        return problems

    def prompt(self, problem: str) -> str:
        return f"rev {problem}="

    def answer(self, problem: str) -> str:
        return problem[::-1]

    def score(self, problem: str, completion: str) -> float:
        """1 for the exact answer; otherwise the fraction of answer positions right, halved, so
        only exact answers score above 0.5."""
        target = self.answer(problem)
        if completion == target:
            return 1.0
        right = sum(a == b for a, b in zip(completion, target, strict=False))
        return 0.5 * right / len(target)

    def corrupt(self, answer: str, rng: np.random.Generator) -> str:
        """A wrong answer of the kind a half-trained model gives: a changed digit, two swapped
        neighbours, the unreversed input, or a digit dropped or repeated."""
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
        return [{"prompt": self.prompt(p), "completion": self.answer(p)} for p in problems]

    def preference_rows(
        self, problems: list[str], rng: np.random.Generator
    ) -> list[dict[str, str]]:
        return [
            {
                "prompt": self.prompt(p),
                "chosen": self.answer(p),
                "rejected": self.corrupt(self.answer(p), rng),
            }
            for p in problems
        ]

    # --- the reward as a JAX function over tokens -------------------------------------------

    def reward(
        self,
        completion_tokens: jax.Array,
        completion_mask: jax.Array,
        target_tokens: jax.Array,
        eos_id: int,
    ) -> jax.Array:
        """Per-row reward for [B, N] completions against [B, num_digits] target token ids:
        1 when the completion is exactly the target followed by EOS, else half the fraction of
        target positions matched (the same rule as `score`)."""
        n = target_tokens.shape[1]
        produced = jnp.where(completion_mask, completion_tokens, -1)
        matched = (produced[:, :n] == target_tokens).astype(jnp.float32)
        ends_right = (
            produced[:, n] == eos_id if produced.shape[1] > n else jnp.ones(produced.shape[0], bool)
        )
        exact = jnp.all(matched == 1, axis=1) & ends_right
        return jnp.where(exact, 1.0, 0.5 * matched.mean(axis=1))
