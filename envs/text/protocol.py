"""What a text task declares so that every language-model trainer (SFT, DPO, the reward model,
GRPO, PPO, online DPO) trains on it: the front door of a new task. `docs/add-a-text-task.md` walks
through writing one; `tests/fixtures/vowel_task.py` is a whole one.

A task is a frozen dataclass whose fields are its options (validated in `__post_init__` with
`jaxrl.config.require`), with a `name` and three methods:

    name: ClassVar[str]                                   # "vowel_count": runs, summaries, errors
    sample_problems(rng, count, exclude=frozenset(), split=None, allow_fewer=False) -> [problem]
    prompt(problem) -> str                                # the text the model completes
    score(problem, completion) -> float                   # 1.0 exactly right, less otherwise

A problem is a string the task reads back (the digits "4821", a word "banana"). `split` ("train"
or "eval") keeps to a fixed rule of the task's (`envs.text.splits`): the held-out problems a
trainer evaluates on are drawn with split="eval", and nothing the task samples for training is
ever one of them.

The rest is optional; a trainer that needs what a task lacks says so in one error line:

    in_program(tokenizer) -> bool      # whether the two below work with this tokenizer (True)
    text_task(tokenizer, format_weight=0.0) -> TextTask
        # GRPO, PPO and online DPO: train-split prompts drawn and completions scored in JAX
        # (`envs.text.task`); its first reward term is the task's score on token arrays. A
        # task without a format reward raises ConfigError("format_weight: ...") for weight > 0.
    encode_prompts(problems, tokenizer) -> PromptBatch    # held-out prompts, as text_task's
    answer(problem) -> str                                # the right completion
    sft_rows(problems) -> [{"prompt", "completion"}]      # SFT (default: prompt and answer)
    preference_rows(problems, rng) -> [{"prompt", "chosen", "rejected"}]    # DPO, reward model

Without `text_task` (or when `in_program` says no, as the digit tasks do for a tokenizer that
writes several digits as one token), the RL trainers draw the task's problems into a prompt
table and score completions with `score` on the host instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol

import numpy as np

from jaxrl.config import ConfigError

REQUIRED = ("sample_problems", "prompt", "score")  # methods every task has
SPLITS = ("train", "eval")


class ProblemTask(Protocol):
    """A text task: problems drawn by split, each a prompt with a score (the module docstring
    lists the optional methods)."""

    name: ClassVar[str]

    def sample_problems(
        self,
        rng: np.random.Generator,
        count: int,
        exclude: set[str] | frozenset = frozenset(),
        split: str | None = None,
        allow_fewer: bool = False,
    ) -> list[str]:
        """`count` distinct problems drawn with `rng`, none in `exclude`, all of `split` ("train"
        or "eval"; None: either). With `allow_fewer`, a small problem space gives all it has
        instead of raising `ConfigError("count: ...")`."""
        ...

    def prompt(self, problem: str) -> str:
        """The prompt text of `problem`."""
        ...

    def score(self, problem: str, completion: str) -> float:
        """The decoded `completion`'s score in [0, 1]: 1.0 counts as a right answer."""
        ...


def missing_methods(task: Any) -> list[str]:
    """The required parts (`name` and `REQUIRED`) a task class or object lacks."""
    missing = [] if isinstance(getattr(task, "name", None), str) and task.name else ["name"]
    return missing + [m for m in REQUIRED if not callable(getattr(task, m, None))]


def task_options(task: Any) -> dict[str, Any]:
    """A task's options: {field: value} of its dataclass fields (a class: their defaults, with
    dataclasses.MISSING for a required one); {} for a task that is not a dataclass."""
    if not dataclasses.is_dataclass(task):
        return {}
    fields = [f for f in dataclasses.fields(task) if f.init]
    if isinstance(task, type):
        return {f.name: _default(f) for f in fields}
    return {f.name: getattr(task, f.name) for f in fields}


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def runs_in_program(task: ProblemTask, tokenizer: Any) -> bool:
    """Whether an RL trainer draws `task`'s prompts and scores its completions in JAX (it has
    `text_task` and `encode_prompts`, and `in_program(tokenizer)` does not say no) rather than
    from a table of its problems scored on the host."""
    if not all(callable(getattr(task, m, None)) for m in ("text_task", "encode_prompts")):
        return False
    check = getattr(task, "in_program", None)
    return bool(check(tokenizer)) if callable(check) else True


def answer_of(task: ProblemTask, problem: str) -> str | None:
    """The task's right completion of `problem`, or None for a task without `answer`."""
    answer = getattr(task, "answer", None)
    return answer(problem) if callable(answer) else None


def sft_rows(task: ProblemTask, problems: list[str]) -> list[dict[str, str]]:
    """{"prompt", "completion"} rows of `problems` for supervised fine-tuning: the task's
    `sft_rows`, or each prompt with its `answer`. ConfigError naming `name` without either."""
    rows = getattr(task, "sft_rows", None)
    if callable(rows):
        return list(rows(problems))
    if not callable(getattr(task, "answer", None)):
        raise ConfigError(
            f"name: the {task.name} task gives no SFT rows (it has neither sft_rows nor answer); "
            "add answer(problem) to it, or give your own rows with task.train_jsonl"
        )
    return [{"prompt": task.prompt(p), "completion": task.answer(p)} for p in problems]


def preference_rows(
    task: ProblemTask, problems: list[str], rng: np.random.Generator
) -> list[dict[str, str]]:
    """{"prompt", "chosen", "rejected"} rows of `problems` (DPO, reward models): the task's
    `preference_rows`. ConfigError naming `name` for a task without it."""
    rows = getattr(task, "preference_rows", None)
    if not callable(rows):
        raise ConfigError(
            f"name: the {task.name} task gives no preference pairs (it has no preference_rows); "
            "add preference_rows(problems, rng) to it, or give your own pairs with "
            "task.train_jsonl"
        )
    return list(rows(problems, rng))
