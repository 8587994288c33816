"""Text tasks with verifiable answers, for language-model policies (SFT, DPO, GRPO)."""

from envs.text.reverse_digits import ReverseDigits

TASKS = {"reverse_digits": ReverseDigits}


def make_task(name: str, **kwargs):
    """A text task by name, e.g. `make_task("reverse_digits", num_digits=3)`."""
    if name not in TASKS:
        from jaxrl.config import ConfigError

        raise ConfigError(f"task: unknown task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name](**kwargs)
