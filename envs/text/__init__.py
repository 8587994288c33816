"""Text tasks with verifiable answers, for language-model policies (SFT, DPO, GRPO): the protocol
a task declares (`envs.text.protocol`), the registry of tasks by name (`envs.text.registry`), the
digit tasks, and what an RL algorithm trains on (`envs.text.task`)."""

from envs.text.characters import TaskTokens, character_tokens
from envs.text.digit_tasks import (
    Addition,
    CopyDigits,
    CountDigit,
    DigitTask,
    RepeatDigit,
    ReverseDigits,
    SortDigits,
    answer_reward,
    answer_score,
    format_reward,
)
from envs.text.protocol import ProblemTask, task_options
from envs.text.registry import TASKS, build_task, make_task, parse_options
from envs.text.splits import is_held_out, sample_split
from envs.text.task import PromptBatch, RewardTerm, TextTask

__all__ = [
    "TASKS",
    "Addition",
    "CopyDigits",
    "CountDigit",
    "DigitTask",
    "ProblemTask",
    "PromptBatch",
    "RepeatDigit",
    "RewardTerm",
    "ReverseDigits",
    "SortDigits",
    "TaskTokens",
    "TextTask",
    "answer_reward",
    "answer_score",
    "build_task",
    "character_tokens",
    "format_reward",
    "is_held_out",
    "make_task",
    "parse_options",
    "sample_split",
    "task_options",
]
