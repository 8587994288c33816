"""Text tasks with verifiable answers, for language-model policies (SFT, DPO, GRPO)."""

from envs.text.digit_tasks import (
    TASKS,
    Addition,
    CopyDigits,
    CountDigit,
    DigitTask,
    ReverseDigits,
    SortDigits,
    TaskTokens,
    answer_reward,
    format_reward,
    is_held_out,
)
from envs.text.task import PromptBatch, RewardTerm, TextTask

__all__ = [
    "TASKS",
    "Addition",
    "CopyDigits",
    "CountDigit",
    "DigitTask",
    "PromptBatch",
    "RewardTerm",
    "ReverseDigits",
    "SortDigits",
    "TaskTokens",
    "TextTask",
    "answer_reward",
    "format_reward",
    "is_held_out",
    "make_task",
]


def make_task(name: str, **kwargs) -> DigitTask:
    """A text task by name, e.g. `make_task("reverse_digits", num_digits=3)`."""
    if name not in TASKS:
        from jaxrl.config import ConfigError

        raise ConfigError(
            f"task: unknown task {name!r}; choose one of {sorted(TASKS)}, or train on your own "
            "prompts with task.train_jsonl=<file.jsonl>"
        )
    return TASKS[name](**kwargs)
