"""Validation helpers shared by every algorithm's frozen `Config`.

A bad setting must fail before anything compiles, with one line that names the field and the fix.
"""

from __future__ import annotations

import math
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and how to fix it."""


class InputError(ConfigError):
    """A bad input (a setting, a file, a model or data given from Python) or a run that cannot
    go on, in one line `<field or file:line>: <problem>; <fix>`: what `jaxrl.runner.fail` raises.
    From Python it is the exception a trainer raises; a script (`jaxrl.runner.main`) prints it
    as `error: <line>` and exits with status 2, without a traceback. `abrupt`: the script exits
    without the interpreter's shutdown (threads of a failed checkpoint read would print)."""

    def __init__(self, message: str, abrupt: bool = False) -> None:
        super().__init__(message)
        self.abrupt = abrupt


def require(condition: bool, field: str, problem: str, fix: str) -> None:
    """Raise `ConfigError("field: problem; fix")` unless `condition` holds."""
    if not condition:
        raise ConfigError(f"{field}: {problem}; {fix}")


def is_finite_number(value: Any) -> bool:
    """True for an int or a finite float (not NaN, not +-inf); False for anything else."""
    try:
        return math.isfinite(value)
    except TypeError:
        return False


def require_positive(config: Any, *fields: str) -> None:
    """Require each named attribute of `config` to be a finite number > 0."""
    for field in fields:
        value = getattr(config, field)
        require_finite(config, field)
        require(value > 0, field, f"must be positive, got {value}", f"set {field} > 0")


def require_finite(config: Any, *fields: str) -> None:
    """Require each named attribute of `config` to be a number that is neither NaN nor +-inf."""
    for field in fields:
        value = getattr(config, field)
        require(is_finite_number(value), field, f"must be a finite number, got {value}", "give one")


def require_non_negative(config: Any, *fields: str) -> None:
    """Require each named attribute of `config` to be a finite number >= 0."""
    for field in fields:
        value = getattr(config, field)
        require_finite(config, field)
        require(value >= 0, field, f"must be >= 0, got {value}", f"set {field} >= 0")


def require_count(config: Any, field: str, fix: str) -> None:
    """Require the attribute `field` of `config` to be a whole number >= 0 (not a bool)."""
    value = getattr(config, field)
    require(
        isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        field,
        f"got {value!r}",
        fix,
    )


def require_in_range(config: Any, field: str, low: float, high: float) -> None:
    """Require the attribute `field` of `config` to lie in the closed interval [low, high]."""
    value = getattr(config, field)
    require(
        low <= value <= high,
        field,
        f"must lie in [{low}, {high}], got {value}",
        f"choose {field} between {low} and {high}",
    )


MAX_STEPS = 2**31 - 1  # step and sample counters are int32 inside the program


def require_step_count(config: Any, field: str) -> None:
    """Require a count of steps/samples that int32 counters inside the program can hold."""
    value = getattr(config, field)
    require(
        value <= MAX_STEPS,
        field,
        f"({value}) exceeds {MAX_STEPS:,}, the largest count the program's int32 counters hold",
        f"set {field} <= {MAX_STEPS}",
    )


def divisors(n: int) -> list[int]:
    """The positive divisors of `n` in increasing order (for "choose one of ..." hints)."""
    return [d for d in range(1, n + 1) if n % d == 0]
