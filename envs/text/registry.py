"""The text tasks by name, each with its own options: `TASKS` has one line per task, and
`build_task` makes the task a config's `task` section names.

    make_task("reverse_digits", num_digits=3)             # a registered task, options as keywords
    build_task("reverse_digits", "num_digits=3")          # the same from a config's strings
    build_task("my_tasks.py:VowelCount", "letters=4", load=jaxrl.cli.load_named)

A task's options are its dataclass fields (`envs.text.protocol.task_options`); given as text
they are `name=value` pairs, comma-separated, each value a Python literal or a bare word. Every
problem is a `ConfigError` whose field is the `task` section's (`name`, `options`,
`options.<option>`, or an option given by a field of its own such as `num_digits`).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from envs.text.digit_tasks import (
    Addition,
    CopyDigits,
    CountDigit,
    RepeatDigit,
    ReverseDigits,
    SortDigits,
)
from envs.text.protocol import ProblemTask, missing_methods, task_options
from jaxrl.config import ConfigError

# One line per task: its name (as config.task.name gives it) and its class.
TASKS: dict[str, type] = {
    "reverse_digits": ReverseDigits,
    "sort_digits": SortDigits,
    "copy_digits": CopyDigits,
    "count_digit": CountDigit,
    "addition": Addition,
    "repeat_digit": RepeatDigit,
}
# How an option's type is asked for in an error line.
KINDS = {
    bool: "True or False",
    int: "a whole number",
    float: "a number",
    str: "a string",
    tuple: "a tuple",
}


def task_class(name: str, load: Callable[[str], Any] | None = None) -> type:
    """The task class `name` names: a key of `TASKS`, or (with `load`, e.g.
    `jaxrl.cli.load_named`) "module.path:Class" or "path/to/file.py:Class"."""
    if ":" in name and load is not None:
        try:
            cls = load(name)
        except (ImportError, AttributeError, ValueError) as error:
            raise ConfigError(
                f"name: cannot load {name!r} ({error}); give 'module.path:Class' importable from "
                "the working directory, or 'path/to/file.py:Class'"
            ) from None
        return checked_class(cls, name)
    if name not in TASKS:
        raise ConfigError(
            f"name: unknown task {name!r}; choose one of {sorted(TASKS)}, give a class of your "
            "own as 'path/to/file.py:Class', or train on your own prompts with "
            "task.train_jsonl=<file.jsonl>"
        )
    return TASKS[name]


def checked_class(cls: Any, name: str) -> type:
    """`cls` if it is a text task's class (the parts `envs.text.protocol.ProblemTask` lists);
    ConfigError naming `name` otherwise."""
    if not isinstance(cls, type):
        raise ConfigError(f"name: {name!r} is not a class; name the task's class")
    missing = missing_methods(cls)
    if missing:
        raise ConfigError(
            f"name: {name!r} is not a text task: it lacks {', '.join(missing)}; give it the "
            "parts envs.text.protocol.ProblemTask lists (docs/add-a-text-task.md)"
        )
    return cls


def parse_options(text: str) -> dict[str, Any]:
    """`name=value` pairs, comma-separated ("letters=4,vowels='aeiou'") as {name: value}, each
    value a Python literal or else the bare word as a string. ConfigError naming `options`."""
    options: dict[str, Any] = {}
    for item in _split_top_level(text):
        name, equals, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not equals or not name.isidentifier():
            raise ConfigError(
                f"options: {item.strip()!r} is not name=value; give the task's options as "
                "comma-separated name=value pairs, e.g. num_digits=3"
            )
        if name in options:
            raise ConfigError(f"options: {name} given twice; give each option once")
        try:
            options[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[name] = value  # a bare word
    return options


def _split_top_level(text: str) -> list[str]:
    """`text` cut at the commas outside brackets and quotes; empty pieces dropped."""
    pieces, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    pieces.append(text[start:])
    return [piece for piece in pieces if piece.strip()]


def make_task(name: str | type, **options: Any) -> ProblemTask:
    """The task `name` (a key of `TASKS`, or a task class) with `options`, e.g.
    `make_task("reverse_digits", num_digits=3)`. ConfigError for an unknown task or option, an
    option of the wrong type, or a value the task refuses."""
    cls = task_class(name) if isinstance(name, str) else name
    return _construct(cls, options, lambda option: option)


def build_task(
    name: str,
    options: str = "",
    fields: Mapping[str, Any] | None = None,
    load: Callable[[str], Any] | None = None,
    cls: Any = None,
) -> ProblemTask:
    """The task a config's `task` section names: `name` (see `task_class`), with the options of
    `options` (text, see `parse_options`) and, for an option the task has that `options` leaves
    out, the section's own field of that name in `fields` (the digit tasks' `num_digits`).
    ConfigError naming the field relative to the section. `cls`, when given, is the class `name`
    ("module.path:Class") names, already loaded."""
    cls = task_class(name, load) if cls is None else checked_class(cls, name)
    given = parse_options(options)
    known = task_options(cls)
    from_fields = {
        field: value
        for field, value in (fields or {}).items()
        if field in known and field not in given
    }

    def where(option: str) -> str:
        return option if option in from_fields else f"options.{option}"

    return _construct(cls, {**from_fields, **given}, where)


def _construct(cls: type, options: dict[str, Any], where: Callable[[str], str]) -> ProblemTask:
    """`cls(**options)`, each option checked first against the class's fields: its name, and its
    type against the field's default's. `where(option)` is the field an error names."""
    known = task_options(cls)
    name = getattr(cls, "name", cls.__name__)
    for option, value in options.items():
        if option not in known:
            listed = ", ".join(known) if known else "none"
            raise ConfigError(
                f"options: the {name} task has no option {option!r} (its options: {listed}); "
                "drop it or fix its name"
            )
        checked = _checked_value(value, known[option])
        if checked is None:
            expected = KINDS.get(type(known[option]), type(known[option]).__name__)
            raise ConfigError(
                f"{where(option)}: got {value!r} ({type(value).__name__}) for the {name} task; "
                f"give {expected}, e.g. {option}={known[option]!r}"
            )
        options[option] = checked
    required = [o for o, default in known.items() if default is dataclasses.MISSING]
    absent = [o for o in required if o not in options]
    if absent:
        raise ConfigError(
            f"options: the {name} task needs {', '.join(absent)}; give "
            f"{','.join(f'{o}=...' for o in absent)}"
        )
    try:
        return cls(**options)
    except ConfigError as error:  # the task's own check, "<option>: problem; fix"
        option, _, rest = str(error).partition(": ")
        raise ConfigError(f"{where(option)}: {rest}" if option in options else str(error)) from None
    except TypeError as error:  # a task that is not a dataclass, given options
        raise ConfigError(f"options: the {name} task refused them ({error}); drop them") from None


def _checked_value(value: Any, default: Any) -> Any:
    """`value` as the type of the option's `default` (an int for a float, a list for a tuple), or
    None if it is not one. Options without a plain default take any value."""
    if default is dataclasses.MISSING or default is None:
        return value
    if isinstance(default, bool):
        return value if isinstance(value, bool) else None
    if isinstance(default, int):
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else None
    if isinstance(default, str):
        return value if isinstance(value, str) else None
    if isinstance(default, tuple):
        return tuple(value) if isinstance(value, list | tuple) else None
    return value
