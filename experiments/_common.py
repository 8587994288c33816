"""What every experiment script shares: config conversion, run-directory checks, error reporting."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import ml_collections
import numpy as np

from jaxrl.config import ConfigError, divisors

# Scripts run as `python experiments/x.py` from a clone: make the repo's packages importable.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(message: str) -> None:
    """Exit with one clear line (no traceback): bad settings are the user's to fix, not bugs."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


# Config keys that are not algorithm fields: how the run is driven, the model, the task, etc.
SECTIONS = (
    "run",
    "model",
    "task",
    "init_from",
    "seed",
    "eval_batch_size",
    "rewards",
    "dataset",
    "reference",
    "bc",
)


def build_config(config_cls: type, flat: ml_collections.ConfigDict) -> Any:
    """Instantiate a frozen algorithm Config from the top-level fields of an ml_collections config,
    turning validation errors into one `error: config.<field>: ...` line."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    values = {k: v for k, v in flat.items() if k in fields}
    unknown = sorted(k for k in flat if k not in fields and k not in SECTIONS)
    if unknown:
        fail(f"config.{unknown[0]}: not a setting of {config_cls.__module__}.Config; "
             f"valid settings are {sorted(fields)}")  # fmt: skip
    try:
        return config_cls(**values)
    except ConfigError as error:
        fail(f"config.{error}")
    except TypeError as error:
        fail(f"config: {error}")


def block_length(total: int, log_every: int) -> int:
    """Steps between metric rows: the largest divisor of `total` not above `log_every`, so that
    chunks can be whole numbers of blocks."""
    return max(d for d in divisors(total) if d <= log_every)


def chunk_lengths(total: int, num_chunks: int, block: int = 1) -> list[int]:
    """`total` steps (a multiple of `block`) in near-equal chunks of whole blocks, at most
    `num_chunks` of them: at most two distinct lengths, so at most two programs to compile."""
    num_blocks = total // block
    bounds = np.linspace(0, num_blocks, min(num_chunks, num_blocks) + 1).round().astype(int)
    return [int(b - a) * block for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def check_run_settings(run: Any, names: tuple[str, ...]) -> None:
    """The driver's counts (chunks, checkpoint interval, logging interval, ...) must be >= 1."""
    for name in names:
        if run[name] < 1:
            fail(f"config.run.{name} must be >= 1, got {run[name]}")


def check_resumable(saved: dict[str, Any] | None, current: dict[str, Any], workdir: str) -> None:
    """A workdir may only be resumed with the settings it was started with."""
    if saved is None:
        return
    changed = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    if changed:
        k = changed[0]
        fail(
            f"--workdir={workdir} holds a run with config.{k}={saved.get(k)!r}, not "
            f"{current.get(k)!r}; resume with the same settings or pass a new --workdir"
        )
