"""Calling user Python on the host from inside a compiled program, and carrying its failures.

"Host" means one thing throughout jaxrl, as in JAX: the Python process (and its CPU memory) that
drives the compiled program, outside that program. A host function (a reward through
`io_callback`), a host environment (`envs.external`'s Gymnasium and EnvPool ones,
`envs.text.host_env`'s text games), host arrays (NumPy) and the host loop that runs compiled
chunks all live there; a multi-host run has one such process per machine.

An exception raised there reaches the caller of the compiled program wrapped in a runtime error
whose text is dozens of lines of callback plumbing. So the code that calls user functions on the
host goes through `call`, which records the user's exception and its traceback before letting it
propagate; the runner then asks `take_failure()` and reports the failure in one line, with the
traceback written to the run directory."""

import dataclasses
import threading
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class HostFailure:
    """A user function that failed on the host: its name, the exception and its traceback."""

    function: str
    error: BaseException
    traceback: str

    def summary(self) -> str:
        """`<function>: <problem>` in one line (an exception's first line)."""
        text = str(self.error).strip().splitlines()
        if isinstance(self.error, HostFunctionError):
            return f"{self.function}: {text[0]}"
        detail = f": {text[0]}" if text else ""
        return f"{self.function}: raised {type(self.error).__name__}{detail}"


class HostFunctionError(ValueError):
    """What a host function returned is unusable (wrong shape, NaN); raised through `call`."""


_lock = threading.Lock()
_failures: list[HostFailure] = []


def call(function_name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, recording any exception (for `take_failure`) before re-raising it."""
    try:
        return fn(*args, **kwargs)
    except Exception as error:
        with _lock:  # callbacks of several batch shards may fail at once
            _failures.append(HostFailure(function_name, error, traceback.format_exc()))
        raise


def fail(function_name: str, problem: str) -> None:
    """Record and raise a `HostFunctionError`: a host function's result cannot be used."""
    call(function_name, _raise, HostFunctionError(problem))


def _raise(error: BaseException) -> None:
    raise error


def check_rewards(function_name: str, values: Any, count: int) -> np.ndarray:
    """`values` as float32 [count], or a recorded failure naming what is wrong with them: a reward
    must be one finite float per completion (a NaN would silently poison every parameter)."""
    texts = (str, bytes)
    if isinstance(values, texts) or (
        isinstance(values, (list, tuple)) and any(isinstance(v, texts) for v in values)
    ):
        # np.asarray would read "1.0" as a number and fail on "yes" only now and then.
        fail(function_name, "returned strings; return a list of floats, one per completion")
    try:
        rewards = np.asarray(values, np.float32)
    except (TypeError, ValueError) as error:
        fail(function_name, f"returned {type(values).__name__} ({error}); return a list of floats")
    if rewards.shape != (count,):
        fail(
            function_name,
            f"returned shape {rewards.shape}; return one float per completion ({count})",
        )
    bad = np.flatnonzero(~np.isfinite(rewards))
    if bad.size:
        fail(
            function_name,
            f"returned {rewards[bad[0]]} for completion {bad[0]} of {count} ({bad.size} "
            "non-finite in all); return finite floats",
        )
    return rewards


def take_failure() -> HostFailure | None:
    """The first host failure recorded since the last call (and forget them all)."""
    with _lock:
        first = _failures[0] if _failures else None
        _failures.clear()
    return first
