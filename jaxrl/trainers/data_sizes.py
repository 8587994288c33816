"""Held-out sizes and batch sizes fitted to the data a run is given.

A preset's sizes suit its own data: GRPO's word_problems preset holds out 200 of its 2,000
prompts, SFT trains on batches of 64 rows. A user's first file is smaller (36 prompts, one
preference pair), and those sizes would leave nothing to train on. Where the user left such a
setting at the preset's value (`jaxrl.config.given_settings`) and the data cannot hold it, the
run takes one the data can hold and says so in one line on stderr:

- config.task.num_eval: 10% of the rows (at least 1), or, for a single row, none held out and
  the held-out metrics computed on the training row;
- config.batch_size: the training rows (rounded down to what the algorithm's Config accepts:
  a multiple of grad_accum_steps and the mesh's batch shards).

A value the user set is kept, and refused as before when it does not fit; data that the
preset's values fit is split and batched exactly as before. The fitted value is written to the
run's config.json, so the same call resumes the run.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any

from jaxrl.config import ConfigError, is_given
from jaxrl.data.chat import hold_out

# The share of a small file held out when the preset's num_eval does not fit it.
HELD_OUT_FRACTION = 0.1


def say(line: str) -> None:
    """One line on stderr about a size the run chose for the user."""
    print(line, file=sys.stderr, flush=True)


def held_out_count(run: Any, num_rows: int, noun: str = "rows") -> int | None:
    """How many of `num_rows` rows to hold out: config.task.num_eval where the user set it or
    the rows hold it (0 < num_eval < num_rows); else HELD_OUT_FRACTION of them (at least 1),
    or None for a single row (nothing held out), said in one line and recorded in the config.
    `run` is a `lm_runs.Setup`; `noun` names the rows in the line ("pairs")."""
    section = run.flat.task
    requested = section.num_eval
    if is_given(run.parts.given, "task.num_eval") or not 0 < num_rows <= requested:
        return requested
    fitted = math.ceil(num_rows * HELD_OUT_FRACTION) if num_rows > 1 else 0
    problem = (
        f"config.task.num_eval: {requested} held-out {noun} out of {num_rows} would leave none "
        "to train on"
    )
    if fitted:
        say(f"{problem}; using {fitted} ({HELD_OUT_FRACTION:.0%}, set it to choose)")
    else:
        say(
            f"{problem}; holding none out and evaluating on the training "
            f"{noun.removesuffix('s')} (give eval_data, or more {noun}, for a held-out score)"
        )
    section.num_eval = fitted
    return fitted or None


def held_out_split(run: Any, rows: Sequence[Any], noun: str = "rows") -> tuple[list, list]:
    """(train, held_out) of `rows`: `held_out_count` of them drawn by config.task.data_seed
    (`jaxrl.data.chat.hold_out`, whose ConfigError names num_eval when a count the user set
    does not fit); a single row is both."""
    count = held_out_count(run, len(rows), noun)
    if count is None:
        return list(rows), list(rows)
    return hold_out(rows, count, run.flat.task.data_seed)


def fitted_batch_size(run: Any, num_train: int, noun: str = "rows") -> Any:
    """`run` (a `lm_runs.Setup`) with config.batch_size fitted to `num_train` training rows
    where the preset's is larger and the user did not set it: the largest size up to
    `num_train` that the algorithm's Config accepts, said in one line and recorded in the
    config. Otherwise `run` unchanged (the caller refuses a batch larger than the rows)."""
    config = run.config
    if config.batch_size <= num_train or is_given(run.parts.given, "batch_size"):
        return run
    for size in range(num_train, 0, -1):
        try:
            fitted = dataclasses.replace(config, batch_size=size)
        except ConfigError:  # not a multiple of grad_accum_steps and the mesh's shards
            continue
        rows = noun if num_train > 1 else noun.removesuffix("s")
        say(
            f"config.batch_size: {config.batch_size} exceeds the {num_train} training {rows}; "
            f"using {size} (set it to choose)"
        )
        run.flat.batch_size = size
        return run._replace(config=fitted)
    return run
