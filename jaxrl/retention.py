"""What a run directory keeps once its run has finished, and how a finished run is recognised.

During a run the runner keeps the newest `config.run.keep_checkpoints` checkpoints (orbax removes
an older one only once the newer one is complete, so a kill at any moment leaves one to resume
from). When the run has finished and written its summary, `finish` removes its checkpoints where
the run does not keep its final training state (`config.run.keep_final_state` False: a language
model's final parameters stay in params/, but the optimizer's moments, twice the model, go) and
says how large the directory is. A run called again with the settings it finished with is
recognised by `finished_summary` from its files alone, before anything is loaded or compiled.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

from jaxrl.distributed import is_main_process
from jaxrl.logging import RunDirectory, to_jsonable

SUMMARY = "summary.json"
# Where `finish` moves checkpoints/ before deleting it: a rename is atomic, so a run killed while
# deleting never leaves a half-deleted checkpoint where a resume would look for one.
REMOVED = ".checkpoints-removed"


def read_json(path: str) -> Any:
    """The JSON value at `path`, or None where there is none or it does not parse."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def has_summary(run_dir: RunDirectory) -> bool:
    """Whether the run directory's run finished once (it wrote summary.json, its last record)."""
    return os.path.isfile(run_dir.file(SUMMARY))


# The settings that only say what a run directory keeps: a run is resumed (or recognised as
# finished) whatever they are.
KEEPING = ("keep_checkpoints", "keep_final_state")


def compared(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` (as config.json records it) without the settings in KEEPING."""
    config = dict(config)
    if isinstance(config.get("run"), Mapping):
        config["run"] = {k: v for k, v in config["run"].items() if k not in KEEPING}
    return config


def finished_summary(
    workdir: str, resolved_config: Mapping[str, Any], num_steps: int
) -> dict[str, Any] | None:
    """The summary of the run in `workdir` when it finished with exactly these settings (its
    config.json equals `resolved_config`, as the run would record it) at `num_steps` updates;
    None otherwise (a new directory, other settings, a run being extended or not yet finished).
    Reads two files and nothing else."""
    if not os.path.isdir(workdir):
        return None
    summary = read_json(os.path.join(workdir, SUMMARY))
    if not isinstance(summary, dict) or summary.get("steps") != num_steps:
        return None
    saved = read_json(os.path.join(workdir, "config.json"))
    if not isinstance(saved, dict) or compared(saved) != compared(to_jsonable(resolved_config)):
        return None
    return summary


def directory_bytes(path: str) -> int:
    """The bytes of the files under `path` (their sizes, links not followed)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed while walking
                continue
    return total


def format_bytes(count: int) -> str:
    """`count` bytes as "1.1 GB", "350.2 MB" or "12.0 kB" (powers of 1000)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def size_note(path: str) -> str:
    """The end of a run's last line: "Run directory: PATH (1.1 GB)"."""
    return f"Run directory: {path} ({format_bytes(directory_bytes(path))})"


def remove_checkpoints(run_dir: RunDirectory) -> None:
    """Remove the run's checkpoints/ (renamed out of the way first; see REMOVED), and what an
    earlier removal that was interrupted left."""
    removed = run_dir.file(REMOVED)
    if os.path.isdir(run_dir.checkpoint_dir):
        if os.path.exists(removed):
            shutil.rmtree(removed)
        os.replace(run_dir.checkpoint_dir, removed)
    if os.path.exists(removed):
        shutil.rmtree(removed)


def finish(run_dir: RunDirectory, keep_final_state: bool = True) -> str:
    """The end of a finished run, once its summary is written: without `keep_final_state`, its
    checkpoints removed (a larger num_steps then trains the longer run from the start). Returns
    the line's end that says where the run directory is and its size (`size_note`)."""
    if not keep_final_state and is_main_process():
        remove_checkpoints(run_dir)
    return size_note(run_dir.path)


def report_finished(run_dir: RunDirectory, steps: int, keep_final_state: bool = True) -> None:
    """The one line of a finished run called again (after `finish`, which removes a final state
    that a run killed before removing it left)."""
    where = finish(run_dir, keep_final_state)
    print(
        f"Already finished: this run took its {steps} steps with these settings, so nothing runs "
        f"(its results are in summary.json). {where}",
        flush=True,
    )
